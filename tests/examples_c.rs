//! The C example (`examples/c/device.c`, on libmosquitto and cJSON),
//! compiled with the system's `cc` and run against the real gateway, with
//! `examples/python/backend.py` as its backend: readings stored and
//! delivered, a downlink committed and confirmed, and a journal resent with
//! the same msg_ids after the device was killed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::examples_python::{is, set, wait_committed, Script, Setup, SECS_10};
use crate::support::proc::wait_exit;
use crate::support::{free_port, Mode};

const HEADERS: [&str; 2] = ["/usr/include/mosquitto.h", "/usr/include/cjson/cJSON.h"];

/// Compiles the example into `dir` (warnings are errors); its path.
fn build(dir: &Path) -> PathBuf {
    for header in HEADERS {
        assert!(
            Path::new(header).is_file(),
            "the C example needs {header}: install `apt-get install -y libmosquitto-dev \
             libcjson-dev` (or run ./scripts/test.sh, which does)"
        );
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/c/device.c");
    let binary = dir.join("c-device");
    let out = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&binary)
        .arg(&source)
        .args(["-lmosquitto", "-lcjson"])
        .output()
        .unwrap_or_else(|e| panic!("run cc (`apt-get install -y gcc`): {e}"));
    assert!(
        out.status.success(),
        "cc {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    binary
}

/// The C device as `id` on `port`, with `extra` args.
fn device(s: &Setup, binary: &Path, port: u16, id: &str, extra: &[&str]) -> Script {
    let data = s.path("c-data");
    std::fs::create_dir_all(&data).expect("the device's data dir");
    let mut cmd = Command::new(binary);
    cmd.args(["--port", &port.to_string(), "--id", id, "--data-dir", &data])
        .args(extra);
    Script::spawn(format!("c-device --id {id} {}", extra.join(" ")), cmd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_device_gets_its_readings_delivered_and_confirms_a_downlink() {
    let s = Setup::start("gw-c-up", Mode::Embedded);
    let binary = build(Path::new(&s.path("")));
    let port = s.ferry.south_port;
    let mut dev = device(&s, &binary, port, "c-press-1", &["--send", "3"]);
    dev.first("online").await;
    let mut backend = s
        .backend(&["--send", "c-press-1", "\"open valve 3\"", "--serve"])
        .await;
    let msg_id = backend.first("downlink_journaled").await["msg_id"].clone();

    dev.until_count("receipt", 3, SECS_10, |e| e["status"] == "delivered")
        .await;
    let journaled = dev.msg_ids("journaled", |_| true);
    assert_eq!(journaled.len(), 3, "{:?}", dev.seen);
    let got = dev.first("downlink").await;
    assert_eq!(got["msg_id"], msg_id, "{got}");
    let confirmed = dev.first("confirmed").await;
    assert_eq!(confirmed["upto"], got["seq"], "{confirmed}");
    backend
        .until("delivered", SECS_10, |e| {
            is(e, "receipt", "delivered") && e["msg_id"] == msg_id
        })
        .await;
    dev.stop().await;
    backend.stop().await;

    let committed: Vec<String> = s
        .committed("c-press-1")
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    assert_eq!(committed, journaled);
    let inbox = std::fs::read_to_string(s.path("c-data/c-press-1.inbox")).expect("inbox");
    assert_eq!(inbox.lines().count(), 1, "committed once: {inbox}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_device_killed_before_it_could_send_resends_its_journal() {
    let s = Setup::start("gw-c-journal", Mode::Embedded);
    let binary = build(Path::new(&s.path("")));
    let backend = s.backend(&[]).await;
    let mut first = device(&s, &binary, free_port(), "c-press-2", &["--send", "3"]);
    first.until_count("journaled", 3, SECS_10, |_| true).await;
    let journaled = first.msg_ids("journaled", |_| true);
    first.kill();

    let port = s.ferry.south_port;
    let mut again = device(&s, &binary, port, "c-press-2", &["--exit-when-done"]);
    let started = again.first("started").await;
    let pending: Vec<String> = serde_json::from_value(started["pending"].clone()).expect("pending");
    assert_eq!(set(&pending), set(&journaled), "{started}");
    again.exits(SECS_10).await;
    assert!(
        again.msg_ids("journaled", |_| true).is_empty(),
        "no new msg_id"
    );

    wait_committed(&s, "c-press-2", 3).await;
    backend.stop().await;
    let committed: Vec<String> = s
        .committed("c-press-2")
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    assert_eq!(set(&committed), set(&journaled));
    assert_eq!(committed.len(), 3);
}

#[test]
fn the_c_device_refuses_a_bad_id_with_its_usage() {
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = build(dir.path());
    for args in [&["--id", "a/b"][..], &["--id", "x", "--port", "0"], &[]] {
        let mut child = Command::new(&binary)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the C device");
        assert!(wait_exit(&mut child, SECS_10), "{args:?}: still running");
        let out = child.wait_with_output().expect("output");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.starts_with("usage: "), "{args:?}: {err}");
    }
    let help = Command::new(&binary)
        .arg("--help")
        .output()
        .expect("run the C device");
    let said = String::from_utf8_lossy(&help.stdout);
    assert_eq!(help.status.code(), Some(0), "--help: {said}");
    assert!(
        said.starts_with("usage: ") && said.contains("--send N"),
        "{said}"
    );
}
