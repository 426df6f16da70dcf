//! Several upstream nodes (`north.endpoints`), one session at a time: two
//! real Mosquittos, a backend acking on each, and devices publishing while
//! the node ferry is on dies, or while ferry returns to the first.
//!
//! What must hold (docs/OPERATIONS.md, "Several upstream nodes"): ferry
//! moves within its reconnect backoff, every message reaches the backend
//! and every device gets `delivered` for every msg_id, and at most the
//! in-flight window arrives twice.

use super::*;

use crate::support::{logged, Pki, TlsListener};

const GATEWAY: &str = "gw-failover";
/// `north.max_inflight`: the most duplicates one device may cause per move.
const INFLIGHT: usize = 8;
const DEVICES: usize = 3;

fn endpoints(ports: &[u16]) -> Vec<String> {
    ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
}

/// ferry's config with `ports` as its upstream nodes.
fn opts(ports: &[u16], prefer_first: Option<u64>) -> FerryOpts {
    let list = endpoints(ports);
    FerryOpts::new(GATEWAY, ports[0]).with(move |c| {
        c.north.endpoints = list;
        c.north.max_inflight = INFLIGHT;
        c.north.prefer_first = prefer_first.is_some();
        c.north.prefer_first_check_s = prefer_first.unwrap_or(30);
    })
}

/// `ferry_north_endpoint_index` (-1: down).
fn endpoint_index(ferry: &Ferry) -> f64 {
    ferry.metrics().value("ferry_north_endpoint_index")
}

