//! Test harness: a real Mosquitto upstream, the real `ferry` binary, and MQTT
//! clients playing the field devices and the backend, all on 127.0.0.1.
//!
//! Shared by the integration tests and the benchmark (which includes this file
//! with `#[path]`), so it holds no test-only macros. Every wait is bounded: a
//! helper either returns within its deadline or panics with the logs that
//! explain why.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, Publish, QoS};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// How long `connect` helpers wait for the broker's SubAck.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `Ferry::start` waits for the south listener.
const FERRY_START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `Mosquitto::start` waits for its listener.
const MOSQUITTO_START_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after every event-loop error (rumqttc reconnects with no backoff).
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
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

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child we own and have not reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Waits up to `timeout` for the child to exit; true if it did.
fn wait_exit(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn kill_and_reap(child: &mut Child) {
    signal(child, libc::SIGKILL);
    let _ = child.wait();
}

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

// ---------------------------------------------------------------------------
// Mosquitto
// ---------------------------------------------------------------------------

fn mosquitto_binary() -> PathBuf {
    let fixed = PathBuf::from("/usr/sbin/mosquitto");
    if fixed.is_file() {
        return fixed;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("mosquitto");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "mosquitto not found: install it with `apt-get install -y mosquitto` \
         (or run `bash .ci/run`, which does)"
    );
}

/// A Mosquitto broker on 127.0.0.1 in its own temp dir; killed on drop.
pub struct Mosquitto {
    pub port: u16,
    binary: PathBuf,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Mosquitto {
    /// Starts a broker on a free port.
    pub fn start() -> Mosquitto {
        Mosquitto::start_on(free_port())
    }

    /// Starts a broker on a free port with extra config lines.
    pub fn start_with(extra: &[&str]) -> Mosquitto {
        Mosquitto::start_configured(free_port(), extra)
    }

    /// Starts a broker on `port`.
    pub fn start_on(port: u16) -> Mosquitto {
        Mosquitto::start_configured(port, &[])
    }

    fn start_configured(port: u16, extra: &[&str]) -> Mosquitto {
        let binary = mosquitto_binary();
        let dir = tempfile::Builder::new()
            .prefix("ferry-mosquitto-")
            .tempdir()
            .expect("temp dir for mosquitto");
        let log = dir.path().join("mosquitto.log");
        let config = format!(
            "listener {port} 127.0.0.1\n\
             allow_anonymous true\n\
             max_queued_messages 0\n\
             max_inflight_messages 0\n\
             persistence false\n\
             user root\n\
             log_dest file {log}\n\
             log_type error\n\
             log_type warning\n\
             log_type notice\n\
             log_type information\n\
             connection_messages true\n{extra}",
            log = log.display(),
            extra = extra.iter().map(|l| format!("{l}\n")).collect::<String>()
        );
        fs::write(dir.path().join("mosquitto.conf"), config).expect("write mosquitto.conf");
        let mut m = Mosquitto {
            port,
            binary,
            dir,
            child: None,
        };
        m.spawn();
        m
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("mosquitto.log")
    }

    pub fn log_tail(&self) -> String {
        file_tail(&self.log_path(), 40)
    }

    fn spawn(&mut self) {
        let conf = self.dir.path().join("mosquitto.conf");
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("mosquitto.stderr"))
            .expect("open mosquitto.stderr");
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn mosquitto");
        self.child = Some(child);
        let port = self.port;
        let started = Instant::now();
        blocking(|| loop {
            if port_accepts(port) {
                return;
            }
            let child = self.child.as_mut().expect("child");
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "mosquitto on port {port} exited with {status} before listening\n\
                     --- stderr ---\n{}\n--- log ---\n{}",
                    file_tail(&self.dir.path().join("mosquitto.stderr"), 20),
                    self.log_tail()
                );
            }
            if started.elapsed() > MOSQUITTO_START_TIMEOUT {
                panic!(
                    "mosquitto on port {port} not listening after {MOSQUITTO_START_TIMEOUT:?}\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        });
    }

    /// SIGTERM, then waits for it to exit (SIGKILL after 5 s).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&child, libc::SIGTERM);
            blocking(|| {
                if !wait_exit(&mut child, Duration::from_secs(5)) {
                    kill_and_reap(&mut child);
                }
            });
        }
    }

    /// Starts it again on the same port (stopping it first if it runs).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// The broker's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
        if std::thread::panicking() {
            eprintln!(
                "--- mosquitto (port {}) log tail ---\n{}",
                self.port,
                self.log_tail()
            );
        }
    }
}

