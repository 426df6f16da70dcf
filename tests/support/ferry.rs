//! The gateway under test: the real `ferry` binary in its own temp dir, the
//! config it is started with, and read-only access to its store.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::proc::{kill_and_reap, signal, wait_exit};
use super::{blocking, file_tail, free_port, port_accepts};

/// How long `Ferry::start` waits for the south listener.
const FERRY_START_TIMEOUT: Duration = Duration::from_secs(20);

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What a test may change in ferry's config; everything else is fixed.
#[derive(Clone, Debug)]
pub struct FerryOpts {
    /// `gateway.id`.
    pub gateway: String,
    /// `north.port` (the upstream Mosquitto).
    pub north_port: u16,
    pub max_payload_bytes: u64,
    /// `south.max_connections`.
    pub max_connections: usize,
    /// `south.max_keep_alive_s`.
    pub max_keep_alive_s: u64,
    /// `south.max_subscriptions`.
    pub max_subscriptions: usize,
    /// `north.max_packet_bytes`.
    pub north_max_packet_bytes: u64,
    pub ack_timeout_ms: u64,
    pub max_inflight: u32,
    pub keep_alive_s: u64,
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    pub retry_max_attempts: u32,
    pub retry_jitter: f64,
    /// `store.sync`: "full" or "normal".
    pub store_sync: String,
    pub store_max_batch: u64,
    pub log_level: String,
    /// Raw lines appended after the last section (`[log]`): start them
    /// with a section header of their own.
    pub extra_toml: Vec<String>,
    /// `gateway.data_dir`; a fresh temp dir when `None`.
    pub data_dir: Option<PathBuf>,
}

impl Default for FerryOpts {
    fn default() -> Self {
        FerryOpts {
            gateway: "gw-test".to_string(),
            north_port: 1884,
            max_payload_bytes: 65536,
            max_connections: 1000,
            max_keep_alive_s: 600,
            max_subscriptions: 8,
            north_max_packet_bytes: 16 << 20,
            ack_timeout_ms: 2000,
            max_inflight: 32,
            keep_alive_s: 5,
            retry_base_ms: 200,
            retry_max_ms: 2000,
            retry_max_attempts: 5,
            retry_jitter: 0.2,
            store_sync: "full".to_string(),
            store_max_batch: 2048,
            log_level: "info".to_string(),
            extra_toml: Vec::new(),
            data_dir: None,
        }
    }
}

impl FerryOpts {
    /// Test defaults for `gateway` talking to Mosquitto on `north_port`.
    pub fn new(gateway: &str, north_port: u16) -> FerryOpts {
        FerryOpts {
            gateway: gateway.to_string(),
            north_port,
            ..FerryOpts::default()
        }
    }

    /// The full config file: every key of `conf/ferry.toml`.
    pub fn render(&self, south_port: u16, data_dir: &Path) -> String {
        let mut s = format!(
            "[gateway]\n\
             id = {id}\n\
             data_dir = {data_dir}\n\
             \n\
             [south]\n\
             listen = \"127.0.0.1:{south_port}\"\n\
             max_payload_bytes = {max_payload}\n\
             topic_prefix = \"devices\"\n\
             max_connections = {max_connections}\n\
             max_keep_alive_s = {max_keep_alive}\n\
             max_subscriptions = {max_subscriptions}\n\
             \n\
             [north]\n\
             host = \"127.0.0.1\"\n\
             port = {north_port}\n\
             client_id = \"\"\n\
             username = \"\"\n\
             password = \"\"\n\
             keep_alive_s = {keep_alive}\n\
             ack_timeout_ms = {ack_timeout}\n\
             max_inflight = {max_inflight}\n\
             topic_prefix = \"ferry\"\n\
             max_packet_bytes = {north_max_packet}\n\
             \n\
             [retry]\n\
             base_ms = {base}\n\
             max_ms = {max}\n\
             max_attempts = {attempts}\n\
             jitter = {jitter:?}\n\
             \n\
             [store]\n\
             sync = {sync}\n\
             max_batch = {max_batch}\n\
             \n\
             [log]\n\
             level = {level}\n",
            id = toml_str(&self.gateway),
            data_dir = toml_str(&data_dir.display().to_string()),
            max_payload = self.max_payload_bytes,
            max_connections = self.max_connections,
            max_keep_alive = self.max_keep_alive_s,
            max_subscriptions = self.max_subscriptions,
            north_max_packet = self.north_max_packet_bytes,
            north_port = self.north_port,
            keep_alive = self.keep_alive_s,
            ack_timeout = self.ack_timeout_ms,
            max_inflight = self.max_inflight,
            base = self.retry_base_ms,
            max = self.retry_max_ms,
            attempts = self.retry_max_attempts,
            jitter = self.retry_jitter,
            sync = toml_str(&self.store_sync),
            max_batch = self.store_max_batch,
            level = toml_str(&self.log_level),
        );
        for line in &self.extra_toml {
            s.push_str(line);
            s.push('\n');
        }
        s
    }
}

