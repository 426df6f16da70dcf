//! The gateway's side of `ferry status`: `status.json` in the data
//! directory, rewritten whole (written to a temporary file, then renamed
//! over) on every change of the north link or of a device's presence, so a
//! reader sees the old file or the new one, never half of one. It is kept
//! by a thread of its own, fed over a channel: the pipelines never wait on
//! the disk for it. It is not durable state (no fsync). It is read as the
//! running gateway's only while its pid is that of the process holding the
//! store's lock, which the reader finds (a lock, not a process name: a
//! gateway binary under any name is seen, a dead one's file is not).
//! Beside it, [`pid_file`] keeps `ferry.pid`.

pub mod pid_file;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tracing::warn;

use crate::ids::DeviceId;

/// The status file inside `gateway.data_dir`.
pub const STATUS_FILE: &str = "status.json";

/// One link's state and since when.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Link {
    pub up: bool,
    pub since_ms: i64,
}

/// The north link: its state and since when, the node it is on (or last
/// tried) and the last failure, in words an operator can act on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NorthLink {
    pub up: bool,
    pub since_ms: i64,
    /// `host:port` of the node connected to, or of the last attempt
    /// (`None` before the first, and in a file an older ferry wrote).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Why the last connection failed or broke (bounded, see
    /// `north/failure.rs`); kept once the link is up again.
    #[serde(default)]
    pub last_error: Option<String>,
    /// When it did.
    #[serde(default)]
    pub last_error_ms: Option<i64>,
}

/// A device online, as the status thread knows it.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Seen {
    /// Since when it is online.
    pub since_ms: i64,
    /// When the gateway last heard of it: a connect, an inbox
    /// subscription, a status message, an uplink.
    pub last_seen_ms: i64,
}

/// The devices online, by id: one entry per device the status file counts
/// (so at most one per connection in embedded mode). Written by the status
/// thread only; others read it through a [`watch::Receiver`].
pub type Online = BTreeMap<DeviceId, Seen>;

/// What the running gateway last wrote.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LiveStatus {
    /// `gateway.id` (empty in a file an older ferry wrote).
    #[serde(default)]
    pub gateway: String,
    pub pid: u32,
    pub started_ms: i64,
    /// `embedded` or `external`.
    pub south_mode: String,
    /// The running gateway's version (`None` in a file an older ferry
    /// wrote).
    #[serde(default)]
    pub version: Option<String>,
    pub north: NorthLink,
    /// Embedded: the listener, up since start. External: ferry's session
    /// to the site broker (up once subscribed).
    pub south: Link,
    /// Devices online: connected to the embedded broker, or (external
    /// mode) whose last status message said online (retained on the site
    /// broker, so it is known again after a restart). `None` in a file an
    /// older ferry wrote in external mode.
    pub devices_online: Option<usize>,
    /// Whether the backend acks what is sent north (`None` in a file an
    /// older ferry wrote).
    #[serde(default)]
    pub backend: Option<Backend>,
    pub updated_ms: i64,
}

/// The backend as the uplink engine sees it (docs/PROTOCOL.md, "An absent
/// backend").
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Backend {
    /// False while uplinks wait on a backend that acks nothing.
    pub present: bool,
    /// Since when it is (or is not) present; the start for a backend not
    /// yet found silent.
    pub since_ms: i64,
    /// When it last sent an ack (to within 5 s).
    pub last_ack_ms: Option<i64>,
}

/// What changed.
#[derive(Debug)]
pub enum LiveEvent {
    /// Up on this node (`host:port`).
    NorthUp(String),
    NorthDown,
    /// A connection to this node failed, for this reason (bounded).
    NorthFailed {
        endpoint: String,
        error: String,
    },
    SouthUp,
    SouthDown,
    DeviceOnline(DeviceId),
    DeviceOffline(DeviceId),
    /// The device sent something (its last seen time, if it is online).
    DeviceSeen(DeviceId),
    /// The backend sent an ack at this time (ms).
    BackendHeard(i64),
    BackendSilent,
    BackendPresent,
}

