//! The Python examples (`examples/python/device.py` and `backend.py`) run
//! as written, with Debian's `/usr/bin/python3` and python3-paho-mqtt,
//! against the real gateway and a real Mosquitto upstream: readings stored
//! once and delivered, a device killed before its `stored` receipt
//! resending the same msg_id, a downlink confirmed and `delivered`, two
//! backends on a shared subscription splitting the work, the device's last
//! will telling the gateway it went, a password over TLS and a client
//! certificate, paho-mqtt 2.x over MQTT 5 (from the wheel at the top of the
//! repository), and bad arguments. The scripts print one JSON line per
//! event; the tests read those, the backend's SQLite file and ferry's
//! store. [`Script`] and [`Setup`] serve `examples_c` too.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::ops::cli_json;
use crate::support::proc::{kill_and_reap, signal, wait_exit};
use crate::support::{free_port, Ferry, FerryOpts, Mode, Mosquitto, Pki};

pub(crate) const PYTHON: &str = "/usr/bin/python3";
const PAHO: &str = "/usr/lib/python3/dist-packages/paho/mqtt/client.py";
/// paho-mqtt 2.x, as the wheel PyPI has (Python imports from it as it is).
const PAHO_2_WHEEL: &str = "tests/fixtures/paho_mqtt-2.2.0-py3-none-any.whl";
pub(crate) const SECS_10: Duration = Duration::from_secs(10);

/// One of the example scripts, running; SIGKILLed on drop.
pub(crate) struct Script {
    name: String,
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every event printed so far, in order.
    pub(crate) seen: Vec<Value>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

/// Debian's python3 with paho-mqtt, or a failure saying how to get it.
pub(crate) fn require_python() {
    assert!(
        Path::new(PYTHON).is_file() && Path::new(PAHO).is_file(),
        "the Python examples need Debian's python3 with paho-mqtt ({PAHO} is missing): \
         install it with `apt-get install -y python3-paho-mqtt` (or run ./scripts/test.sh, \
         which does)"
    );
}

impl Script {
    /// Starts `examples/python/{script}.py` with `args`, on Debian's paho
    /// or on the one `paho` (a directory or a wheel) holds. A deprecation
    /// warning is an error.
    pub(crate) fn start(script: &str, args: &[&str], paho: Option<&Path>) -> Script {
        require_python();
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/python")
            .join(format!("{script}.py"));
        let mut cmd = Command::new(PYTHON);
        cmd.args(["-W", "error::DeprecationWarning"])
            .arg(&path)
            .args(args)
            .env_remove("PYTHONPATH")
            .env_remove("PYTHONHOME")
            .env("PYTHONDONTWRITEBYTECODE", "1");
        if let Some(paho) = paho {
            cmd.env("PYTHONPATH", paho);
        }
        Script::spawn(format!("{script}.py {}", args.join(" ")), cmd)
    }

    /// Starts `cmd`, a program printing one JSON event per line.
    pub(crate) fn spawn(name: String, mut cmd: Command) -> Script {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let (lines, stderr) = crate::support::proc::read_output(&mut child);
        Script {
            name,
            child,
            lines,
            seen: Vec::new(),
            stderr: Some(stderr),
        }
    }

