//! `ferry dlq purge --older-than` with ages the clock cannot count, and
//! every command writing into a pipe whose reader has gone.

use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use super::{dead_letters, lone_ferry};
use crate::ops::{cli, cli_json};
use crate::support::{boot_id, ferry_command, Device};

/// What a shell shows for a command SIGPIPE cut off (`ls | head`).
const STDOUT_CLOSED: i32 = 141;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_older_than_the_clock_can_count_exits_64_and_deletes_nothing() {
    let ferry = lone_ferry("gw-purge-wrap");
    let device = Device::connect(ferry.south_port, "press-1").await;
    dead_letters(&ferry, &device, 3).await;
    for age in [
        // Wrapped into a cutoff in the future: every dead letter went.
        "213503982334d",
        // Printed a cutoff in year -219403622.
        "99999999999999d",
        // Just past what i64 milliseconds hold, and just inside it (but
        // before the epoch).
        "106751991168d",
        "106751991167d",
        // Past u64.
        "18446744073709551615s",
        "99999999999999999999d",
        // Before 1970, however it is written.
        "1000000h",
    ] {
        let (code, out, err) = cli(&ferry.config_path, &["dlq", "purge", "--older-than", age]);
        assert_eq!(code, Some(64), "--older-than {age}: {out}{err}");
        assert!(
            err.contains("--older-than") && err.trim().lines().count() == 1,
            "--older-than {age}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(out, "", "--older-than {age}");
        assert_eq!(
            ferry.query_i64("SELECT count(*) FROM dead_letter", []),
            3,
            "--older-than {age} deleted dead letters"
        );
    }
    // The longest age that reaches back to 1970 or later still works.
    let kept = cli_json(&ferry, &["dlq", "purge", "--older-than", "20000d"]);
    assert_eq!(kept["purged"], 0, "{kept}");
    std::thread::sleep(Duration::from_millis(1100));
    let gone = cli_json(&ferry, &["dlq", "purge", "--older-than", "1s"]);
    assert_eq!(gone["purged"], 3, "{gone}");
    assert_eq!(cli_json(&ferry, &["dlq", "list"]), json!([]));
}

/// `ferry ARGS… --config FILE` with stdout a pipe whose reader closed
/// before the command started: (exit code, stderr).
fn into_closed_pipe(config: &Path, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = ferry_command()
        .args(args)
        .arg("--config")
        .arg(config)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("run ferry {args:?}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Like [`into_closed_pipe`], the reader closing after the first line, as
/// `| head -1` does: (exit code, that line, stderr).
fn into_head(config: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut child = ferry_command()
        .args(args)
        .arg("--config")
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run ferry {args:?}: {e}"));
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("the first line");
    let out = child.wait_with_output().expect("wait for ferry");
    (
        out.status.code(),
        first,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_every_cli_command_quietly_with_141() {
    let ferry = lone_ferry("gw-epipe");
    let device = Device::connect(ferry.south_port, "press-2").await;
    let id = format!("{}-pipe", boot_id());
    device.publish_envelope("t", &id, json!({"v": 1})).await;
    // Far more than a pipe holds (64 KiB), as a table and as JSON.
    dead_letters(&ferry, &device, 1000).await;
    let list = cli_json(&ferry, &["dlq", "list"]);
    let rows = list.as_array().expect("an array");
    let first = rows[0]["id"].as_i64().expect("an id").to_string();
    let (code, table, _) = cli(&ferry.config_path, &["dlq", "list"]);
    assert_eq!(code, Some(0));
    assert!(table.len() > 64 << 10, "{} bytes", table.len());

    let commands: [&[&str]; 8] = [
        &["dlq", "list"],
        &["dlq", "list", "--json"],
        &["dlq", "show", &first],
        &["trace", "press-2", &id],
        &["trace", "press-2", &id, "--json"],
        &["status"],
        &["status", "--json"],
        &["check-config"],
    ];
    for args in commands {
        let (code, err) = into_closed_pipe(&ferry.config_path, args);
        assert_eq!(code, Some(STDOUT_CLOSED), "ferry {args:?}: {err}");
        assert!(err.is_empty(), "ferry {args:?} said: {err}");
    }
    for args in [&["dlq", "list"][..], &["dlq", "list", "--json"][..]] {
        let (code, first, err) = into_head(&ferry.config_path, args);
        assert!(!first.is_empty(), "ferry {args:?} printed nothing");
        assert_eq!(code, Some(STDOUT_CLOSED), "ferry {args:?}: {err}");
        assert!(!err.contains("panicked"), "ferry {args:?}: {err}");
        assert!(err.is_empty(), "ferry {args:?} said: {err}");
    }
    // A change whose report nobody reads is still made.
    std::thread::sleep(Duration::from_millis(1100));
    let (code, err) = into_closed_pipe(&ferry.config_path, &["dlq", "purge", "--older-than", "1s"]);
    assert_eq!(code, Some(STDOUT_CLOSED), "{err}");
    assert_eq!(ferry.query_i64("SELECT count(*) FROM dead_letter", []), 0);
}