/// Where the pipelines report changes; cheap to clone.
pub type LiveSender = mpsc::UnboundedSender<LiveEvent>;

/// Starts the thread keeping `data_dir/status.json` (and `online`, the
/// devices online); it ends once every sender is dropped.
pub fn start(
    data_dir: &Path,
    gateway: &str,
    embedded: bool,
    online: watch::Sender<Online>,
) -> LiveSender {
    let (tx, mut rx) = mpsc::unbounded_channel::<LiveEvent>();
    let now = crate::protocol::now_ms();
    let mut status = LiveStatus {
        gateway: gateway.to_string(),
        pid: std::process::id(),
        started_ms: now,
        south_mode: if embedded { "embedded" } else { "external" }.into(),
        version: Some(env!("CARGO_PKG_VERSION").into()),
        north: NorthLink {
            up: false,
            since_ms: now,
            endpoint: None,
            last_error: None,
            last_error_ms: None,
        },
        // The embedded listener is up once the gateway runs; an external
        // session once it has subscribed.
        south: Link {
            up: embedded,
            since_ms: now,
        },
        devices_online: Some(0),
        backend: Some(Backend {
            present: true,
            since_ms: now,
            last_ack_ms: None,
        }),
        updated_ms: now,
    };
    let path = data_dir.join(STATUS_FILE);
    let spawned = std::thread::Builder::new()
        .name("ferry-status".into())
        .spawn(move || {
            publish(&status);
            write(&path, &status);
            while let Some(first) = rx.blocking_recv() {
                let now = crate::protocol::now_ms();
                let mut next = Some(first);
                // Only last-seen times changed: no write.
                let mut changed = false;
                // Everything queued, then one write.
                while let Some(ev) = next.take().or_else(|| rx.try_recv().ok()) {
                    changed |= !matches!(ev, LiveEvent::DeviceSeen(_));
                    match ev {
                        LiveEvent::NorthUp(endpoint) => {
                            if !status.north.up {
                                status.north.up = true;
                                status.north.since_ms = now;
                            }
                            status.north.endpoint = Some(endpoint);
                        }
                        LiveEvent::NorthDown if status.north.up => {
                            status.north.up = false;
                            status.north.since_ms = now;
                        }
                        LiveEvent::NorthFailed { endpoint, error } => {
                            status.north.endpoint = Some(endpoint);
                            status.north.last_error = Some(error);
                            status.north.last_error_ms = Some(now);
                        }
                        LiveEvent::SouthUp if !status.south.up => {
                            status.south = Link {
                                up: true,
                                since_ms: now,
                            }
                        }
                        LiveEvent::SouthDown if status.south.up => {
                            status.south = Link {
                                up: false,
                                since_ms: now,
                            }
                        }
                        LiveEvent::NorthDown | LiveEvent::SouthUp | LiveEvent::SouthDown => {}
                        LiveEvent::DeviceOnline(d) => {
                            online.send_modify(|o| {
                                o.entry(d)
                                    .and_modify(|s| s.last_seen_ms = now)
                                    .or_insert(Seen {
                                        since_ms: now,
                                        last_seen_ms: now,
                                    });
                            });
                        }
                        LiveEvent::DeviceOffline(d) => {
                            online.send_if_modified(|o| o.remove(&d).is_some());
                        }
                        LiveEvent::DeviceSeen(d) => {
                            online.send_if_modified(|o| match o.get_mut(&d) {
                                Some(s) => {
                                    s.last_seen_ms = now;
                                    true
                                }
                                None => false,
                            });
                        }
                        LiveEvent::BackendHeard(at) => {
                            if let Some(b) = status.backend.as_mut() {
                                b.last_ack_ms = Some(at);
                            }
                        }
                        LiveEvent::BackendSilent => backend_present(&mut status, false, now),
                        LiveEvent::BackendPresent => backend_present(&mut status, true, now),
                    }
                }
                if !changed {
                    continue;
                }
                if status.devices_online.is_some() {
                    status.devices_online = Some(online.borrow().len());
                }
                status.updated_ms = now;
                publish(&status);
                write(&path, &status);
            }
        });
    if let Err(e) = spawned {
        warn!(event = "status_file_thread_failed", error = %e, "cannot start the status file thread; `ferry status` will say the gateway is not running");
    }
    tx
}