// ---------------------------------------------------------------------------
// ferry
// ---------------------------------------------------------------------------

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

    /// SIGTERM, then waits up to `timeout` for an exit: its status, or
    /// `None` if it was still running (it is then killed).
    pub fn terminate_status(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        signal(&child, libc::SIGTERM);
        blocking(|| {
            if wait_exit(&mut child, timeout) {
                child.try_wait().ok().flatten()
            } else {
                kill_and_reap(&mut child);
                None
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

// ---------------------------------------------------------------------------
// MQTT clients
// ---------------------------------------------------------------------------

static CLIENT_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique client id with a readable prefix.
pub fn unique_client_id(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        CLIENT_COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Called from the event-loop task for every incoming publish.
type PublishHook = Box<dyn Fn(&Publish) + Send + Sync>;

/// An rumqttc client whose event loop runs in its own task; it
/// re-subscribes after every ConnAck and forwards incoming publishes.
struct Session {
    client: AsyncClient,
    incoming: mpsc::UnboundedReceiver<Publish>,
    subacks: watch::Receiver<u64>,
    connacks: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl Session {
    async fn connect(
        client_id: &str,
        port: u16,
        filters: Vec<String>,
        clean_session: bool,
        hook: Option<PublishHook>,
    ) -> Session {
        let mut options = MqttOptions::new(client_id, "127.0.0.1", port);
        options.set_max_packet_size(MAX_PACKET, MAX_PACKET);
        options.set_clean_session(clean_session);
        options.set_keep_alive(Duration::from_secs(10));
        let (client, mut eventloop) = AsyncClient::new(options, 256);
        let (tx, incoming) = mpsc::unbounded_channel();
        let (subacks_tx, subacks) = watch::channel(0u64);
        let (connacks_tx, connacks) = watch::channel(0u64);
        let resubscriber = client.clone();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        connacks_tx.send_modify(|n| *n += 1);
                        if !filters.is_empty() {
                            // Not awaited here: the request channel is drained
                            // by this very loop.
                            let client = resubscriber.clone();
                            let topics: Vec<_> = filters
                                .iter()
                                .map(|f| rumqttc::SubscribeFilter::new(f.clone(), QoS::AtLeastOnce))
                                .collect();
                            tokio::spawn(async move {
                                let _ = client.subscribe_many(topics).await;
                            });
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        subacks_tx.send_modify(|n| *n += 1);
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if let Some(hook) = &hook {
                            hook(&p);
                        }
                        let _ = tx.send(p);
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(RECONNECT_PAUSE).await,
                }
            }
        });
        let mut session = Session {
            client,
            incoming,
            subacks,
            connacks,
            task,
        };
        if !session.wait_subacks(1, CONNECT_TIMEOUT).await {
            panic!(
                "client {client_id} got no SubAck from 127.0.0.1:{port} within {CONNECT_TIMEOUT:?}"
            );
        }
        session
    }

    async fn wait_subacks(&mut self, n: u64, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.subacks.wait_for(|c| *c >= n))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    async fn next(&mut self, timeout: Duration) -> Option<Publish> {
        tokio::time::timeout(timeout, self.incoming.recv())
            .await
            .ok()
            .flatten()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A field device on ferry's south broker; its client id is its device id.
pub struct Device {
    pub id: String,
    session: Session,
}

impl Device {
    /// Connects with a clean session and subscribes to `devices/{id}/ack`.
    pub async fn connect(south_port: u16, id: &str) -> Device {
        Device::connect_with_session(south_port, id, true).await
    }

    /// Like `connect`, choosing `clean_session`.
    pub async fn connect_with_session(south_port: u16, id: &str, clean_session: bool) -> Device {
        let session = Session::connect(
            id,
            south_port,
            vec![format!("devices/{id}/ack")],
            clean_session,
            None,
        )
        .await;
        Device {
            id: id.to_string(),
            session,
        }
    }

    /// The device's MQTT client, for sending from another task.
    pub fn client(&self) -> AsyncClient {
        self.session.client.clone()
    }

    pub fn up_topic(&self, stream: &str) -> String {
        format!("devices/{}/up/{stream}", self.id)
    }

    /// Publishes `{"msg_id", "ts", "payload"}` on `devices/{id}/up/{stream}`.
    pub async fn publish_envelope(&self, stream: &str, msg_id: &str, payload: Value) {
        let envelope = json!({"msg_id": msg_id, "ts": now_ms(), "payload": payload});
        self.publish_json(stream, &envelope).await;
    }

    /// Publishes `count` envelopes `{boot}-{tag}{i:04}` on `stream`; returns
    /// their msg_ids in order.
    pub async fn publish_many(
        &self,
        stream: &str,
        boot: &str,
        tag: &str,
        count: usize,
    ) -> Vec<String> {
        let mut ids = Vec::with_capacity(count);
        for i in 0..count {
            let id = format!("{boot}-{tag}{i:04}");
            self.publish_envelope(stream, &id, json!({"i": i, "tag": tag}))
                .await;
            ids.push(id);
        }
        ids
    }

    /// Publishes any JSON value as the envelope.
    pub async fn publish_json(&self, stream: &str, envelope: &Value) {
        let bytes = serde_json::to_vec(envelope).expect("serialize envelope");
        self.publish_raw(&self.up_topic(stream), bytes).await;
    }

    /// Publishes bytes on any topic at QoS 1.
    pub async fn publish_raw(&self, topic: &str, bytes: impl Into<Vec<u8>>) {
        self.session
            .client
            .publish(topic, QoS::AtLeastOnce, false, bytes.into())
            .await
            .expect("queue publish");
    }

    /// The next receipt, parsed; `None` after `timeout`.
    pub async fn next_receipt(&mut self, timeout: Duration) -> Option<Value> {
        let p = self.session.next(timeout).await?;
        Some(serde_json::from_slice(&p.payload).unwrap_or_else(|e| {
            panic!(
                "device {} got a receipt that is not JSON ({e}): {:?}",
                self.id,
                String::from_utf8_lossy(&p.payload)
            )
        }))
    }

    /// Collects receipts until `done(all collected so far)` holds or
    /// `timeout` passes; returns what it collected either way.
    pub async fn receipts_until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        let mut all = Vec::new();
        while !done(&all) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.next_receipt(left).await {
                Some(r) => all.push(r),
                None => break,
            }
        }
        all
    }

    /// The next receipt for `msg_id`, skipping (and returning) others.
    pub async fn next_receipt_for(
        &mut self,
        msg_id: &str,
        timeout: Duration,
    ) -> (Option<Value>, Vec<Value>) {
        let deadline = Instant::now() + timeout;
        let mut skipped = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (None, skipped);
            }
            match self.next_receipt(left).await {
                Some(r) if r["msg_id"] == msg_id => return (Some(r), skipped),
                Some(r) => skipped.push(r),
                None => return (None, skipped),
            }
        }
    }

    /// SubAcks seen so far (one per (re)connect).
    pub fn subacks(&self) -> u64 {
        *self.session.subacks.borrow()
    }

    /// Waits until at least `n` SubAcks were seen, e.g. after a reconnect.
    pub async fn wait_subacks(&mut self, n: u64, timeout: Duration) -> bool {
        self.session.wait_subacks(n, timeout).await
    }
}

/// One message the backend received on `ferry/{gateway}/up/#`.
#[derive(Clone, Debug)]
pub struct NorthMessage {
    pub topic: String,
    pub raw: Vec<u8>,
    /// The parsed body (`Value::Null` if it was not JSON).
    pub body: Value,
}

impl NorthMessage {
    fn from_publish(p: &Publish) -> NorthMessage {
        NorthMessage {
            topic: p.topic.clone(),
            raw: p.payload.to_vec(),
            body: serde_json::from_slice(&p.payload).unwrap_or(Value::Null),
        }
    }

    pub fn device(&self) -> &str {
        self.body["device"].as_str().unwrap_or("")
    }

    pub fn msg_id(&self) -> &str {
        self.body["msg_id"].as_str().unwrap_or("")
    }

    pub fn seq(&self) -> Option<u64> {
        self.body["seq"].as_u64()
    }
}

fn ack_ok_body(device: &str, msg_id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"device": device, "msg_id": msg_id, "status": "ok"}))
        .expect("serialize ack")
}

