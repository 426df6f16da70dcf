//! Operating ferry as a service: systemd's notify protocol and watchdog,
//! against the real binary with a notify socket the test binds.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use crate::support;

/// Every datagram on `socket` until `until`, with when it arrived.
fn collect(socket: &UnixDatagram, start: Instant, until: Instant) -> Vec<(Duration, String)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let now = Instant::now();
        if now >= until {
            return got;
        }
        socket
            .set_read_timeout(Some(until - now))
            .expect("set read timeout");
        match socket.recv(&mut buf) {
            Ok(len) => got.push((
                start.elapsed(),
                String::from_utf8_lossy(&buf[..len]).into_owned(),
            )),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("notify socket: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_is_fed_while_the_pipeline_answers_and_stops_when_the_writer_wedges() {
    let mosquitto = support::Mosquitto::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
    // Checks every 250 ms, each part given 500 ms to answer; the writer
    // wedges at its first request 4 s after it started.
    let wedge_at = Duration::from_millis(4000);
    let opts = support::FerryOpts::new("gw-watchdog", mosquitto.port)
        .with_env("NOTIFY_SOCKET", path.to_str().expect("utf-8 path"))
        .with_env("WATCHDOG_USEC", "1000000")
        .with_env(
            "TEST_FERRY_WEDGE_WRITER_AFTER_MS",
            &wedge_at.as_millis().to_string(),
        );
    let start = Instant::now();
    let ferry = support::Ferry::start(opts);
    let got = tokio::task::block_in_place(|| {
        collect(&socket, start, start + wedge_at + Duration::from_secs(5))
    });
    let log = ferry.log();
    let summary = format!("{got:?}\n--- ferry log ---\n{}", ferry.log_tail());

    let ready = got.iter().position(|(_, m)| m == "READY=1");
    assert!(ready.is_some(), "no READY=1: {summary}");
    let fed: Vec<Duration> = got
        .iter()
        .filter(|(_, m)| m == "WATCHDOG=1")
        .map(|(at, _)| *at)
        .collect();
    assert!(
        fed.iter().filter(|at| **at < wedge_at).count() >= 3,
        "the watchdog was not fed before the wedge: {summary}"
    );
    assert!(
        got.iter()
            .any(|(_, m)| m.starts_with("STATUS=backlog: 0 uplinks, 0 downlinks")),
        "no STATUS= with the backlog: {summary}"
    );
    // The wedge takes effect at the first ping after 4 s (within 250 ms),
    // and one check already under way may still feed: from 5.5 s on,
    // nothing.
    let quiet_from = wedge_at + Duration::from_millis(1500);
    assert!(
        fed.iter().all(|at| *at < quiet_from),
        "the watchdog was fed after the writer wedged: {summary}"
    );
    assert!(
        log.contains("the systemd watchdog is not fed") && log.contains("store writer"),
        "no WARN naming the store writer: {summary}"
    );
}