/// Path of the binary under test.
pub fn ferry_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ferry"))
}

/// A `ferry` command with no `FERRY_*` overrides leaking in from outside.
pub fn ferry_command() -> Command {
    let mut cmd = Command::new(ferry_binary());
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("FERRY_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("RUST_BACKTRACE", "1").env("NO_COLOR", "1");
    cmd
}

/// The real gateway binary in its own temp dir; SIGKILLed on drop.
pub struct Ferry {
    pub south_port: u16,
    pub data_dir: PathBuf,
    pub gateway: String,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    pub opts: FerryOpts,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Ferry {
    /// Writes the config and starts `ferry run`; returns once the south
    /// listener accepts TCP.
    pub fn start(opts: FerryOpts) -> Ferry {
        let dir = tempfile::Builder::new()
            .prefix("ferry-gw-")
            .tempdir()
            .expect("temp dir for ferry");
        let south_port = free_port();
        let data_dir = opts
            .data_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("data"));
        let config_path = dir.path().join("ferry.toml");
        fs::write(&config_path, opts.render(south_port, &data_dir)).expect("write ferry.toml");
        let mut ferry = Ferry {
            south_port,
            data_dir,
            gateway: opts.gateway.clone(),
            log_path: dir.path().join("ferry.log"),
            config_path,
            opts,
            dir,
            child: None,
        };
        ferry.spawn();
        ferry
    }

    fn spawn(&mut self) {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open ferry.log");
        let _ = writeln!(log, "=== harness: starting ferry run ===");
        let child = ferry_command()
            .arg("run")
            .arg("--config")
            .arg(&self.config_path)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn ferry");
        self.child = Some(child);
        let port = self.south_port;
        let started = Instant::now();
        blocking(|| loop {
            if port_accepts(port) {
                return;
            }
            let child = self.child.as_mut().expect("child");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                panic!(
                    "ferry exited with {status} before its south port {port} accepted TCP\n\
                     --- ferry log tail ---\n{}",
                    self.log_tail()
                );
            }
            if started.elapsed() > FERRY_START_TIMEOUT {
                panic!(
                    "ferry's south port {port} did not accept TCP within {FERRY_START_TIMEOUT:?}\n\
                     --- ferry log tail ---\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        });
    }

    /// SIGKILL and reap: no shutdown path runs.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            blocking(|| kill_and_reap(&mut child));
        }
    }

    /// SIGTERM, then waits up to `timeout` for a clean exit; true if it did.
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        signal(&child, libc::SIGTERM);
        blocking(|| {
            if wait_exit(&mut child, timeout) {
                true
            } else {
                kill_and_reap(&mut child);
                false
            }
        })
    }

    /// Starts it again: same config, data dir and ports (killing it first).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The store, opened read-only.
    pub fn db(&self) -> rusqlite::Connection {
        let path = self.data_dir.join("ferry.db");
        let conn = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .unwrap_or_else(|e| panic!("open {} read-only: {e}", path.display()));
        conn.busy_timeout(Duration::from_secs(5))
            .expect("set busy timeout");
        conn
    }

    /// One integer from a query on the store, e.g. a `COUNT(*)`.
    pub fn query_i64(&self, sql: &str, params: impl rusqlite::Params) -> i64 {
        self.db()
            .query_row(sql, params, |r| r.get(0))
            .unwrap_or_else(|e| panic!("query `{sql}`: {e}"))
    }

    pub fn log_tail(&self) -> String {
        file_tail(&self.log_path, 60)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Ferry {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
        if std::thread::panicking() {
            eprintln!(
                "--- ferry ({}, south port {}) log tail ---\n{}",
                self.gateway,
                self.south_port,
                self.log_tail()
            );
        }
    }
}