/// The backend on the upstream Mosquitto.
pub struct Backend {
    pub gateway: String,
    auto_ack: Arc<AtomicBool>,
    session: Session,
    acker: JoinHandle<()>,
}

impl Backend {
    /// Connects with a clean session and subscribes to `ferry/{gateway}/up/#`.
    /// Acks nothing by itself.
    pub async fn connect(mosquitto_port: u16, gateway: &str) -> Backend {
        Backend::connect_with(mosquitto_port, gateway, false).await
    }

    /// Like `connect`, but acks `ok` every message it receives.
    pub async fn connect_auto_ack(mosquitto_port: u16, gateway: &str) -> Backend {
        Backend::connect_with(mosquitto_port, gateway, true).await
    }

    async fn connect_with(mosquitto_port: u16, gateway: &str, auto_ack: bool) -> Backend {
        let auto_ack = Arc::new(AtomicBool::new(auto_ack));
        let (ack_tx, mut ack_rx) = mpsc::unbounded_channel::<(String, String)>();
        let flag = auto_ack.clone();
        let hook: PublishHook = Box::new(move |p: &Publish| {
            if flag.load(Ordering::Relaxed) {
                let m = NorthMessage::from_publish(p);
                let _ = ack_tx.send((m.device().to_string(), m.msg_id().to_string()));
            }
        });
        let session = Session::connect(
            &unique_client_id(&format!("backend-{gateway}")),
            mosquitto_port,
            vec![format!("ferry/{gateway}/up/#")],
            true,
            Some(hook),
        )
        .await;
        let client = session.client.clone();
        let ack_topic = format!("ferry/{gateway}/ack");
        let acker = tokio::spawn(async move {
            while let Some((device, msg_id)) = ack_rx.recv().await {
                let _ = client
                    .publish(
                        &ack_topic,
                        QoS::AtLeastOnce,
                        false,
                        ack_ok_body(&device, &msg_id),
                    )
                    .await;
            }
        });
        Backend {
            gateway: gateway.to_string(),
            auto_ack,
            session,
            acker,
        }
    }

