//! One gateway per store: the lock is on `ferry.db` itself, so a second
//! `ferry run` on the same data directory (with ports of its own) is
//! refused, naming the first, whatever became of `ferry.pid`; the first
//! goes on storing and delivering, its seqs its own.

use std::path::Path;
use std::process::Stdio;

use super::{distinct, stored, SECS_10};
use crate::ops::cli_json;
use crate::support::config::to_toml;
#[cfg(feature = "system-tests")]
use crate::support::powercut::PowerLoss;
use crate::support::proc::{kill_and_reap, wait_exit};
use crate::support::receipts::eventually;
use crate::support::{ferry_command, free_port, Backend, Device, Ferry, FerryOpts, Mosquitto};

/// A config for a second gateway on `ferry`'s data directory: the same
/// store, a south port of its own, no admin server (nothing else in the
/// way of its running).
fn second_config(ferry: &Ferry) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = ferry.config.clone();
    config.south.listen = format!("127.0.0.1:{}", free_port());
    config.admin.listen = String::new();
    std::fs::write(dir.path().join("ferry.toml"), to_toml(&config)).expect("write ferry.toml");
    dir
}

/// Runs a second `ferry run` on `config` with `env`: (exit code, stderr),
/// or a panic if it kept running.
fn second_run(config: &Path, env: &[(String, String)]) -> (Option<i32>, String) {
    let mut second = ferry_command()
        .arg("run")
        .arg("--config")
        .arg(config)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a second ferry");
    if !tokio::task::block_in_place(|| wait_exit(&mut second, SECS_10)) {
        kill_and_reap(&mut second);
        panic!("a second gateway on the same store kept running");
    }
    let out = second.wait_with_output().expect("its stderr");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Starts a gateway, has `break_pid_file` do its worst to `ferry.pid`,
/// starts a second on the same store and checks it is refused naming the
/// first, which goes on.
async fn a_second_gateway_is_refused_whatever_became_of_the_pid_file(
    gateway: &str,
    break_pid_file: impl Fn(&Path),
) {
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new(gateway, mq.port));
    let pid = ferry.pid().expect("a pid");
    let mut backend = Backend::connect_auto_ack(mq.port, gateway).await;
    let mut device = Device::connect(ferry.south_port, "one-1").await;
    let ids = |tag: &str| (0..5).map(|i| format!("{tag}-{i}")).collect::<Vec<_>>();
    let mut seqs = stored(&mut device, &ids("before")).await;

    break_pid_file(&ferry.data_dir);
    let second = second_config(&ferry);
    let (code, err) = second_run(&second.path().join("ferry.toml"), &[]);
    assert_eq!(code, Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("ferry: "))
        .unwrap_or_else(|| panic!("no `ferry: ` line in {err}"));
    assert!(
        line.contains("in use by another running gateway")
            && line.contains(&format!("(pid {pid})")),
        "{line}"
    );

    // The first gateway goes on: stores with seqs of its own, delivers,
    // and is the one `ferry status` sees.
    assert!(ferry.is_running(), "the first gateway runs on");
    seqs.extend(stored(&mut device, &ids("after")).await);
    assert!(distinct(&seqs), "{seqs:?}");
    assert_eq!(seqs, (1..=10).collect::<Vec<u64>>());
    eventually(SECS_10, "all ten delivered", || {
        ferry.query_i64(
            "SELECT COUNT(*) FROM uplink WHERE device = 'one-1' AND state = 'delivered'",
            [],
        ) == 10
    })
    .await;
    // The backend got each seq once (a resend keeps its seq).
    let north: std::collections::BTreeSet<u64> = backend
        .drain_for(std::time::Duration::from_millis(500))
        .await
        .iter()
        .filter_map(|m| m.seq())
        .collect();
    assert_eq!(north, (1..=10).collect(), "the seqs the backend got");
    let status = cli_json(&ferry, &["status"]);
    assert_eq!(status["running"], true, "{status}");
    assert_eq!(status["pid"], pid, "{status}");
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(DISTINCT seq) FROM uplink WHERE device = 'one-1'",
            []
        ),
        10
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_is_refused_naming_the_first_after_its_pid_file_was_deleted() {
    a_second_gateway_is_refused_whatever_became_of_the_pid_file("gw-pid-deleted", |dir| {
        std::fs::remove_file(dir.join("ferry.pid")).expect("delete ferry.pid");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_is_refused_naming_the_first_when_its_pid_file_cannot_be_opened() {
    // Run as root, a directory is what no chmod makes: unopenable as a file.
    a_second_gateway_is_refused_whatever_became_of_the_pid_file("gw-pid-dir", |dir| {
        std::fs::remove_file(dir.join("ferry.pid")).expect("delete ferry.pid");
        std::fs::create_dir(dir.join("ferry.pid")).expect("a directory named ferry.pid");
    })
    .await
}

/// The file system without locks is the power-loss shim's (built with
/// gcc): the `system-tests` feature's.
#[cfg(feature = "system-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_on_a_file_system_without_locks_is_refused_as_a_config_error() {
    let power = PowerLoss::new();
    let opts = power.on(FerryOpts::new("gw-no-locks", free_port()));
    let env = opts.env.clone();
    // Started without the fault, to write its config; then stopped.
    let mut ferry = Ferry::start(opts);
    assert!(ferry.terminate(SECS_10), "a clean stop");
    let mut env = env;
    env.push(("POWERCUT_NO_FLOCK".into(), "1".into()));
    let (code, err) = second_run(&ferry.config_path, &env);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.lines().any(|l| l.starts_with("ferry: ")
            && l.contains("cannot be locked")
            && l.contains("local file system")),
        "{err}"
    );
}
