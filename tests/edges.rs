//! The edges of every input, against the real `ferry` binary: a disk that
//! fills up and frees again, a corrupt store, a publish over a megabyte,
//! ttl at its limits, keep-alive 0 and beyond the cap, CONNECTs past
//! `max_connections`, subscriptions past the limit, and the log a normal
//! disconnect leaves.

use std::process::Stdio;
use std::time::{Duration, Instant};

use ferry::ids::DeviceId;
use rumqttc::{ConnectReturnCode, Packet, SubscribeReasonCode};
use serde_json::{json, Value};

use crate::support::receipts::status;
#[cfg(feature = "system-tests")]
use crate::support::Tmpfs;
use crate::support::{
    self, boot_id, ferry_command, north_topics, Device, Ferry, FerryOpts, Mosquitto, RawMqtt,
};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

/// A gateway whose north link stays down: uplinks wait in the store.
fn lone_ferry(gateway: &str) -> Ferry {
    Ferry::start(FerryOpts::new(gateway, support::free_port()))
}

/// A gateway whose store lives on `disk` and whose north link stays down.
/// A disk that fills is a tmpfs mounted as root: its tests are the
/// `system-tests` feature's.
#[cfg(feature = "system-tests")]
fn ferry_on(disk: &Tmpfs, gateway: &str) -> Ferry {
    Ferry::start(
        FerryOpts::new(gateway, support::free_port())
            .with(|c| c.gateway.data_dir = disk.path.join("data")),
    )
}

/// Reads receipts until `done` holds or `timeout` passes.
async fn raw_receipts(
    raw: &mut RawMqtt,
    timeout: Duration,
    mut done: impl FnMut(&[Value]) -> bool,
) -> Vec<Value> {
    let mut all = Vec::new();
    raw.read_publishes(timeout, |p| {
        all.push(serde_json::from_slice(&p.payload).expect("a JSON receipt"));
        done(&all)
    })
    .await;
    all
}

