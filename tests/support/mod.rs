//! Test harness: a real Mosquitto upstream, the real `ferry` binary, and MQTT
//! clients playing the field devices and the backend, all on 127.0.0.1.
//!
//! - [`mosquitto`]: the upstream broker, one per test, on a free port.
//! - [`certs`]: a test CA and the certificates it issues (rcgen).
//! - [`config`]: the config a test starts ferry with, ferry's own raw
//!   config type serialized to TOML.
//! - [`ferry`]: the gateway binary.
//! - [`session`]: the MQTT clients, on ferry's own session (`ferry::mqtt`),
//!   and the clients built straight on them.
//! - [`clients`]: a field device and the backend, on [`session`].
//! - [`raw_mqtt`]: one TCP socket, MQTT packets written and read by hand.
//! - [`proc`]: child processes, memory and file limits.
//!
//! With the `system-tests` feature (tests/tests.rs), what needs more of
//! the machine than Mosquitto: `chromium` (the status page in headless
//! Chromium), `faketime` (ferry under libfaketime), `powercut` (a shim
//! built with gcc) and `tmpfs` (a disk that fills, mounted as root).
//!
//! Shared by the integration tests (`tests/tests.rs`) and the benchmarks
//! (which include this file with `#[path]`), so it holds no test-only
//! macros. Every wait is bounded: a helper either returns within its
//! deadline or panics with the logs that explain why.
#![allow(dead_code)]

pub mod access;
pub mod admin;
pub mod any_version;
pub mod backlog;
pub mod certs;
#[cfg(feature = "system-tests")]
pub mod chromium;
pub mod clients;
pub mod config;
#[cfg(feature = "system-tests")]
pub mod faketime;
pub mod ferry;
pub mod mosquitto;
#[cfg(feature = "system-tests")]
pub mod powercut;
pub mod proc;
pub mod raw_mqtt;
pub mod raw_v5;
pub mod session;
#[cfg(feature = "system-tests")]
pub mod tmpfs;
pub mod traffic;

use std::fs::{self, File};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use certs::Pki;
pub use clients::{device_topics, forgeries, north_topics, Backend, Device, NorthMessage};
pub use config::{listener, FerryOpts};
pub use ferry::{check_config, ferry_binary, ferry_command, run_on_config, Ferry};
pub use mosquitto::{Mosquitto, TlsListener};
pub use proc::{raise_fd_limit, rss_kib};
pub use raw_mqtt::RawMqtt;
pub use session::{cut_off, BareClient};
#[cfg(feature = "system-tests")]
pub use tmpfs::Tmpfs;

/// Where devices connect: ferry's embedded broker, or a site Mosquitto
/// ferry is a client of (external mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Embedded,
    External,
}

/// How long `connect` helpers wait for the broker's SubAck.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest MQTT packet the test clients send or accept.
const MAX_PACKET: usize = 8 << 20;

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A random id for one test run, usable inside a `msg_id` ("boot id").
pub fn boot_id() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// Runs blocking work (process waits, port polls) without starving the
/// tokio worker it is called on, when there is one.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

fn port_accepts(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// The last `lines` lines of a text file ("" if it can't be read).
pub fn file_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Writes `contents` to a new file in `dir` and returns its path.
pub fn write_file(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    let mut f = File::create(&path).expect("create file");
    f.write_all(contents.as_bytes()).expect("write file");
    path
}

/// How often ferry's log says it connected north.
pub fn north_connects(log: &str) -> usize {
    logged(log, "link_connected", "link=north")
}

/// Lines of the text log naming `event` and containing `with`.
pub fn logged(log: &str, event: &str, with: &str) -> usize {
    let name = format!("event=\"{event}\"");
    log.lines()
        .filter(|l| l.contains(&name) && l.contains(with))
        .count()
}

/// Small readers of receipts (as JSON) and waits, shared by the suites.
pub mod receipts {
    use std::collections::HashSet;
    use std::time::Duration;

    use serde_json::Value;
    use tokio::time::Instant;

    /// A receipt's `status`, or "" without one.
    pub fn status(r: &Value) -> &str {
        r["status"].as_str().unwrap_or("")
    }

    /// Distinct msg_ids with `wanted` status among `receipts`.
    pub fn ids_with(receipts: &[Value], wanted: &str) -> HashSet<String> {
        receipts
            .iter()
            .filter(|r| status(r) == wanted)
            .filter_map(|r| r["msg_id"].as_str().map(str::to_string))
            .collect()
    }

    /// Polls `check` until it holds; panics after `timeout` naming `what`.
    pub async fn eventually(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !check() {
            assert!(
                Instant::now() < deadline,
                "not true within {timeout:?}: {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