    /// Turns acking every received message on or off.
    pub fn set_auto_ack(&self, on: bool) {
        self.auto_ack.store(on, Ordering::Relaxed);
    }

    pub fn ack_topic(&self) -> String {
        format!("ferry/{}/ack", self.gateway)
    }

    /// The next message; `None` after `timeout`.
    pub async fn next_message(&mut self, timeout: Duration) -> Option<NorthMessage> {
        let p = self.session.next(timeout).await?;
        Some(NorthMessage::from_publish(&p))
    }

    /// Collects messages until `done(all collected so far)` holds or
    /// `timeout` passes; returns what it collected either way.
    pub async fn messages_until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[NorthMessage]) -> bool,
    ) -> Vec<NorthMessage> {
        let deadline = Instant::now() + timeout;
        let mut all = Vec::new();
        while !done(&all) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.next_message(left).await {
                Some(m) => all.push(m),
                None => break,
            }
        }
        all
    }

    /// Everything that arrives within `window`.
    pub async fn drain_for(&mut self, window: Duration) -> Vec<NorthMessage> {
        self.messages_until(window, |_| false).await
    }

    /// Publishes raw bytes on any topic at QoS 1.
    pub async fn publish_raw(&self, topic: &str, body: Vec<u8>) {
        self.session
            .client
            .publish(topic, QoS::AtLeastOnce, false, body)
            .await
            .expect("queue publish");
    }

    /// Publishes raw bytes on `ferry/{gateway}/ack`.
    pub async fn publish_ack_raw(&self, body: Vec<u8>) {
        self.session
            .client
            .publish(self.ack_topic(), QoS::AtLeastOnce, false, body)
            .await
            .expect("queue ack");
    }

    /// `{"device", "msg_id", "status": "ok"}`.
    pub async fn ack_ok(&self, device: &str, msg_id: &str) {
        self.publish_ack_raw(ack_ok_body(device, msg_id)).await;
    }

    /// `{"device", "msg_id", "status": "nack", "reason", "retry"}`.
    pub async fn nack(&self, device: &str, msg_id: &str, reason: &str, retry: bool) {
        let body = json!({
            "device": device,
            "msg_id": msg_id,
            "status": "nack",
            "reason": reason,
            "retry": retry,
        });
        self.publish_ack_raw(serde_json::to_vec(&body).expect("serialize nack"))
            .await;
    }

    /// SubAcks seen so far (one per (re)connect).
    pub fn subacks(&self) -> u64 {
        *self.session.subacks.borrow()
    }

    /// Waits until at least `n` SubAcks were seen, e.g. after a reconnect.
    pub async fn wait_subacks(&mut self, n: u64, timeout: Duration) -> bool {
        self.session.wait_subacks(n, timeout).await
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.acker.abort();
    }
}

