//! systemd's service protocol: `READY=1`, `STATUS=` with the backlog, and
//! the watchdog, fed only while the pipeline is alive ([`crate::health`]).
//!
//! The messages are datagrams on `$NOTIFY_SOCKET` (a path, or an abstract
//! socket written `@name`), as sd_notify(3) sends them; without that
//! variable (not started by systemd) nothing is sent. The watchdog is on
//! when `$WATCHDOG_USEC` is set (and `$WATCHDOG_PID`, if set, is ours).
//!
//! Each check pings the store writer and the pipeline tasks and waits at
//! most half the watchdog interval for their answers; `WATCHDOG=1` is sent
//! only when every one answered (or the writer is retrying a commit, which
//! a restart would not help). A wedged part therefore stops the feeding,
//! and systemd restarts the service after `WatchdogSec`.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::health::{Check, Probe, Writer};
use crate::store::{Backlog, Store};

/// `STATUS=` is refreshed this often (and at each watchdog check).
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// Where the notifications go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

/// The notification socket, when systemd gave one.
#[derive(Debug)]
pub struct Notifier {
    target: Option<Target>,
    socket: Option<UnixDatagram>,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET`; a notifier that sends nothing without it.
    pub fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|v| parse_target(&v));
        // Non-blocking: a systemd that stopped reading must not stall the
        // runtime thread the watchdog runs on.
        let socket = target.as_ref().and_then(|_| {
            let s = UnixDatagram::unbound().ok()?;
            s.set_nonblocking(true).ok()?;
            Some(s)
        });
        Notifier { target, socket }
    }

    /// Whether systemd listens.
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// Sends `state` (`KEY=value` lines). A failure is logged at DEBUG and
    /// otherwise ignored: systemd gone away is no reason to stop.
    pub fn notify(&self, state: &str) {
        let (Some(socket), Some(target)) = (&self.socket, &self.target) else {
            return;
        };
        let sent = match target {
            Target::Path(path) => socket.send_to(state.as_bytes(), path),
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name)
                    .and_then(|addr| socket.send_to_addr(state.as_bytes(), &addr))
            }
        };
        if let Err(e) = sent {
            debug!(error = %e, "systemd notification not sent");
        }
    }
}

fn parse_target(v: &std::ffi::OsStr) -> Option<Target> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = v.as_bytes();
    match bytes.first()? {
        b'@' => Some(Target::Abstract(bytes[1..].to_vec())),
        b'/' => Some(Target::Path(PathBuf::from(v))),
        // sd_notify(3) knows only these two (and vsock, which ferry's units
        // never use).
        _ => None,
    }
}

/// The watchdog interval systemd asked for (`$WATCHDOG_USEC`), if it is
/// meant for this process.
pub fn watchdog_interval() -> Option<Duration> {
    let pid = std::env::var("WATCHDOG_PID").ok();
    let usec = std::env::var("WATCHDOG_USEC").ok();
    parse_watchdog(usec.as_deref(), pid.as_deref(), std::process::id())
}

fn parse_watchdog(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok()? != me {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// The `STATUS=` line.
pub fn status_line(backlog: &Backlog) -> String {
    format!(
        "STATUS=backlog: {} uplinks, {} downlinks undelivered",
        backlog.uplinks, backlog.downlinks
    )
}

/// Runs for the gateway's life, under systemd or not: checks the parts
/// every quarter of the watchdog interval (every [`STATUS_EVERY`] without
/// one), publishes each check to `reports` (the admin server's `/healthz`),
/// feeds the watchdog when they are alive and refreshes `STATUS=` (both
/// only under systemd).
pub async fn supervise(
    notifier: Notifier,
    watchdog: Option<Duration>,
    store: Store,
    probes: Vec<Probe>,
    reports: tokio::sync::watch::Sender<Option<crate::health::Report>>,
) {
    let every = watchdog.map_or(STATUS_EVERY, |w| (w / 4).min(STATUS_EVERY));
    let budget = watchdog.map_or(STATUS_EVERY, |w| w / 2);
    if let Some(w) = watchdog {
        info!(
            event = "watchdog_enabled",
            watchdog_ms = w.as_millis() as u64,
            "systemd watchdog on: fed while the store writer and the pipeline answer"
        );
    }
    let beat = store.writer_beat();
    let mut unhealthy_since: Option<Instant> = None;
    let mut last_status = Instant::now() - STATUS_EVERY;
    let mut next = Instant::now();
    loop {
        tokio::time::sleep_until(next).await;
        next += every;
        let started = Instant::now();
        let deadline = started + budget;
        let beats = beat.count();
        let (pinged, answers) = tokio::join!(
            tokio::time::timeout_at(deadline, store.ping()),
            futures_util::future::join_all(probes.iter().map(|p| p.ping(deadline))),
        );
        let (writer, backlog) = match pinged {
            Ok(Ok(backlog)) => (Writer::Answered, Some(backlog)),
            // The store stopped: the gateway stops with the cause.
            Ok(Err(_)) => return,
            Err(_) if beat.count() != beats => (Writer::Retrying, None),
            Err(_) => (Writer::Silent, None),
        };
        let check = Check {
            writer,
            silent: probes
                .iter()
                .zip(answers)
                .filter(|(_, ok)| !ok)
                .map(|(p, _)| p.name())
                .collect(),
        };
        reports.send_replace(Some(crate::health::Report {
            healthy: check.healthy(),
            silent: check.describe(),
            at: Instant::now(),
        }));
        if check.healthy() {
            if let Some(since) = unhealthy_since.take() {
                info!(
                    event = "pipeline_answers_again",
                    unhealthy_ms = since.elapsed().as_millis() as u64,
                    "pipeline answers again; watchdog fed"
                );
            }
            if watchdog.is_some() {
                notifier.notify("WATCHDOG=1");
            }
        } else if unhealthy_since.is_none() {
            unhealthy_since = Some(started);
            warn!(event = "pipeline_stalled", silent = %check.describe(), budget_ms = budget.as_millis() as u64, "pipeline part did not answer in time; the systemd watchdog is not fed");
        }
        if let Some(backlog) = backlog {
            if last_status.elapsed() >= STATUS_EVERY {
                notifier.notify(&status_line(&backlog));
                last_status = Instant::now();
            }
        }
        // A slow check does not make the next ones pile up.
        next = next.max(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_is_a_path_or_an_abstract_name() {
        use std::ffi::OsStr;
        assert_eq!(
            parse_target(OsStr::new("/run/systemd/notify")),
            Some(Target::Path("/run/systemd/notify".into()))
        );
        assert_eq!(
            parse_target(OsStr::new("@ferry-notify")),
            Some(Target::Abstract(b"ferry-notify".to_vec()))
        );
        assert_eq!(parse_target(OsStr::new("")), None);
        assert_eq!(parse_target(OsStr::new("relative")), None);
    }

    #[test]
    fn the_watchdog_is_on_only_for_this_process_and_a_positive_interval() {
        assert_eq!(
            parse_watchdog(Some("30000000"), None, 7),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_watchdog(Some("400000"), Some("7"), 7),
            Some(Duration::from_millis(400))
        );
        assert_eq!(parse_watchdog(Some("400000"), Some("8"), 7), None);
        assert_eq!(parse_watchdog(Some("0"), None, 7), None);
        assert_eq!(parse_watchdog(Some("soon"), None, 7), None);
        assert_eq!(parse_watchdog(None, None, 7), None);
    }

    #[test]
    fn notifications_reach_a_path_socket_and_an_abstract_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            target: Some(Target::Path(path)),
            socket: UnixDatagram::unbound().ok(),
        };
        n.notify("READY=1");
        let mut buf = [0u8; 64];
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("ferry-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier {
            target: Some(Target::Abstract(name.into_bytes())),
            socket: UnixDatagram::unbound().ok(),
        };
        n.notify("WATCHDOG=1");
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
    }

    #[test]
    fn the_status_line_names_the_backlog_both_ways() {
        let line = status_line(&Backlog {
            uplinks: 12,
            downlinks: 3,
        });
        assert_eq!(line, "STATUS=backlog: 12 uplinks, 3 downlinks undelivered");
    }
}