    /// Reads events until one satisfies `done`, and returns it; panics
    /// after `timeout` with what it printed.
    pub(crate) async fn until(
        &mut self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv()).await;
            match line.map(|l| l.map(|l| serde_json::from_str(&l).unwrap_or(Value::String(l)))) {
                Ok(Some(event)) => {
                    assert!(
                        event.is_object(),
                        "{} printed a line that is no event: {event}",
                        self.name
                    );
                    self.seen.push(event.clone());
                    if done(&event) {
                        return event;
                    }
                }
                Ok(None) | Err(_) => {
                    let err = self.stop_and_stderr();
                    panic!(
                        "{}: no {what} within {timeout:?}; it printed:\n{}\n--- stderr ---\n{err}",
                        self.name,
                        self.seen
                            .iter()
                            .map(Value::to_string)
                            .collect::<Vec<_>>()
                            .join("\n")
                    );
                }
            }
        }
    }

    /// The first `name` event: one already read, or the next to come.
    pub(crate) async fn first(&mut self, name: &str) -> Value {
        if let Some(e) = self.seen.iter().find(|e| e["event"] == name) {
            return e.clone();
        }
        self.until(name, SECS_10, |e| e["event"] == name).await
    }

    /// Reads events until `event` named `name` has come `n` times.
    pub(crate) async fn until_count(
        &mut self,
        name: &str,
        n: usize,
        timeout: Duration,
        pick: impl Fn(&Value) -> bool,
    ) {
        let already = self
            .seen
            .iter()
            .filter(|e| e["event"] == name && pick(e))
            .count();
        let mut count = already;
        if count >= n {
            return;
        }
        let what = format!("{n} {name} events");
        let deadline = Instant::now() + timeout;
        while count < n {
            let left = deadline.saturating_duration_since(Instant::now());
            self.until(&what, left, |e| e["event"] == name && pick(e))
                .await;
            count += 1;
        }
    }

    /// The msg_ids of the `name` events seen so far (one per event).
    pub(crate) fn msg_ids(&self, name: &str, pick: impl Fn(&Value) -> bool) -> Vec<String> {
        self.seen
            .iter()
            .filter(|e| e["event"] == name && pick(e))
            .filter_map(|e| e["msg_id"].as_str().map(str::to_string))
            .collect()
    }

    /// Every event printed so far, read now without waiting (those read
    /// before included).
    pub(crate) fn events_now(&mut self) -> Vec<Value> {
        while let Ok(line) = self.lines.try_recv() {
            self.seen
                .push(serde_json::from_str(&line).unwrap_or(Value::String(line)));
        }
        self.seen.clone()
    }

    /// SIGKILL: nothing of its shutdown runs (no `online: false` but the will).
    pub(crate) fn kill(&mut self) {
        kill_and_reap(&mut self.child);
    }

    /// SIGTERM, and its exit within 10 s; panics if it did not exit cleanly.
    pub(crate) async fn stop(mut self) -> Vec<Value> {
        signal(&self.child, libc::SIGTERM);
        self.until("stopped", SECS_10, |e| e["event"] == "stopped")
            .await;
        let status = tokio::task::block_in_place(|| {
            wait_exit(&mut self.child, SECS_10);
            self.child.try_wait()
        });
        assert!(
            matches!(status, Ok(Some(s)) if s.success()),
            "{} exited with {status:?}",
            self.name
        );
        std::mem::take(&mut self.seen)
    }

    /// Waits for it to exit by itself (`--exit-when-done`), within `timeout`.
    pub(crate) async fn exits(&mut self, timeout: Duration) {
        self.until("stopped", timeout, |e| e["event"] == "stopped")
            .await;
        let exited = tokio::task::block_in_place(|| wait_exit(&mut self.child, SECS_10));
        assert!(exited, "{} did not exit after it stopped", self.name);
    }

    fn stop_and_stderr(&mut self) -> String {
        kill_and_reap(&mut self.child);
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

/// An upstream Mosquitto, the gateway (embedded mode) and a temp dir for
/// the scripts' data.
pub(crate) struct Setup {
    upstream: Mosquitto,
    pub(crate) ferry: Ferry,
    dir: tempfile::TempDir,
    /// Where the scripts take paho-mqtt from, if not Debian's.
    paho: Option<PathBuf>,
}

impl Setup {
    pub(crate) fn start(gateway: &str, mode: Mode) -> Setup {
        Setup::start_with(gateway, |o| o.in_mode(mode))
    }

    /// [`Setup::start`] on options `change` made.
    fn start_with(gateway: &str, change: impl FnOnce(FerryOpts) -> FerryOpts) -> Setup {
        let upstream = Mosquitto::start();
        let ferry = Ferry::start(change(FerryOpts::new(gateway, upstream.port)));
        let dir = tempfile::Builder::new()
            .prefix("ferry-py-")
            .tempdir()
            .expect("temp dir");
        Setup {
            upstream,
            ferry,
            dir,
            paho: None,
        }
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// backend.py on the upstream broker, `extra` args added; returns once
    /// it is subscribed.
    pub(crate) async fn backend(&self, extra: &[&str]) -> Script {
        let port = self.upstream.port.to_string();
        let db = self.path("backend.db");
        let mut args = vec![
            "--port",
            &port,
            "--gateway",
            &self.ferry.gateway,
            "--db",
            &db,
            "--receipt-timeout",
            "1",
        ];
        args.extend_from_slice(extra);
        let mut backend = Script::start("backend", &args, self.paho.as_deref());
        backend
            .until("online", SECS_10, |e| e["event"] == "online")
            .await;
        backend
    }

    /// device.py as `id` on `port`, `extra` args added.
    fn device_on(&self, port: u16, id: &str, extra: &[&str]) -> Script {
        let port = port.to_string();
        let data = self.path("devices");
        let mut args = vec![
            "--port",
            &port,
            "--id",
            id,
            "--data-dir",
            &data,
            "--interval",
            "0",
            "--receipt-timeout",
            "1",
        ];
        args.extend_from_slice(extra);
        Script::start("device", &args, self.paho.as_deref())
    }

    fn device(&self, id: &str, extra: &[&str]) -> Script {
        self.device_on(self.ferry.south_port, id, extra)
    }

    /// The backend's SQLite file.
    fn backend_db(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(self.path("backend.db")).expect("open backend.db");
        conn.busy_timeout(SECS_10).expect("busy timeout");
        conn
    }

    /// (msg_id, consumer) of each uplink the backend committed for `device`.
    pub(crate) fn committed(&self, device: &str) -> Vec<(String, String)> {
        let db = self.backend_db();
        let mut q = db
            .prepare("SELECT msg_id, consumer FROM uplink WHERE device = ?1 ORDER BY seq")
            .expect("prepare");
        q.query_map([device], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query")
            .map(|r| r.expect("row"))
            .collect()
    }

    /// How many uplinks of `device` ferry's store holds.
    fn stored(&self, device: &str) -> i64 {
        self.ferry
            .query_i64("SELECT count(*) FROM uplink WHERE device = ?1", [device])
    }
}

pub(crate) fn is(event: &Value, name: &str, status: &str) -> bool {
    event["event"] == name && event["status"] == status
}

pub(crate) fn set(ids: &[String]) -> HashSet<String> {
    ids.iter().cloned().collect()
}

/// Stops a process (SIGSTOP) or lets it go on (SIGCONT).
fn pause(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of ferry, a child of this test not yet reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

both_modes!(readings_are_stored_once_acked_after_commit_and_delivered);

/// Against the embedded broker, and behind a site Mosquitto (external mode).
async fn readings_are_stored_once_acked_after_commit_and_delivered(mode: Mode) {
    let s = Setup::start("gw-py-up", mode);
    let backend = s.backend(&[]).await;
    let mut device = s.device("py-press-1", &["--send", "5"]);
    device
        .until_count("receipt", 5, SECS_10, |e| e["status"] == "delivered")
        .await;
    let journaled = device.msg_ids("journaled", |_| true);
    assert_eq!(journaled.len(), 5, "{:?}", device.seen);
    // stored before delivered, for each reading.
    for id in &journaled {
        let receipts: Vec<&Value> = device
            .seen
            .iter()
            .filter(|e| e["event"] == "receipt" && e["msg_id"] == id.as_str())
            .collect();
        assert_eq!(receipts[0]["status"], "stored", "{id}: {receipts:?}");
    }
    let device_seen = device.stop().await;
    let backend_seen = backend.stop().await;

    let committed = s.committed("py-press-1");
    let ids: Vec<String> = committed.iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(ids, journaled, "committed in seq order, each once");
    let fresh = backend_seen
        .iter()
        .filter(|e| e["event"] == "uplink" && e["duplicate"] == false)
        .count();
    assert_eq!(fresh, 5, "{backend_seen:?}");
    assert_eq!(s.stored("py-press-1"), 5);
    assert!(
        device_seen.iter().any(|e| e["event"] == "online"),
        "{device_seen:?}"
    );
}

/// North batches (`north.batch_max` > 1): the example backend reads the
/// arrays, commits each reading once and acks them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readings_sent_north_in_batches_are_stored_once_and_delivered() {
    let s = Setup::start_with("gw-py-batch", |o| {
        o.with(|c| {
            c.north.batch_max = 20;
            c.north.batch_linger_ms = 300;
        })
    });
    let backend = s.backend(&[]).await;
    let mut device = s.device("py-press-b", &["--send", "10"]);
    device
        .until_count("receipt", 10, SECS_10, |e| e["status"] == "delivered")
        .await;
    let journaled = device.msg_ids("journaled", |_| true);
    device.stop().await;
    let backend_seen = backend.stop().await;
    let uplinks: Vec<&Value> = backend_seen
        .iter()
        .filter(|e| e["event"] == "uplink")
        .collect();
    assert!(
        !uplinks.is_empty() && uplinks.iter().all(|e| e["batch"] == true),
        "{backend_seen:?}"
    );
    let committed = s.committed("py-press-b");
    let ids: Vec<String> = committed.iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(ids, journaled, "committed in seq order, each once");
    assert_eq!(s.stored("py-press-b"), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_killed_before_it_could_send_resends_its_journal_after_a_restart() {
    let s = Setup::start("gw-py-journal", Mode::Embedded);
    let backend = s.backend(&[]).await;
    // No gateway where it looks: the readings go to the journal and wait.
    let mut first = s.device_on(free_port(), "py-press-2", &["--send", "3"]);
    first.until_count("journaled", 3, SECS_10, |_| true).await;
    // And it says it cannot connect, rather than nothing.
    let failed = first
        .until("connect_failed", SECS_10, |e| {
            e["event"] == "connect_failed"
        })
        .await;
    assert_eq!(failed["host"], "127.0.0.1", "{failed}");
    let journaled = first.msg_ids("journaled", |_| true);
    first.kill();

    let mut again = s.device("py-press-2", &["--exit-when-done"]);
    let started = again
        .until("started", SECS_10, |e| e["event"] == "started")
        .await;
    let pending: Vec<String> = serde_json::from_value(started["pending"].clone()).expect("pending");
    assert_eq!(set(&pending), set(&journaled), "{started}");
    again.exits(SECS_10).await;
    assert_eq!(set(&again.msg_ids("sent", |_| true)), set(&journaled));
    assert!(
        again.msg_ids("journaled", |_| true).is_empty(),
        "no new msg_id"
    );
    let stored = again.msg_ids("receipt", |e| e["status"] == "stored");
    assert_eq!(set(&stored), set(&journaled), "{:?}", again.seen);

    wait_committed(&s, "py-press-2", 3).await;
    backend.stop().await;
    let committed: Vec<String> = s
        .committed("py-press-2")
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    assert_eq!(set(&committed), set(&journaled));
    assert_eq!(s.stored("py-press-2"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_killed_with_its_publish_in_flight_resends_the_same_msg_id_and_it_is_stored_once()
{
    let s = Setup::start("gw-py-inflight", Mode::Embedded);
    let backend = s.backend(&[]).await;
    // Two readings 2 s apart: the first one's receipt comes long before.
    let mut first = s.device("py-press-3", &["--send", "2", "--interval", "2"]);
    let one = first
        .until("the first stored", SECS_10, |e| is(e, "receipt", "stored"))
        .await;
    // The gateway stops reading; the second reading is journaled and
    // published into its socket, and the device dies without a receipt.
    let pid = s.ferry.pid().expect("ferry runs");
    pause(pid, libc::SIGSTOP);
    let sent = first
        .until("the second send", SECS_10, |e| {
            e["event"] == "sent" && e["msg_id"] != one["msg_id"]
        })
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.kill();
    pause(pid, libc::SIGCONT);
    let second = sent["msg_id"].as_str().expect("msg_id").to_string();
    assert!(
        !first.msg_ids("receipt", |_| true).contains(&second),
        "the second reading had its receipt before the kill: {:?}",
        first.seen
    );

    // Whether or not the gateway took that publish, the restarted device
    // resends it with its msg_id, and it is stored and delivered once.
    let mut again = s.device("py-press-3", &["--exit-when-done"]);
    let started = again
        .until("started", SECS_10, |e| e["event"] == "started")
        .await;
    assert_eq!(started["pending"], serde_json::json!([second]), "{started}");
    again.exits(SECS_10).await;
    let answered = again.msg_ids("receipt", |_| true);
    assert!(answered.contains(&second), "{:?}", again.seen);

    wait_committed(&s, "py-press-3", 2).await;
    let backend_seen = backend.stop().await;
    let committed: Vec<String> = s
        .committed("py-press-3")
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    assert_eq!(committed.len(), 2, "{committed:?}");
    assert_eq!(committed[1], second);
    assert_eq!(s.stored("py-press-3"), 2);
    let fresh: Vec<&Value> = backend_seen
        .iter()
        .filter(|e| e["event"] == "uplink" && e["msg_id"] == second.as_str())
        .filter(|e| e["duplicate"] == false)
        .collect();
    assert_eq!(fresh.len(), 1, "{backend_seen:?}");
}

both_modes!(a_downlink_from_the_backend_is_committed_confirmed_and_reported_delivered_and_read);

async fn a_downlink_from_the_backend_is_committed_confirmed_and_reported_delivered_and_read(
    mode: Mode,
) {
    let s = Setup::start("gw-py-down", mode);
    let mut device = s.device("py-panel-1", &["--read"]);
    device
        .until("online", SECS_10, |e| e["event"] == "online")
        .await;
    let mut backend = s
        .backend(&[
            "--send",
            "py-panel-1",
            r#"{"cmd": "shift B starts 14:00"}"#,
            "--until",
            "read",
        ])
        .await;
    let journaled = backend.first("downlink_journaled").await;
    let msg_id = journaled["msg_id"].clone();

    let got = device
        .until("the downlink", SECS_10, |e| e["event"] == "downlink")
        .await;
    assert_eq!(got["msg_id"], msg_id, "{got}");
    assert_eq!(
        got["payload"], r#"{"cmd": "shift B starts 14:00"}"#,
        "{got}"
    );
    let seq = got["seq"].clone();
    let confirmed = device
        .until("confirm", SECS_10, |e| e["event"] == "confirmed")
        .await;
    assert_eq!(confirmed["upto"], seq);

    for status in ["stored", "delivered", "read"] {
        let r = backend
            .until(status, SECS_10, |e| {
                is(e, "receipt", status) && e["msg_id"] == msg_id
            })
            .await;
        assert_eq!(r["device"], "py-panel-1", "{r}");
        assert_eq!(r["seq"], seq, "{r}");
    }
    // `--send` alone: it took no uplinks and exits by itself once the
    // downlink is read.
    backend.exits(SECS_10).await;
    let backend_seen = std::mem::take(&mut backend.seen);
    assert!(
        !backend_seen.iter().any(|e| e["event"] == "uplink"),
        "a sender is no second backend: {backend_seen:?}"
    );
    device.stop().await;
    // Sent until stored, then no more.
    let sends = backend_seen
        .iter()
        .filter(|e| e["event"] == "downlink_sent")
        .count();
    assert!(sends >= 1, "{backend_seen:?}");
    let inbox: i64 = rusqlite::Connection::open(s.dir.path().join("devices/py-panel-1.db"))
        .expect("the device's db")
        .query_row("SELECT count(*) FROM inbox", [], |r| r.get(0))
        .expect("inbox");
    assert_eq!(inbox, 1, "committed once on the device");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_backends_on_a_shared_subscription_split_the_uplinks_and_commit_each_once() {
    const N: usize = 40;
    let s = Setup::start("gw-py-share", Mode::Embedded);
    let share = ["--share", "workers"];
    let b1 = s
        .backend(&[&share[..], &["--client-id", "worker-1"]].concat())
        .await;
    let b2 = s
        .backend(&[&share[..], &["--client-id", "worker-2"]].concat())
        .await;
    let mut device = s.device("py-press-4", &["--send", &N.to_string()]);
    device
        .until_count("receipt", N, Duration::from_secs(20), |e| {
            e["status"] == "delivered"
        })
        .await;
    let journaled = device.msg_ids("journaled", |_| true);
    device.stop().await;
    let seen1 = b1.stop().await;
    let seen2 = b2.stop().await;

    let committed = s.committed("py-press-4");
    let ids: Vec<String> = committed.iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(ids, journaled, "every reading once, in seq order");
    let mut by_consumer: HashMap<&str, usize> = HashMap::new();
    for (_, consumer) in &committed {
        *by_consumer.entry(consumer.as_str()).or_default() += 1;
    }
    assert!(
        by_consumer.get("worker-1") > Some(&0) && by_consumer.get("worker-2") > Some(&0),
        "both workers took some: {by_consumer:?}"
    );
    // Each message reached one worker (a duplicate, from a resend, is
    // acked again by whichever worker gets it and committed by none).
    let fresh = |seen: &[Value]| -> Vec<String> {
        seen.iter()
            .filter(|e| e["event"] == "uplink" && e["duplicate"] == false)
            .filter_map(|e| e["msg_id"].as_str().map(str::to_string))
            .collect()
    };
    let (f1, f2) = (fresh(&seen1), fresh(&seen2));
    assert!(set(&f1).is_disjoint(&set(&f2)), "{f1:?} / {f2:?}");
    assert_eq!(f1.len() + f2.len(), N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_devices_last_will_tells_the_gateway_it_is_offline() {
    // External mode: presence comes only from the devices' own status
    // messages, so offline after a SIGKILL is the will's doing.
    let s = Setup::start("gw-py-will", Mode::External);
    let mut device = s.device("py-press-5", &[]);
    device
        .until("online", SECS_10, |e| e["event"] == "online")
        .await;
    wait_online(&s.ferry, 1).await;
    device.kill();
    wait_online(&s.ferry, 0).await;

    // Started again, it says it is back.
    let mut again = s.device("py-press-5", &[]);
    again
        .until("online", SECS_10, |e| e["event"] == "online")
        .await;
    wait_online(&s.ferry, 1).await;
    // A clean stop says offline itself (no will: the disconnect is clean).
    again.stop().await;
    wait_online(&s.ferry, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_logs_in_over_tls_with_its_password_file_and_a_wrong_one_is_refused() {
    let pki = Pki::new("py-tls");
    let server = pki.server("ferry-south");
    let s = Setup::start_with("gw-py-tls", |o| {
        o.with_passwords(&[("py-press-6", "s3cret-6")]).with(|c| {
            c.south.tls.cert = server.cert.clone();
            c.south.tls.key = server.key.clone();
        })
    });
    let ca = pki.ca.display().to_string();
    let good = s.path("good.pass");
    let bad = s.path("bad.pass");
    std::fs::write(&good, "s3cret-6\n").expect("write good.pass");
    std::fs::write(&bad, "guess\n").expect("write bad.pass");

    let mut wrong = s.device("py-press-6", &["--cafile", &ca, "--password-file", &bad]);
    let refused = wrong.first("refused").await;
    wrong.kill();
    assert!(
        !wrong.seen.iter().any(|e| e["event"] == "online"),
        "{:?}",
        wrong.seen
    );

    let backend = s.backend(&[]).await;
    let mut device = s.device(
        "py-press-6",
        &[
            "--cafile",
            &ca,
            "--password-file",
            &good,
            "--send",
            "1",
            "--exit-when-done",
        ],
    );
    device.exits(SECS_10).await;
    let stored = device.msg_ids("receipt", |e| e["status"] == "stored");
    assert_eq!(stored, device.msg_ids("journaled", |_| true), "{refused}");
    wait_committed(&s, "py-press-6", 1).await;
    backend.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_with_a_client_certificate_is_its_certificates_device() {
    let pki = Pki::new("py-cc");
    let server = pki.server("ferry-south");
    let s = Setup::start_with("gw-py-cc", |o| {
        o.with(|c| {
            c.south.tls.cert = server.cert.clone();
            c.south.tls.key = server.key.clone();
            c.south.tls.client_ca = pki.ca.clone();
        })
    });
    let client = pki.client("py-press-7");
    let (ca, cert, key) = (
        pki.ca.display().to_string(),
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    let tls = ["--cafile", &ca, "--certfile", &cert, "--keyfile", &key];
    let backend = s.backend(&[]).await;
    let mut device = s.device(
        "py-press-7",
        &[&tls[..], &["--send", "1", "--exit-when-done"]].concat(),
    );
    device.exits(SECS_10).await;
    assert_eq!(
        device.msg_ids("receipt", |e| e["status"] == "stored").len(),
        1
    );
    wait_committed(&s, "py-press-7", 1).await;
    backend.stop().await;

    // Another device's certificate does not make it py-press-7.
    let mut other = s.device("py-press-8", &tls);
    other.first("refused").await;
    assert_eq!(s.stored("py-press-8"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_run_on_paho_2_over_mqtt_5() {
    let wheel = Path::new(env!("CARGO_MANIFEST_DIR")).join(PAHO_2_WHEEL);
    assert!(
        wheel.is_file(),
        "{} is missing: it is paho-mqtt 2.x for this test (`pip download paho-mqtt==2.2.0 --no-deps`)",
        wheel.display()
    );
    let mut s = Setup::start("gw-py-paho2", Mode::Embedded);
    s.paho = Some(wheel);
    let v5 = ["--mqtt", "5"];
    let mut device = s.device(
        "py-panel-2",
        &[&v5[..], &["--send", "2", "--read"]].concat(),
    );
    let started = device.first("started").await;
    assert!(
        started["paho"]
            .as_str()
            .is_some_and(|v| v.starts_with("2.")),
        "{started}"
    );
    device.first("online").await;
    let mut backend = s
        .backend(&[&v5[..], &["--send", "py-panel-2", "\"open\"", "--serve"]].concat())
        .await;
    let msg_id = backend.first("downlink_journaled").await["msg_id"].clone();
    device
        .until_count("receipt", 2, SECS_10, |e| e["status"] == "delivered")
        .await;
    let got = device.first("downlink").await;
    assert_eq!(got["msg_id"], msg_id, "{got}");
    backend
        .until("read", SECS_10, |e| {
            is(e, "receipt", "read") && e["msg_id"] == msg_id
        })
        .await;
    device.stop().await;
    backend.stop().await;
    assert_eq!(s.committed("py-panel-2").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_get_one_line_and_a_failing_exit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().display().to_string();
    let cases: [(&str, &[&str], &str); 4] = [
        ("device", &["--id", "a/b"], "is not a device id"),
        (
            "device",
            &[
                "--id",
                "d",
                "--data-dir",
                &data,
                "--password-file",
                "/nonexistent",
            ],
            "--password-file /nonexistent",
        ),
        (
            "device",
            &["--id", "d", "--data-dir", &data, "--cafile", "/nonexistent"],
            "TLS (--cafile /nonexistent",
        ),
        ("backend", &["--send", "d+", "x"], "is not an id"),
    ];
    for (script, args, says) in cases {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/python/{script}.py"));
        let mut child = Command::new(PYTHON)
            .arg(path)
            .args(args)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start python");
        let exited = tokio::task::block_in_place(|| wait_exit(&mut child, SECS_10));
        assert!(exited, "{script}.py {args:?} did not exit");
        let out = child.wait_with_output().expect("output");
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("");
        assert!(!out.status.success(), "{script}.py {args:?}: {err}");
        assert!(
            last.contains(says) && !err.contains("Traceback"),
            "{script}.py {args:?}: {err}"
        );
    }
}

/// Waits until `ferry status` counts `n` devices online.
async fn wait_online(ferry: &Ferry, n: u64) {
    let deadline = Instant::now() + SECS_10;
    loop {
        let status = cli_json(ferry, &["status"]);
        if status["devices_online"] == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not {n} devices online within {SECS_10:?}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the backend committed `n` uplinks of `device`.
pub(crate) async fn wait_committed(s: &Setup, device: &str, n: usize) {
    let deadline = Instant::now() + SECS_10;
    while s.committed(device).len() < n {
        assert!(
            Instant::now() < deadline,
            "the backend committed {:?} of {device}, not {n}",
            s.committed(device)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