/// Writes `contents` to a new file in `dir` and returns its path.
pub fn write_file(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    let mut f = File::create(&path).expect("create file");
    f.write_all(contents.as_bytes()).expect("write file");
    path
}

/// Command-line flags for the benchmarks: `--flag value` or `--flag=value`;
/// cargo's own `--bench` is skipped.
pub struct Flags<I: Iterator<Item = String>> {
    raw: I,
    inline: Option<String>,
}

impl<I: Iterator<Item = String>> Flags<I> {
    pub fn new(raw: impl IntoIterator<Item = String, IntoIter = I>) -> Flags<I> {
        Flags {
            raw: raw.into_iter(),
            inline: None,
        }
    }

    /// The next flag name.
    pub fn next_flag(&mut self) -> Option<String> {
        loop {
            let arg = self.raw.next()?;
            if arg == "--bench" {
                continue;
            }
            return Some(match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => {
                    self.inline = Some(v.to_string());
                    f.to_string()
                }
                _ => {
                    self.inline = None;
                    arg
                }
            });
        }
    }

    /// The value of `flag`, the one just returned by `next_flag`.
    pub fn value(&mut self, flag: &str) -> Result<String, String> {
        self.inline
            .take()
            .or_else(|| self.raw.next())
            .ok_or_else(|| format!("{flag} needs a value"))
    }

    /// The value of `flag` as a number.
    pub fn num<T: std::str::FromStr>(&mut self, flag: &str) -> Result<T, String> {
        let v = self.value(flag)?;
        v.parse()
            .map_err(|_| format!("{flag}: `{v}` is not a valid number"))
    }
}

// ---------------------------------------------------------------------------
// Raw MQTT: one TCP socket, packets written and read by hand
// ---------------------------------------------------------------------------

/// A bare MQTT 3.1.1 client: it sends exactly what it is told, reads only
/// when asked, and acknowledges nothing by itself. For the edges a real
/// client library would smooth over (keep-alive 0, a device that stops
/// reading, a packet over the broker's limit, a refused CONNECT).
pub struct RawMqtt {
    stream: tokio::net::TcpStream,
    buf: bytes::BytesMut,
    next_pkid: u16,
}

