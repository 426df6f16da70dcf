//! `ferry device`, the real binary, as a newcomer uses it against the real
//! gateway and a real Mosquitto upstream: `pub` prints `stored` then
//! `delivered` once the backend acks and exits 0; a wrong password, a
//! rejected stream and a backend's nack each end it non-zero with one line
//! saying why; `listen` prints a downlink, confirms it (the backend gets
//! `delivered`) and leaves cleanly on SIGTERM; misuse exits 64. Over TLS
//! (`tls.rs`): with the device's certificate, `--server-name` and the port
//! and TLS taken from the gateway's config.

mod tls;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::support::proc::{kill_and_reap, signal};
use crate::support::{
    boot_id, ferry_command, north_topics, write_file, Backend, BareClient, Ferry, FerryOpts,
    Mosquitto,
};

const SECS_20: Duration = Duration::from_secs(20);

/// A running `ferry device`, its stdout read line by line as it comes.
struct DeviceCli {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl DeviceCli {
    /// `ferry device ARGS`, with `stdin` written to its stdin (then closed).
    fn start(args: &[&str], stdin: Option<&str>) -> DeviceCli {
        let mut child = ferry_command()
            .arg("device")
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ferry device");
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes()).expect("write stdin");
        }
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        DeviceCli {
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    /// Lines printed so far, waiting until one holds `wanted` (panics
    /// after `timeout` with what it printed).
    async fn until_line(&mut self, wanted: &str, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            while let Ok(line) = self.lines.try_recv() {
                self.seen.push(line);
            }
            if self.seen.iter().any(|l| l.contains(wanted)) {
                return self.seen.clone();
            }
            assert!(
                Instant::now() < deadline,
                "ferry device printed no {wanted:?} within {timeout:?}: {:#?}",
                self.seen
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for it to exit: (code, stdout lines, stderr).
    async fn finish(mut self, timeout: Duration) -> (Option<i32>, Vec<String>, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                kill_and_reap(&mut self.child);
                panic!(
                    "ferry device still ran after {timeout:?}; it printed {:#?}",
                    self.seen
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let stderr = tokio::task::block_in_place(|| self.stderr.join()).unwrap_or_default();
        // The reader thread ends at EOF, once the process is gone.
        let rest = tokio::task::block_in_place(|| {
            let mut rest = Vec::new();
            while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
                rest.push(line);
            }
            rest
        });
        self.seen.extend(rest);
        (status.code(), self.seen, stderr)
    }
}

/// Runs `ferry device ARGS` to its end.
async fn device(args: &[&str], stdin: Option<&str>) -> (Option<i32>, Vec<String>, String) {
    DeviceCli::start(args, stdin).finish(SECS_20).await
}

fn json_lines(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Waits for a `status` receipt for downlink `msg_id` on the backend's
/// `receipts` subscription; with `resend`, publishes it again on `topic`
/// every half second meanwhile (the gateway may not be subscribed north
/// yet: a backend resends until `stored`, as the protocol has it).
async fn receipt_for(
    backend: &mut BareClient,
    msg_id: &str,
    status: &str,
    resend: Option<(&str, &Value)>,
) {
    let deadline = Instant::now() + SECS_20;
    while Instant::now() < deadline {
        if let Some((topic, down)) = resend {
            backend.publish(topic, down.to_string()).await;
        }
        let until = Instant::now() + Duration::from_millis(500);
        while let Some(r) = backend.next_json(until - Instant::now()).await {
            let all = match r {
                Value::Array(all) => all,
                one => vec![one],
            };
            if all
                .iter()
                .any(|r| r["msg_id"] == msg_id && r["status"] == status)
            {
                return;
            }
        }
    }
    panic!("no {status} receipt for downlink {msg_id} within {SECS_20:?}");
}

/// The receipts' statuses among `--json` lines.
fn statuses(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["event"] == "receipt")
        .map(|l| l["status"].as_str().unwrap_or("").to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pub_prints_stored_then_delivered_once_the_backend_acks_and_exits_0() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-devcli", mq.port));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-devcli").await;
    let port = ferry.south_port.to_string();
    let msg_id = format!("{}-cli", boot_id());
    let (code, out, err) = device(
        &[
            "--id",
            "press-7",
            "--port",
            &port,
            "--json",
            "pub",
            "up/alarm",
            r#"{"temp":81}"#,
            "--msg-id",
            &msg_id,
            "--wait",
            "delivered",
        ],
        None,
    )
    .await;
    assert_eq!(code, Some(0), "stdout {out:#?}, stderr {err}");
    let lines = json_lines(&out);
    assert_eq!(statuses(&lines), ["stored", "delivered"], "{out:#?}");
    let sent = lines
        .iter()
        .find(|l| l["event"] == "sent")
        .expect("a sent line");
    assert_eq!(sent["topic"], "devices/press-7/up/alarm");
    assert!(lines
        .iter()
        .all(|l| l["event"] != "receipt" || l["msg_id"] == msg_id.as_str()));
    let north = backend
        .next_message(SECS_20)
        .await
        .expect("the uplink north");
    assert_eq!(
        (north.device(), north.msg_id()),
        ("press-7", msg_id.as_str())
    );
    assert_eq!(north.body["payload"], json!({"temp": 81}));

    // Human output, a fresh msg_id, waiting for `stored` (the default).
    let (code, out, err) = device(
        &[
            "--id",
            "press-7",
            "--port",
            &port,
            "pub",
            "up/line3/temp",
            "21.5",
        ],
        None,
    )
    .await;
    assert_eq!(code, Some(0), "stdout {out:#?}, stderr {err}");
    assert!(
        out[0].starts_with("connected as press-7 to 127.0.0.1:"),
        "{out:#?}"
    );
    assert!(
        out[1].starts_with("sent msg_id=cli-")
            && out[1].ends_with(" on devices/press-7/up/line3/temp"),
        "{out:#?}"
    );
    assert!(
        out[2].starts_with("stored msg_id=cli-") && out[2].ends_with(" seq=2"),
        "{out:#?}"
    );
    assert!(err.is_empty(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_one_line_and_a_non_zero_exit_the_right_one_from_stdin_is_stored() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(
        FerryOpts::new("gw-devcli-pw", mq.port).with_passwords(&[("press-7", "right-one")]),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let wrong = write_file(dir.path(), "wrong", "wrong-one\n");
    let port = ferry.south_port.to_string();
    let wrong = wrong.to_str().expect("utf-8 path");
    let (code, out, err) = device(
        &[
            "--id",
            "press-7",
            "--port",
            &port,
            "--password-file",
            wrong,
            "pub",
            "up/a",
            "1",
        ],
        None,
    )
    .await;
    assert_eq!(code, Some(1), "stdout {out:#?}, stderr {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("ferry device: cannot connect to 127.0.0.1:"),
        "{err}"
    );
    assert!(err.contains("wrong password"), "{err}");

    // The same in MQTT 5, whose CONNACK names the reason.
    let (code, out, err) = device(
        &[
            "--id",
            "press-7",
            "--port",
            &port,
            "--mqtt",
            "5",
            "--password-file",
            wrong,
            "pub",
            "up/a",
            "1",
        ],
        None,
    )
    .await;
    assert_eq!(code, Some(1), "stdout {out:#?}, stderr {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("wrong password"), "{err}");

    // No password where one is needed: told so, not "a wrong password".
    let (code, _, err) = device(
        &["--id", "press-7", "--port", &port, "pub", "up/a", "1"],
        None,
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("the gateway asks for a password") && !err.contains("wrong password"),
        "{err}"
    );

    let (code, out, err) = device(
        &[
            "--id",
            "press-7",
            "--port",
            &port,
            "--password-stdin",
            "pub",
            "up/a",
            "1",
        ],
        Some("right-one\n"),
    )
    .await;
    assert_eq!(code, Some(0), "stdout {out:#?}, stderr {err}");
    assert!(out.iter().any(|l| l.starts_with("stored ")), "{out:#?}");

    // A password file larger than a password is refused before connecting.
    let big = write_file(dir.path(), "big", &"x".repeat(5000));
    let (code, _, err) = device(
        &[
            "--id",
            "press-7",
            "--port",
            &port,
            "--password-file",
            big.to_str().unwrap(),
            "pub",
            "up/a",
            "1",
        ],
        None,
    )
    .await;
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("more than 4096 bytes"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_stream_and_a_backend_nack_end_it_non_zero_with_the_reason() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-devcli-no", mq.port));
    let port = ferry.south_port.to_string();
    let (code, out, err) = device(
        &[
            "--id",
            "press-7",
            "--port",
            &port,
            "pub",
            "up/bad stream",
            "1",
        ],
        None,
    )
    .await;
    assert_eq!(code, Some(1), "stdout {out:#?}, stderr {err}");
    assert!(out.iter().any(|l| l.starts_with("rejected ")), "{out:#?}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(": rejected: ") && err.contains("bad stream"),
        "{err}"
    );

    let mut backend = Backend::connect(mq.port, "gw-devcli-no").await;
    let msg_id = format!("{}-nacked", boot_id());
    let cli = DeviceCli::start(
        &[
            "--id",
            "press-7",
            "--port",
            &port,
            "pub",
            "up/a",
            "1",
            "--msg-id",
            &msg_id,
            "--wait",
            "delivered",
        ],
        None,
    );
    let north = backend
        .next_message(SECS_20)
        .await
        .expect("the uplink north");
    assert_eq!(north.msg_id(), msg_id);
    backend
        .nack("press-7", &msg_id, "unknown sensor", false)
        .await;
    let (code, out, err) = cli.finish(SECS_20).await;
    assert_eq!(code, Some(1), "stdout {out:#?}, stderr {err}");
    let statuses: Vec<_> = out.iter().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(
        statuses,
        ["connected", "sent", "stored", "failed"],
        "{out:#?}"
    );
    assert_eq!(
        err.trim_end(),
        format!("ferry device: {msg_id}: failed: nacked: unknown sensor")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_prints_a_downlink_confirms_it_and_leaves_cleanly_on_sigterm() {
    let mq = Mosquitto::start();
    let gw = "gw-devcli-in";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    let north = north_topics(gw);
    let mut receipts =
        BareClient::connect(mq.port, "devcli-receipts", vec![north.receipts()]).await;
    let port = ferry.south_port.to_string();
    let msg_id = format!("{}-down", boot_id());
    let down = json!({"msg_id": msg_id, "payload": "shift B starts 14:00"});
    let topic = format!("ferry/{gw}/down/panel-1");
    receipt_for(&mut receipts, &msg_id, "stored", Some((&topic, &down))).await;

    let mut cli = DeviceCli::start(
        &["--id", "panel-1", "--port", &port, "--json", "listen"],
        None,
    );
    let lines = json_lines(&cli.until_line("confirmed", SECS_20).await);
    let inbox: Vec<_> = lines.iter().filter(|l| l["event"] == "inbox").collect();
    assert_eq!(inbox.len(), 1, "{lines:#?}");
    assert_eq!(inbox[0]["msg_id"], msg_id.as_str());
    assert_eq!(inbox[0]["seq"], 1);
    assert_eq!(inbox[0]["body"]["payload"], "shift B starts 14:00");
    let confirmed = lines.iter().find(|l| l["event"] == "confirmed").unwrap();
    assert_eq!(confirmed["upto"], 1);

    receipt_for(&mut receipts, &msg_id, "delivered", None).await;

    signal(&cli.child, libc::SIGTERM);
    let (code, out, err) = cli.finish(Duration::from_secs(5)).await;
    assert_eq!(code, Some(0), "stdout {out:#?}, stderr {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_with_a_count_stops_there_and_misuse_exits_64_in_one_short_message() {
    let mq = Mosquitto::start();
    let gw = "gw-devcli-count";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    let port = ferry.south_port.to_string();
    let receipts = vec![north_topics(gw).receipts()];
    let mut backend = BareClient::connect(mq.port, "devcli-down", receipts).await;
    let topic = format!("ferry/{gw}/down/panel-2");
    for i in 0..3 {
        let (msg_id, down) = (
            format!("n-{i}"),
            json!({"msg_id": format!("n-{i}"), "payload": i}),
        );
        receipt_for(&mut backend, &msg_id, "stored", Some((&topic, &down))).await;
    }
    let (code, out, err) = device(
        &["--id", "panel-2", "--port", &port, "listen", "--count", "2"],
        None,
    )
    .await;
    assert_eq!(code, Some(0), "stdout {out:#?}, stderr {err}");
    let inbox: Vec<_> = out.iter().filter(|l| l.starts_with("inbox ")).collect();
    assert_eq!(inbox.len(), 2, "{out:#?}");
    assert!(
        inbox[0].starts_with("inbox seq=1 msg_id=n-0 body={"),
        "{out:#?}"
    );
    assert_eq!(
        out.last().map(String::as_str),
        Some("confirmed upto=2"),
        "{out:#?}"
    );

    // The third is still there for the next listener.
    let (code, out, err) = device(
        &[
            "--id",
            "panel-2",
            "--port",
            &port,
            "listen",
            "--count",
            "2",
            "--timeout",
            "2s",
        ],
        None,
    )
    .await;
    assert_eq!(code, Some(1), "stdout {out:#?}, stderr {err}");
    assert!(
        out.iter().any(|l| l.starts_with("inbox seq=3 msg_id=n-2")),
        "{out:#?}"
    );
    assert_eq!(
        err.trim_end(),
        "ferry device: 1 of 2 inbox messages within 2s"
    );

    for misuse in [
        &["pub", "up/a", "1"][..],
        &["--id", "press-7", "pub", "up/a"],
        &["--id", "press-7", "pub", "up/a", "1", "--wait", "read"],
        &["--id", "press-7", "--port", "x", "listen"],
        &["--id", "press 7", "pub", "up/a", "1"],
        &["--id", "press-7", "pub", "alarm", "1"],
        &["--id", "press-7", "pub", "up/a", "{not json"],
        &["--id", "press-7", "--tls", "pub", "up/a", "1"],
        &["--id", "press-7", "listen", "--timeout", "0s"],
    ] {
        let (code, out, err) = device(misuse, None).await;
        assert_eq!(code, Some(64), "{misuse:?}: {out:?} {err}");
        assert!(
            err.lines().count() <= 6,
            "{misuse:?}: a short message: {err}"
        );
        assert!(
            err.starts_with("error: ") || err.starts_with("ferry device: "),
            "{misuse:?}: {err}"
        );
    }
}
