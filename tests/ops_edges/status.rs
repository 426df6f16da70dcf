//! `ferry status` knows a gateway by the lock it holds on its data
//! directory, not by the name of its binary.

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::SECS_10;
use crate::ops::{cli, cli_json};
use crate::support::proc::{kill_and_reap, wait_exit};
use crate::support::{ferry_binary, ferry_command, free_port, Ferry, FerryOpts};

/// Polls `ferry status --json` until `running` is `want`; the last answer.
fn status_until(ferry: &Ferry, want: bool) -> serde_json::Value {
    let deadline = Instant::now() + SECS_10;
    loop {
        let s = cli_json(ferry, &["status"]);
        if s["running"] == want || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_run_under_another_name_is_running_until_it_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let renamed = dir.path().join("ferry-gw");
    std::fs::copy(ferry_binary(), &renamed).expect("copy the ferry binary");
    let mut ferry = Ferry::start(FerryOpts::new("gw-renamed", free_port()).with_binary(&renamed));
    let pid = ferry.pid().expect("a pid");
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert_eq!(
        comm.trim(),
        "ferry-gw",
        "the gateway runs under the copy's name"
    );

    let s = status_until(&ferry, true);
    assert_eq!(s["running"], true, "{s}");
    assert_eq!(s["pid"], pid, "{s}");
    assert_eq!(s["gateway"], "gw-renamed", "{s}");
    let (code, text, _) = cli(&ferry.config_path, &["status"]);
    assert_eq!(code, Some(0));
    assert!(
        text.starts_with(&format!("gateway: gw-renamed running (pid {pid})")),
        "{text}"
    );
    assert_eq!(ferry.admin_json("/api/status")["running"], true);

    // SIGKILL: no shutdown path runs; the pid file and status.json stay.
    ferry.kill();
    assert!(ferry.data_dir.join("ferry.pid").exists());
    assert!(ferry.data_dir.join("status.json").exists());
    let s = cli_json(&ferry, &["status"]);
    assert_eq!(s["running"], false, "{s}");
    assert_eq!(s["pid"], serde_json::Value::Null, "{s}");
    let (_, text, _) = cli(&ferry.config_path, &["status"]);
    assert!(text.contains("gateway: not running"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_the_same_data_dir_stops_naming_the_first() {
    let mut ferry = Ferry::start(FerryOpts::new("gw-claimed", free_port()));
    let pid = ferry.pid().expect("a pid");
    let mut second = ferry_command()
        .arg("run")
        .arg("--config")
        .arg(&ferry.config_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a second ferry");
    if !wait_exit(&mut second, SECS_10) {
        kill_and_reap(&mut second);
        panic!("a second gateway on the same data_dir kept running");
    }
    let out = second.wait_with_output().expect("its stderr");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("in use by another running gateway") && err.contains(&format!("pid {pid}")),
        "{err}"
    );
    assert!(ferry.is_running(), "the first gateway runs on");
    assert_eq!(status_until(&ferry, true)["pid"], pid);
}