#[cfg(feature = "system-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_accepted_while_the_disk_is_full_are_stored_once_it_frees_without_a_reconnect() {
    let disk = Tmpfs::mount(8);
    let ferry = ferry_on(&disk, "gw-full");
    let mut device = Device::connect(ferry.south_port, "filler").await;
    let boot = boot_id();
    for i in 0..5 {
        device
            .publish_envelope("t", &format!("{boot}-early-{i}"), json!(i))
            .await;
    }
    let early = device.receipts_until(SECS_10, |all| all.len() == 5).await;
    assert!(early.iter().all(|r| status(r) == "stored"), "{early:?}");

    let ballast = disk.fill();
    let ids: Vec<String> = (0..20).map(|i| format!("{boot}-full-{i}")).collect();
    for id in &ids {
        device
            .publish_envelope("t", id, json!({"pad": "x".repeat(2000)}))
            .await;
    }
    let during = device
        .receipts_until(Duration::from_secs(3), |all| !all.is_empty())
        .await;
    assert!(
        during.is_empty(),
        "nothing is answered while the disk is full: {during:?}"
    );
    assert!(
        ferry
            .log()
            .contains("store commit failed; the batch is held"),
        "{}",
        ferry.log_tail()
    );

    std::fs::remove_file(&ballast).expect("free the disk");
    let after = device
        .receipts_until(SECS_30, |all| all.len() == ids.len())
        .await;
    let stored: Vec<&str> = after
        .iter()
        .filter(|r| status(r) == "stored")
        .filter_map(|r| r["msg_id"].as_str())
        .collect();
    assert_eq!(stored, ids, "every message, in order, once space returned");
    assert_eq!(device.subacks(), 1, "on the same connection");
    assert!(ferry.log().contains("store commits again"));
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink", []),
        25,
        "stored once each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_store_fails_at_start_with_its_cause_in_the_last_line() {
    let mut ferry = lone_ferry("gw-corrupt");
    let mut device = Device::connect(ferry.south_port, "writer").await;
    let boot = boot_id();
    for i in 0..300 {
        device
            .publish_envelope("t", &format!("{boot}-{i}"), json!({"pad": "y".repeat(200)}))
            .await;
    }
    let got = device.receipts_until(SECS_30, |all| all.len() == 300).await;
    assert_eq!(got.len(), 300);
    assert!(ferry.terminate(SECS_10), "clean exit");

    // Everything into the main file, then damage its pages (not the header).
    let db = ferry.data_dir.join("ferry.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
        .unwrap();
    drop(conn);
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 8 * 4096);
    for b in &mut bytes[2 * 4096..6 * 4096] {
        *b = 0xa5;
    }
    std::fs::write(&db, bytes).unwrap();

    let out = ferry_command()
        .arg("run")
        .arg("--config")
        .arg(&ferry.config_path)
        .stdin(Stdio::null())
        .output()
        .expect("run ferry");
    assert_eq!(out.status.code(), Some(1), "a runtime failure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.contains("ferry.db is corrupt") && last.contains("malformed"),
        "last line: {last}\n{stderr}"
    );
    assert!(!stderr.contains("ferry running"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_over_a_megabyte_is_answered_rejected_logged_and_counted() {
    let ferry = lone_ferry("gw-huge");
    let mut raw = RawMqtt::connect(ferry.south_port, "huge", 60).await;
    raw.subscribe(&["devices/huge/ack".to_string()]).await;
    let body =
        serde_json::to_vec(&json!({"msg_id": "huge-1", "payload": "z".repeat(1_500_000)})).unwrap();
    let size = body.len();
    let publish = raw.publish("devices/huge/up/t", body);
    raw.send(publish).await;
    let small = raw.publish(
        "devices/huge/up/t",
        serde_json::to_vec(&json!({"msg_id": "small-1", "payload": 1})).unwrap(),
    );
    raw.send(small).await;
    let receipts = raw_receipts(&mut raw, SECS_30, |all| all.len() == 2).await;
    assert_eq!(receipts.len(), 2, "{receipts:?}");
    let r = &receipts[0];
    assert_eq!(status(r), "rejected", "{r}");
    assert_eq!(r["msg_id"], "huge-1", "{r}");
    let reason = r["reason"].as_str().unwrap();
    // The whole packet: its fixed header (a 3-byte length), topic and
    // packet id, and payload.
    let packet = 1 + 3 + 2 + "devices/huge/up/t".len() + 2 + size;
    assert_eq!(
        reason,
        format!(
            "too_large: {packet} bytes > 66560, the largest packet a device may send \
             (south.max_payload_bytes + 1024)"
        )
    );
    assert_eq!(status(&receipts[1]), "stored", "the device stays connected");
    let (dl_reason, raw_len): (String, i64) = ferry
        .db()
        .query_row(
            "SELECT reason, length(raw) FROM dead_letter WHERE msg_id = 'huge-1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(dl_reason, reason);
    assert_eq!(raw_len, 4096, "its head is kept, not the whole message");
    let log = ferry.log();
    assert!(
        log.contains("device_publish_oversized") && log.contains("total=1"),
        "logged and counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_at_its_edges_is_refused_or_kept_without_overflow() {
    let mq = Mosquitto::start();
    let gw = "gw-ttl";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    let mut device = Device::connect(ferry.south_port, "ttl").await;
    let max = ferry::protocol::envelope::MAX_TTL_S;
    for (id, ttl) in [
        ("i63", "9223372036854775807"),
        ("u64", "18446744073709551615"),
        ("over", &(max + 1).to_string()),
    ] {
        let body = format!(r#"{{"msg_id":"{id}","payload":1,"ttl_s":{ttl}}}"#);
        device.publish_raw(&device.up_topic("t"), body).await;
        let (r, _) = device.next_receipt_for(id, SECS_10).await;
        let r = r.unwrap_or_else(|| panic!("{id}: no receipt"));
        assert_eq!(status(&r), "rejected", "{id}: {r}");
        assert!(
            r["reason"].as_str().unwrap().contains("ttl_s must be"),
            "{r}"
        );
    }
    let body = format!(r#"{{"msg_id":"longest","payload":1,"ttl_s":{max}}}"#);
    device.publish_raw(&device.up_topic("t"), body).await;
    let (r, _) = device.next_receipt_for("longest", SECS_10).await;
    assert_eq!(r.as_ref().map(status), Some("stored"), "{r:?}");
    // On the store clock, which ttl_s counts in.
    let expires: i64 = ferry.query_i64(
        "SELECT expires_ms - (SELECT store_ms FROM store_clock) FROM uplink WHERE msg_id = 'longest'",
        [],
    );
    assert!(
        expires > 9 * 365 * 86_400_000,
        "expires in ten years, not in the past: {expires}"
    );

    // Downlinks: the same bounds, answered north.
    let mut north = RawMqtt::connect(mq.port, "ttl-north", 30).await;
    north.subscribe(&[north_topics(gw).receipts()]).await;
    for (id, ttl) in [
        ("d-u64", "18446744073709551615".to_string()),
        ("d-max", max.to_string()),
    ] {
        let body = format!(r#"{{"msg_id":"{id}","payload":1,"ttl_s":{ttl}}}"#);
        let p = north.publish(
            &north_topics(gw).down_to(&DeviceId::new("ttl").unwrap()),
            body,
        );
        north.send(p).await;
    }
    let got = raw_receipts(&mut north, SECS_10, |all| {
        all.iter().any(|r| r["msg_id"] == "d-u64") && all.iter().any(|r| r["msg_id"] == "d-max")
    })
    .await;
    let of = |id: &str| got.iter().find(|r| r["msg_id"] == id).map(status);
    assert_eq!(of("d-u64"), Some("rejected"), "{got:?}");
    assert_eq!(of("d-max"), Some("stored"), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_zero_is_accepted_and_every_keep_alive_is_capped() {
    let ferry = Ferry::start(
        FerryOpts::new("gw-keepalive", support::free_port()).with(|c| c.south.max_keep_alive_s = 5),
    );
    let (mut zero, ack) = RawMqtt::try_connect(ferry.south_port, "ka-zero", 0)
        .await
        .expect("a CONNACK for keep-alive 0");
    assert_eq!(ack.code, ConnectReturnCode::Success);
    zero.subscribe(&["devices/ka-zero/ack".to_string()]).await;
    let p = zero.publish(
        "devices/ka-zero/up/t",
        serde_json::to_vec(&json!({"msg_id": "z-1", "payload": 1})).unwrap(),
    );
    zero.send(p).await;
    let got = raw_receipts(&mut zero, SECS_10, |all| !all.is_empty()).await;
    assert_eq!(got.first().map(status), Some("stored"), "{got:?}");

    // Silent clients, one asking for no keep-alive, one for 18 hours: both
    // are held to 5 s (closed after 1.5 x 5 s of silence).
    let mut long = RawMqtt::connect(ferry.south_port, "ka-long", u16::MAX).await;
    let started = Instant::now();
    assert!(
        long.closed_within(Duration::from_secs(15)).await,
        "ka-long still open"
    );
    assert!(
        zero.closed_within(Duration::from_secs(15)).await,
        "ka-zero still open"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5),
        "closed after {waited:?}, before its keep-alive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_past_max_connections_gets_a_refusing_connack_and_a_log_line() {
    let ferry = Ferry::start(
        FerryOpts::new("gw-full-house", support::free_port()).with(|c| c.south.max_connections = 3),
    );
    let mut first = Vec::new();
    for i in 0..3 {
        first.push(RawMqtt::connect(ferry.south_port, &format!("seat-{i}"), 30).await);
    }
    let (_, ack) = RawMqtt::try_connect(ferry.south_port, "seat-3", 30)
        .await
        .expect("a CONNACK, not a closed socket");
    assert_eq!(ack.code, ConnectReturnCode::ServiceUnavailable);
    assert!(
        ferry.log().contains("CONNECT refused"),
        "{}",
        ferry.log_tail()
    );

    // A seat that frees up is taken again.
    let mut gone = first.pop().unwrap();
    gone.send(Packet::Disconnect).await;
    assert!(gone.closed_within(SECS_10).await);
    let mut seated = None;
    for _ in 0..50 {
        let (raw, ack) = RawMqtt::try_connect(ferry.south_port, "seat-3", 30)
            .await
            .unwrap();
        if ack.code == ConnectReturnCode::Success {
            seated = Some(raw);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seated.is_some(), "the freed seat was never offered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_past_the_limit_get_a_failure_code() {
    let ferry = Ferry::start(
        FerryOpts::new("gw-subs", support::free_port()).with(|c| c.south.max_subscriptions = 2),
    );
    let mut raw = RawMqtt::connect(ferry.south_port, "subs", 30).await;
    let codes = raw
        .subscribe(&[
            "devices/subs/ack".to_string(),
            "devices/subs/inbox".to_string(),
            "devices/subs/other".to_string(),
        ])
        .await;
    assert!(
        matches!(
            &codes[..],
            [
                SubscribeReasonCode::Success(_),
                SubscribeReasonCode::Success(_),
                SubscribeReasonCode::Failure
            ]
        ),
        "{codes:?}"
    );
    // A repeat of one it holds is no new subscription.
    let again = raw.subscribe(&["devices/subs/ack".to_string()]).await;
    assert!(
        matches!(&again[..], [SubscribeReasonCode::Success(_)]),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_leaving_in_every_ordinary_way_log_no_error() {
    let ferry = lone_ferry("gw-quiet");
    // A clean DISCONNECT, a dropped socket, and a takeover by the same id.
    let mut clean = RawMqtt::connect(ferry.south_port, "leaves-cleanly", 30).await;
    clean.send(Packet::Disconnect).await;
    assert!(clean.closed_within(SECS_10).await);
    drop(RawMqtt::connect(ferry.south_port, "drops-its-socket", 30).await);
    let mut old = RawMqtt::connect(ferry.south_port, "taken-over", 30).await;
    let _new = RawMqtt::connect(ferry.south_port, "taken-over", 30).await;
    assert!(
        old.closed_within(SECS_10).await,
        "the old session is closed"
    );
    // And a device that says goodbye through the client library.
    let device = Device::connect(ferry.south_port, "library").await;
    drop(device);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = ferry.log();
    assert!(log.contains("Disconnecting connection"), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[cfg(feature = "system-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stall_holds_devices_back_and_loses_none_of_thirty_thousand_messages() {
    // The store stalls (disk full) while a device keeps sending: the
    // gateway's queues fill, the broker stops acknowledging the device, and
    // once the disk frees every message is stored, none twice, none lost.
    let disk = Tmpfs::mount(64);
    let ferry = ferry_on(&disk, "gw-stall");
    let mut device = Device::connect(ferry.south_port, "streamer").await;
    let boot = boot_id();
    device
        .publish_envelope("t", &format!("{boot}-first"), json!(0))
        .await;
    let first = device.receipts_until(SECS_10, |all| !all.is_empty()).await;
    assert_eq!(first.first().map(status), Some("stored"));

    let ballast = disk.fill();
    let n = 30_000;
    let sender = {
        let topic = device.up_topic("t");
        let client = device.client();
        let boot = boot.clone();
        tokio::spawn(async move {
            for i in 0..n {
                let body =
                    serde_json::to_vec(&json!({"msg_id": format!("{boot}-{i}"), "payload": i}))
                        .unwrap();
                assert!(client.publish(topic.as_str(), body).await);
            }
        })
    };
    // Long enough for every queue between the device and the store to
    // fill: nothing is acknowledged while nothing can be committed (its
    // PUBACKs wait for the commit), so the device's window holds it back.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink", []),
        1,
        "nothing is committed while the disk is full"
    );
    let during = device
        .receipts_until(Duration::from_millis(100), |_| false)
        .await;
    assert!(
        during.iter().all(|r| status(r) != "stored"),
        "nothing is stored while the disk is full: {during:?}"
    );
    std::fs::remove_file(&ballast).expect("free the disk");
    sender.await.unwrap();
    let got = device
        .receipts_until(Duration::from_secs(120), |all| all.len() >= n)
        .await;
    let stored: std::collections::HashSet<&str> = got
        .iter()
        .filter(|r| status(r) == "stored")
        .filter_map(|r| r["msg_id"].as_str())
        .collect();
    assert_eq!(
        stored.len(),
        n,
        "stored receipts for {} of {n}",
        stored.len()
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink", []),
        n as i64 + 1
    );
    assert_eq!(device.subacks(), 1, "on the same connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_stalled_connections_neither_delay_a_device_nor_stay_open() {
    // Connections that open TCP and never send CONNECT wait on their own
    // and are closed after south.connect_timeout_ms.
    support::raise_fd_limit();
    let mq = Mosquitto::start();
    let ferry = Ferry::start(
        FerryOpts::new("gw-stall-hs", mq.port).with(|c| c.south.connect_timeout_ms = 1000),
    );
    let mut stalled = Vec::new();
    for _ in 0..500 {
        let s = tokio::net::TcpStream::connect(("127.0.0.1", ferry.south_port))
            .await
            .expect("connect");
        stalled.push(s);
    }
    let started = Instant::now();
    let mut device = Device::connect(ferry.south_port, "prompt").await;
    device.publish_envelope("t", "prompt-1", json!(1)).await;
    let r = device.next_receipt(SECS_10).await.expect("a receipt");
    let took = started.elapsed();
    assert_eq!(status(&r), "stored", "{r}");
    eprintln!("connect and `stored` with 500 stalled connections open: {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    // Every stalled connection is closed by ferry within its timeout (plus
    // slack): a read sees the end of the stream.
    let deadline = Instant::now() + Duration::from_secs(5);
    for s in stalled.iter_mut().step_by(50) {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(left, tokio::io::AsyncReadExt::read(s, &mut buf))
            .await
            .expect("closed within 5 s (the timeout is 1 s)")
            .unwrap_or(0);
        assert_eq!(
            n, 0,
            "ferry sent something to a client that never sent CONNECT"
        );
    }
}