impl RawMqtt {
    /// TCP connect and CONNECT; the CONNACK, or why there is none.
    pub async fn try_connect(
        port: u16,
        client_id: &str,
        keep_alive: u16,
    ) -> Result<(RawMqtt, rumqttc::ConnAck), String> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("tcp connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let mut raw = RawMqtt {
            stream,
            buf: bytes::BytesMut::new(),
            next_pkid: 0,
        };
        let mut connect = rumqttc::Connect::new(client_id);
        connect.keep_alive = keep_alive;
        connect.clean_session = true;
        raw.send(rumqttc::Packet::Connect(connect)).await;
        match raw.recv(CONNECT_TIMEOUT).await {
            Some(rumqttc::Packet::ConnAck(ack)) => Ok((raw, ack)),
            Some(other) => Err(format!("expected CONNACK, got {other:?}")),
            None => Err("no CONNACK: the socket closed or nothing came".into()),
        }
    }

    /// Connects and insists on an accepted session.
    pub async fn connect(port: u16, client_id: &str, keep_alive: u16) -> RawMqtt {
        let (raw, ack) = RawMqtt::try_connect(port, client_id, keep_alive)
            .await
            .unwrap_or_else(|e| panic!("{client_id}: {e}"));
        assert_eq!(
            ack.code,
            rumqttc::ConnectReturnCode::Success,
            "{client_id} refused"
        );
        raw
    }

    pub fn next_pkid(&mut self) -> u16 {
        self.next_pkid = self.next_pkid % u16::MAX + 1;
        self.next_pkid
    }

    fn encode(packet: &rumqttc::Packet, out: &mut bytes::BytesMut) {
        packet
            .write(out, usize::MAX)
            .unwrap_or_else(|e| panic!("encode {packet:?}: {e}"));
    }

    /// Writes one packet.
    pub async fn send(&mut self, packet: rumqttc::Packet) {
        self.send_many(std::iter::once(packet)).await;
    }

    /// Writes many packets in one go (the socket write may block until the
    /// broker reads).
    pub async fn send_many(&mut self, packets: impl IntoIterator<Item = rumqttc::Packet>) {
        use tokio::io::AsyncWriteExt;
        let mut out = bytes::BytesMut::new();
        for p in packets {
            RawMqtt::encode(&p, &mut out);
        }
        self.stream.write_all(&out).await.expect("raw write");
    }

    /// A QoS 1 PUBLISH with a fresh packet id.
    pub fn publish(&mut self, topic: &str, payload: impl Into<Vec<u8>>) -> rumqttc::Packet {
        let mut p = rumqttc::Publish::new(topic, QoS::AtLeastOnce, payload);
        p.pkid = self.next_pkid();
        rumqttc::Packet::Publish(p)
    }

    /// SUBSCRIBE at QoS 1; returns the SUBACK's codes.
    pub async fn subscribe(&mut self, filters: &[String]) -> Vec<rumqttc::SubscribeReasonCode> {
        let mut sub = rumqttc::Subscribe::new_many(
            filters
                .iter()
                .map(|f| rumqttc::SubscribeFilter::new(f.clone(), QoS::AtLeastOnce)),
        );
        sub.pkid = self.next_pkid();
        self.send(rumqttc::Packet::Subscribe(sub)).await;
        loop {
            match self.recv(CONNECT_TIMEOUT).await {
                Some(rumqttc::Packet::SubAck(ack)) => return ack.return_codes,
                Some(_) => continue,
                None => panic!("no SUBACK"),
            }
        }
    }

    /// The next packet; `None` on timeout or a closed socket.
    pub async fn recv(&mut self, timeout: Duration) -> Option<rumqttc::Packet> {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match rumqttc::Packet::read(&mut self.buf, MAX_PACKET) {
                Ok(p) => return Some(p),
                Err(rumqttc::Error::InsufficientBytes(_)) => {}
                Err(e) => panic!("raw read: {e}"),
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Whether the broker closed the socket within `timeout` (packets that
    /// arrive meanwhile are discarded).
    pub async fn closed_within(&mut self, timeout: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut scratch = [0u8; 4096];
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut scratch)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    }

    /// Reads for `timeout`, acknowledging every QoS 1 PUBLISH and handing
    /// its payload to `on_publish` until it returns true.
    pub async fn read_publishes(
        &mut self,
        timeout: Duration,
        mut on_publish: impl FnMut(&rumqttc::Publish) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.recv(left).await {
                Some(rumqttc::Packet::Publish(p)) => {
                    if p.qos == QoS::AtLeastOnce {
                        self.send(rumqttc::Packet::PubAck(rumqttc::PubAck::new(p.pkid)))
                            .await;
                    }
                    if on_publish(&p) {
                        return true;
                    }
                }
                Some(_) => {}
                None => return false,
            }
        }
    }
}

/// Resident memory of a process, KiB (`VmRSS` in /proc).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Raises this process's open-file limit to its hard limit (children, such
/// as ferry, inherit it); returns the new limit.
pub fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        lim.rlim_cur
    }
}

/// How often ferry's log says it connected north.
pub fn north_connects(log: &str) -> usize {
    log.matches("connected link=north").count()
}

/// A small tmpfs mounted for one test (a disk that can fill up); unmounted
/// on drop. Mounting needs root, as `.ci/run` has.
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size_mib: u64) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("ferry-tmpfs-")
            .tempdir()
            .expect("temp dir for a tmpfs");
        let path = dir.path().join("disk");
        fs::create_dir(&path).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test fills a disk: it mounts a {size_mib} MiB tmpfs and so must run as root \
             (as `bash .ci/run` does); mount said: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { path, _dir: dir }
    }

    /// Writes a file of zeros until the disk is full; returns its path.
    pub fn fill(&self) -> PathBuf {
        let ballast = self.path.join("ballast");
        let mut f = File::create(&ballast).expect("create ballast");
        let chunk = vec![0u8; 64 << 10];
        loop {
            if f.write_all(&chunk).is_err() {
                break;
            }
        }
        // What is left is smaller than a chunk: take it too.
        for _ in 0..(64 << 10) {
            if f.write_all(&[0u8; 1]).is_err() {
                break;
            }
        }
        let _ = f.sync_all();
        ballast
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
