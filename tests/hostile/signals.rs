//! Signals that come while ferry starts: SIGHUP (a `systemctl reload` right
//! after a start, a logrotate postrotate) never kills it, and is applied
//! once the part it reloads is up; SIGTERM shuts it down cleanly. Before,
//! the handlers were installed after the store opened, and a SIGHUP in that
//! window ended the process.
//!
//! "0 ms" is the process's first instruction (the harness waits until it
//! holds SIGHUP, and fails if that is only after the store opened): before
//! it, for about a millisecond after exec, the kernel and the dynamic
//! loader run, where no program can handle a signal. Under systemd a
//! `reload` waits for the start job (`Type=notify`) anyway.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use crate::support::access::{Access, AuthMode};
use crate::support::{Ferry, FerryOpts, Mosquitto};

/// Tries, each sending the signal a little later after the spawn.
const TRIES: u32 = 20;

/// When try `i` signals: 0 to 50 ms after the spawn.
fn delay(i: u32) -> Duration {
    Duration::from_micros(u64::from(i) * 50_000 / u64::from(TRIES - 1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_while_ferry_starts_never_kills_it() {
    let access = Access::new(AuthMode::Password);
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start(access.opts(FerryOpts::new("gw-hup", mq.port), &["hup-1"]));
    for i in 0..TRIES {
        // Panics, naming the signal, if ferry exits before it serves.
        ferry.restart_signalled(libc::SIGHUP, delay(i));
        assert!(ferry.is_running(), "try {i} ({:?})", delay(i));
        // And it serves: the device's password is checked and taken.
        access
            .connect(ferry.south_port, "hup-1", access.connect_packet("hup-1"))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_before_the_password_file_is_watched_is_applied() {
    let access = Access::new(AuthMode::Password);
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start(access.opts(FerryOpts::new("gw-hup2", mq.port), &["hup-2"]));
    let mut applied = 0;
    for i in 0..TRIES {
        let before = reloads(&ferry);
        ferry.restart_signalled(libc::SIGHUP, delay(i));
        // A SIGHUP before the file was read needs no reload (the file read
        // is the new one); one after it is applied by a reload.
        tokio::time::sleep(Duration::from_millis(200)).await;
        applied += reloads(&ferry) - before;
        assert!(
            reloads(&ferry) - before <= 1,
            "try {i}: applied once at most"
        );
    }
    assert!(
        applied >= 1,
        "no SIGHUP in {TRIES} tries came after the password file was read\n{}",
        ferry.log_tail()
    );
}

fn reloads(ferry: &Ferry) -> usize {
    ferry
        .log()
        .matches("event=\"password_file_reloaded\"")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_while_ferry_starts_shuts_it_down_cleanly() {
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new("gw-term", mq.port));
    for i in 0..TRIES {
        let status = ferry.restart_until_exit(libc::SIGTERM, delay(i), Duration::from_secs(20));
        let status = status.unwrap_or_else(|| panic!("try {i}: still running 20 s after SIGTERM"));
        assert_eq!(
            (status.code(), status.signal()),
            (Some(0), None),
            "try {i} ({:?}): {status}\n{}",
            delay(i),
            ferry.log_tail()
        );
    }
}