/// Waits until ferry is up on `north.endpoints[want]`; false after `timeout`.
async fn wait_on_endpoint(ferry: &Ferry, want: usize, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if endpoint_index(ferry) == want as f64 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

fn delivered_up(ferry: &Ferry) -> f64 {
    ferry
        .metrics()
        .value("ferry_messages_delivered_total{direction=\"up\"}")
}

/// Each device publishes `chunks` × `per_chunk` messages tagged `tag`, a
/// chunk every 20 ms: a stream, not one burst. Returns each one's msg_ids.
async fn publish_stream(
    devices: &[Device],
    boot: &str,
    tag: &str,
    chunks: usize,
    per_chunk: usize,
) -> Vec<Vec<String>> {
    let mut ids = vec![Vec::new(); devices.len()];
    for chunk in 0..chunks {
        for (d, device) in devices.iter().enumerate() {
            let sent = device
                .publish_many("t", boot, &format!("{tag}{chunk:02}-"), per_chunk)
                .await;
            ids[d].extend(sent);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ids
}

/// Everything both backends saw, until each has seen every one of `ids`.
async fn collect_north(
    backends: &mut [&mut Backend],
    ids: &[Vec<String>],
    seen: &mut Vec<NorthMessage>,
    timeout: Duration,
) {
    let want: usize = ids.iter().map(Vec::len).sum();
    let deadline = Instant::now() + timeout;
    for backend in backends.iter_mut() {
        let got = backend.drain_for(Duration::from_millis(300)).await;
        seen.extend(got);
    }
    while distinct_north(seen) < want && Instant::now() < deadline {
        for backend in backends.iter_mut() {
            let got = backend.drain_for(Duration::from_millis(100)).await;
            seen.extend(got);
        }
    }
}

/// Every message of `ids` reached a backend, and no device's were sent
/// twice more often than `moves` in-flight windows.
fn assert_nothing_lost_and_duplicates_bounded(
    devices: &[Device],
    ids: &[Vec<String>],
    seen: &[NorthMessage],
    moves: usize,
) {
    for (d, device) in devices.iter().enumerate() {
        let mine: Vec<&NorthMessage> = seen.iter().filter(|m| m.device() == device.id).collect();
        let distinct: HashSet<&str> = mine.iter().map(|m| m.msg_id()).collect();
        let missing: Vec<&String> = ids[d]
            .iter()
            .filter(|id| !distinct.contains(id.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{}: never reached a backend: {missing:?}",
            device.id
        );
        let duplicates = mine.len() - distinct.len();
        assert!(
            duplicates <= INFLIGHT * moves,
            "{}: {duplicates} duplicates at the backends, more than {moves} in-flight windows of {INFLIGHT}",
            device.id
        );
    }
}

async fn connect_devices(ferry: &Ferry, prefix: &str) -> Vec<Device> {
    let mut devices = Vec::new();
    for d in 0..DEVICES {
        devices.push(Device::connect(ferry.south_port, &format!("{prefix}-{d}")).await);
    }
    devices
}

/// Kills `mq` once ferry has had `after` more uplinks acknowledged.
async fn kill_under_traffic(ferry: &Ferry, mq: &mut Mosquitto, after: f64) -> Instant {
    let baseline = delivered_up(ferry);
    let deadline = Instant::now() + SECS_30;
    while delivered_up(ferry) < baseline + after && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    mq.kill();
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_under_traffic_moves_north_to_the_next_and_back_with_nothing_lost() {
    let mut first = Mosquitto::start();
    let mut second = Mosquitto::start();
    // No prefer_first: the way back here is the second node dying.
    let ferry = Ferry::start(opts(&[first.port, second.port], None));
    let mut on_first = Backend::connect_auto_ack(first.port, GATEWAY).await;
    let mut on_second = Backend::connect_auto_ack(second.port, GATEWAY).await;
    let mut devices = connect_devices(&ferry, "fo").await;
    let boot = boot_id();
    assert!(
        wait_on_endpoint(&ferry, 0, SECS_10).await,
        "ferry starts on the first endpoint:\n{}",
        ferry.log_tail()
    );

    // The first node dies while the devices stream.
    let (mut ids, killed) = tokio::join!(
        publish_stream(&devices, &boot, "a", 20, 10),
        kill_under_traffic(&ferry, &mut first, 30.0),
    );
    assert!(
        wait_on_endpoint(&ferry, 1, SECS_5).await,
        "ferry moves to the second endpoint within its backoff:\n{}",
        ferry.log_tail()
    );
    let moved_in = killed.elapsed();
    let mut receipts = vec![Vec::new(); DEVICES];
    assert_all_delivered(&mut devices, &ids, &mut receipts, SECS_30).await;
    let log = ferry.log();
    assert!(
        logged(&log, "north_endpoint_switched", "reason=\"failover\"") >= 1,
        "the move is logged with its reason:\n{}",
        ferry.log_tail()
    );
    let second_at = format!("127.0.0.1:{}", second.port);
    assert!(
        logged(&log, "link_connected", &second_at) >= 1,
        "link_connected names the endpoint:\n{}",
        ferry.log_tail()
    );

    // The first comes back; then the second dies: ferry goes back.
    first.restart();
    assert!(
        on_first.wait_subacks(2, SECS_30).await,
        "the backend resubscribed on the restarted first node"
    );
    let (more, _) = tokio::join!(
        publish_stream(&devices, &boot, "b", 20, 10),
        kill_under_traffic(&ferry, &mut second, 30.0),
    );
    assert!(
        wait_on_endpoint(&ferry, 0, SECS_5).await,
        "ferry moves back to the first endpoint:\n{}",
        ferry.log_tail()
    );
    for (d, sent) in more.into_iter().enumerate() {
        ids[d].extend(sent);
    }
    assert_all_delivered(&mut devices, &ids, &mut receipts, SECS_30).await;

    let mut seen = Vec::new();
    collect_north(
        &mut [&mut on_first, &mut on_second],
        &ids,
        &mut seen,
        SECS_10,
    )
    .await;
    assert_nothing_lost_and_duplicates_bounded(&devices, &ids, &seen, 2);
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []), 0);
    assert!(
        moved_in < SECS_5,
        "moved {moved_in:?} after the kill, past the first backoff steps"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_prefer_first_ferry_returns_to_the_first_node_once_it_is_back_and_loses_nothing() {
    let first_port = crate::support::free_port();
    let second = Mosquitto::start();
    let ferry = Ferry::start(opts(&[first_port, second.port], Some(1)));
    let mut on_second = Backend::connect_auto_ack(second.port, GATEWAY).await;
    let mut devices = connect_devices(&ferry, "pf").await;
    let boot = boot_id();
    assert!(
        wait_on_endpoint(&ferry, 1, SECS_10).await,
        "with the first down, ferry runs on the second:\n{}",
        ferry.log_tail()
    );
    let mut ids = publish_stream(&devices, &boot, "a", 5, 10).await;
    let mut receipts = vec![Vec::new(); DEVICES];
    assert_all_delivered(&mut devices, &ids, &mut receipts, SECS_30).await;

    // The first comes up while the devices stream; ferry goes back to it
    // within a check or two.
    let first = Mosquitto::start_on(first_port);
    let mut on_first = Backend::connect_auto_ack(first.port, GATEWAY).await;
    let back = Instant::now();
    let (more, returned) = tokio::join!(
        publish_stream(&devices, &boot, "b", 40, 5),
        wait_on_endpoint(&ferry, 0, SECS_10),
    );
    assert!(
        returned,
        "ferry is back on the first endpoint within prefer_first_check_s:\n{}",
        ferry.log_tail()
    );
    assert!(back.elapsed() < SECS_10);
    for (d, sent) in more.into_iter().enumerate() {
        ids[d].extend(sent);
    }
    let after = publish_stream(&devices, &boot, "c", 5, 10).await;
    for (d, sent) in after.into_iter().enumerate() {
        ids[d].extend(sent);
    }
    assert_all_delivered(&mut devices, &ids, &mut receipts, SECS_30).await;
    let log = ferry.log();
    assert_eq!(
        logged(&log, "north_endpoint_switched", "reason=\"first_back\""),
        1,
        "one return, logged with its reason:\n{}",
        ferry.log_tail()
    );

    let mut seen = Vec::new();
    collect_north(
        &mut [&mut on_first, &mut on_second],
        &ids,
        &mut seen,
        SECS_10,
    )
    .await;
    assert_nothing_lost_and_duplicates_bounded(&devices, &ids, &seen, 1);
    assert!(
        seen.iter().any(|m| m.msg_id().contains("-c")),
        "the last messages went north"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE state <> 'delivered'", []),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_node_that_accepts_tcp_but_no_session_is_tried_less_and_less_often() {
    // Accepts every connection and closes it at once: the TCP check says
    // "back", the MQTT session never comes up.
    let liar = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let liar_port = liar.local_addr().unwrap().port();
    let accepting = tokio::spawn(async move {
        while let Ok((socket, _)) = liar.accept().await {
            drop(socket);
        }
    });
    let second = Mosquitto::start();
    let ferry = Ferry::start(opts(&[liar_port, second.port], Some(1)));
    let mut on_second = Backend::connect_auto_ack(second.port, GATEWAY).await;
    let mut devices = connect_devices(&ferry, "lf").await;
    assert!(
        wait_on_endpoint(&ferry, 1, SECS_10).await,
        "ferry runs on the second:\n{}",
        ferry.log_tail()
    );

    // Checks every 1 s would leave the working link 8 times in 8 s; with
    // the interval doubling after each failed return (1, 2, 4 s) it is 3.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let leaves = logged(&ferry.log(), "link_leaving_for_first_endpoint", "");
    assert!(
        (2..=4).contains(&leaves),
        "{leaves} returns to a first node that never holds in 8 s:\n{}",
        ferry.log_tail()
    );

    // Meanwhile the working node still carries everything.
    let boot = boot_id();
    let ids = publish_stream(&devices, &boot, "a", 5, 10).await;
    let mut receipts = vec![Vec::new(); DEVICES];
    assert_all_delivered(&mut devices, &ids, &mut receipts, SECS_30).await;
    let mut seen = Vec::new();
    collect_north(&mut [&mut on_second], &ids, &mut seen, SECS_10).await;
    // A return may fall in this phase too: one more window.
    assert_nothing_lost_and_duplicates_bounded(&devices, &ids, &seen, 2);
    accepting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_each_node_is_checked_against_its_own_host_name() {
    // Each node's certificate names only the host ferry has for it: the
    // move works only if the server name follows the endpoint.
    let pki = Pki::new("tls-failover");
    let listener = |issued: &crate::support::certs::Issued| TlsListener {
        ca: pki.ca.clone(),
        cert: issued.cert.clone(),
        key: issued.key.clone(),
        require_certificate: false,
    };
    let mut first = Mosquitto::start_tls(&listener(&pki.server_for("first", &["localhost"])));
    let second = Mosquitto::start_tls(&listener(&pki.server_for("second", &["127.0.0.1"])));
    let list = vec![
        format!("localhost:{}", first.tls_port.expect("a TLS listener")),
        format!("127.0.0.1:{}", second.tls_port.expect("a TLS listener")),
    ];
    let ca = pki.ca.clone();
    let ferry = Ferry::start(FerryOpts::new(GATEWAY, first.port).with(move |c| {
        c.north.endpoints = list;
        c.north.prefer_first = false;
        c.north.tls.ca = ca;
    }));
    // The backends stay on the plain listeners.
    let _on_first = Backend::connect_auto_ack(first.port, GATEWAY).await;
    let mut on_second = Backend::connect_auto_ack(second.port, GATEWAY).await;
    let mut devices = connect_devices(&ferry, "tf").await;
    assert!(
        wait_on_endpoint(&ferry, 0, SECS_10).await,
        "TLS to the first, named localhost:\n{}",
        ferry.log_tail()
    );
    first.kill();
    assert!(
        wait_on_endpoint(&ferry, 1, SECS_10).await,
        "TLS to the second, named 127.0.0.1:\n{}",
        ferry.log_tail()
    );
    let ids = publish_stream(&devices, &boot_id(), "a", 2, 10).await;
    let mut receipts = vec![Vec::new(); DEVICES];
    assert_all_delivered(&mut devices, &ids, &mut receipts, SECS_30).await;
    let mut seen = Vec::new();
    collect_north(&mut [&mut on_second], &ids, &mut seen, SECS_10).await;
    assert_nothing_lost_and_duplicates_bounded(&devices, &ids, &seen, 1);
}