fn backend_present(status: &mut LiveStatus, present: bool, now: i64) {
    if let Some(b) = status.backend.as_mut().filter(|b| b.present != present) {
        b.present = present;
        b.since_ms = now;
    }
}

/// The link gauges of `/metrics` follow the status file.
fn publish(status: &LiveStatus) {
    crate::metrics::set_north_connected(status.north.up);
    crate::metrics::set_south_connected(status.south.up);
    crate::metrics::set_devices_online(status.devices_online.unwrap_or(0));
}

fn write(path: &Path, status: &LiveStatus) {
    let tmp: PathBuf = path.with_extension("json.tmp");
    let result = serde_json::to_vec_pretty(status)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        warn!(event = "status_file_write_failed", path = %path.display(), error = %e, "cannot write the status file");
    }
}

/// The status file in `data_dir`, if one is there and its writer is the
/// gateway running on `data_dir` now, `running` (the pid holding the
/// store's lock, if any): a file left by an earlier one, even for a moment
/// while the next starts, is not.
pub fn read(data_dir: &Path, running: Option<u32>) -> Option<LiveStatus> {
    let running = running?;
    let text = std::fs::read(data_dir.join(STATUS_FILE)).ok()?;
    let status: LiveStatus = serde_json::from_slice(&text).ok()?;
    (status.pid == running).then_some(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_file_is_read_as_running_only_while_its_writer_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let mut status = LiveStatus {
            gateway: "gw".into(),
            pid: u32::MAX - 1,
            started_ms: 0,
            south_mode: "embedded".into(),
            version: None,
            north: NorthLink {
                up: true,
                since_ms: 0,
                endpoint: None,
                last_error: None,
                last_error_ms: None,
            },
            south: Link {
                up: true,
                since_ms: 0,
            },
            devices_online: Some(1),
            backend: None,
            updated_ms: 0,
        };
        write(&dir.path().join(STATUS_FILE), &status);
        assert_eq!(read(dir.path(), None), None, "no gateway holds the lock");
        // A live process (this one, whatever its name) holding no lock:
        // a pid reused after the gateway died.
        status.pid = std::process::id();
        write(&dir.path().join(STATUS_FILE), &status);
        assert_eq!(read(dir.path(), None), None);
        let me = Some(std::process::id());
        assert_eq!(read(dir.path(), me), Some(status.clone()));
        // The file an earlier gateway left, read while this one starts.
        status.pid = u32::MAX - 1;
        write(&dir.path().join(STATUS_FILE), &status);
        assert_eq!(read(dir.path(), me), None);
        assert!(dir.path().join(STATUS_FILE).exists());
        assert!(!dir.path().join("status.json.tmp").exists());
    }

    #[test]
    fn a_file_an_older_ferry_wrote_is_read_without_the_north_details() {
        let old = r#"{"gateway":"gw","pid":1,"started_ms":0,"south_mode":"embedded",
            "north":{"up":false,"since_ms":5},"south":{"up":true,"since_ms":0},
            "devices_online":0,"updated_ms":0}"#;
        let status: LiveStatus = serde_json::from_str(old).expect("an old file");
        assert_eq!(status.north.since_ms, 5);
        assert_eq!(
            (
                status.north.endpoint,
                status.north.last_error,
                status.version
            ),
            (None, None, None)
        );
    }
}
