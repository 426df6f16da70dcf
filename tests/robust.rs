//! No single peer can stall, starve or silently lose: each test plays one
//! hostile or clumsy peer (a device, the backend, the upstream broker, the
//! disk) against the real `ferry` binary and a real Mosquitto, and checks
//! that it is answered while everyone else's traffic flows.

use std::collections::HashSet;
use std::time::Duration;

use ferry::ids::DeviceId;
use serde_json::{json, Value};

use crate::support::receipts::{ids_with, status};
use crate::support::{
    self, boot_id, device_topics, north_connects, north_topics, Backend, Device, Ferry, FerryOpts,
    Mosquitto, RawMqtt,
};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);
const SECS_60: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_or_a_65000_byte_stream_is_rejected_at_intake_and_the_link_stays_up() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-poison-topic", mq.port));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-poison-topic").await;
    let mut evil = Device::connect(ferry.south_port, "evil").await;
    let mut good = Device::connect(ferry.south_port, "good").await;
    let boot = boot_id();

    let long = "x".repeat(65_000);
    for (stream, why) in [
        ("a\0b", "a NUL byte"),
        (long.as_str(), "a 65,000-byte level"),
    ] {
        let id = format!("{boot}-{}", stream.len());
        let body = serde_json::to_vec(&json!({"msg_id": id, "payload": 1})).unwrap();
        evil.publish_raw(&format!("devices/evil/up/{stream}"), body)
            .await;
        let (r, _) = evil.next_receipt_for(&id, SECS_10).await;
        let r = r.unwrap_or_else(|| panic!("{why}: no receipt"));
        assert_eq!(status(&r), "rejected", "{why}: {r}");
        assert!(
            r["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("bad_topic: bad stream"),
            "{why}: {r}"
        );
        assert!(r["dead_letter"].as_i64().is_some(), "{why}: {r}");
    }
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'evil'", []),
        0,
        "nothing north can never publish is stored"
    );

    let ids = good.publish_many("t", &boot, "g", 20).await;
    let got = good
        .receipts_until(SECS_30, |all| ids_with(all, "delivered").len() == 20)
        .await;
    assert_eq!(ids_with(&got, "delivered").len(), ids.len(), "{got:?}");
    let north = backend.drain_for(Duration::from_millis(300)).await;
    assert!(north.iter().all(|m| m.device() == "good"), "{north:?}");
    assert_eq!(
        north_connects(&ferry.log()),
        1,
        "the north link never dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_upstream_drops_the_link_on_is_dead_lettered_while_another_device_flows() {
    // The upstream takes no packet over 20,000 bytes: it closes the
    // connection of whoever sends one.
    let mq = Mosquitto::start_with(&["max_packet_size 20000"]);
    let attempts = 3;
    let ferry = Ferry::start(FerryOpts::new("gw-poison", mq.port).with(|c| {
        c.retry.max_attempts = attempts;
        c.retry.base_ms = 100;
        c.retry.max_ms = 400;
    }));
    let _backend = Backend::connect_auto_ack(mq.port, "gw-poison").await;
    let mut big = Device::connect(ferry.south_port, "big").await;
    let mut small = Device::connect(ferry.south_port, "small").await;
    let boot = boot_id();

    let mut ids = small.publish_many("t", &boot, "before", 25).await;
    let poison = format!("{boot}-poison");
    big.publish_envelope("t", &poison, json!("p".repeat(30_000)))
        .await;
    ids.extend(small.publish_many("t", &boot, "after", 25).await);

    let seen = big
        .receipts_until(SECS_60, |all| {
            all.iter()
                .any(|r| r["msg_id"] == poison && status(r) == "failed")
        })
        .await;
    let mine: Vec<_> = seen.iter().filter(|r| r["msg_id"] == poison).collect();
    let Some(failed) = mine.iter().find(|r| status(r) == "failed") else {
        panic!(
            "the poison message was never dead-lettered: {seen:?}\n{}",
            ferry.log_tail()
        );
    };
    assert_eq!(status(mine[0]), "stored", "stored first: {mine:?}");
    assert_eq!(status(failed), "failed", "{failed}");
    let reason = failed["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with(&format!("exhausted: {attempts} attempts"))
            && reason.contains("closed the connection on this message"),
        "{reason}"
    );
    let (dl_attempts, dl_reason): (i64, String) = ferry
        .db()
        .query_row(
            "SELECT attempts, reason FROM dead_letter WHERE msg_id = ?1",
            [&poison],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("a dead-letter row for the poison message");
    assert_eq!(dl_attempts, attempts as i64);
    assert_eq!(dl_reason, reason);

    let got = small
        .receipts_until(SECS_60, |all| ids_with(all, "delivered").len() == ids.len())
        .await;
    assert_eq!(
        ids_with(&got, "delivered").len(),
        ids.len(),
        "every message of the other device is delivered"
    );
    // One drop finds the suspect, each further one is a counted attempt;
    // the link is never in a tight loop.
    let connects = north_connects(&ferry.log());
    assert!(
        (2..=attempts as usize + 3).contains(&connects),
        "{connects} north connections"
    );

    // After the dead letter the link comes back once and stays up.
    let later = small.publish_many("t", &boot, "later", 5).await;
    let got = small
        .receipts_until(SECS_30, |all| {
            ids_with(all, "delivered").len() == later.len()
        })
        .await;
    assert_eq!(ids_with(&got, "delivered").len(), later.len());
    let settled = north_connects(&ferry.log());
    let last = small.publish_many("t", &boot, "last", 5).await;
    let got = small
        .receipts_until(SECS_30, |all| {
            ids_with(all, "delivered").len() == last.len()
        })
        .await;
    assert_eq!(ids_with(&got, "delivered").len(), last.len());
    assert_eq!(north_connects(&ferry.log()), settled, "no more drops");
}

/// A client on the upstream broker reading `ferry/{gateway}/receipts`.
async fn receipts_reader(mq_port: u16, gateway: &str) -> RawMqtt {
    let mut raw = RawMqtt::connect(mq_port, &format!("receipts-{gateway}"), 30).await;
    raw.subscribe(&[north_topics(gateway).receipts()]).await;
    raw
}

/// Receipts north (arrays split) until `done` holds or `timeout` passes.
async fn north_receipts_until(
    raw: &mut RawMqtt,
    all: &mut Vec<Value>,
    timeout: Duration,
    mut done: impl FnMut(&[Value]) -> bool,
) -> bool {
    if done(all) {
        return true;
    }
    raw.read_publishes(timeout, |p| {
        match serde_json::from_slice::<Value>(&p.payload) {
            Ok(Value::Array(items)) => all.extend(items),
            Ok(one) => all.push(one),
            Err(_) => {}
        }
        done(all)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_from_upstream_are_answered_and_never_wedge_the_link() {
    let mq = Mosquitto::start();
    let gw = "gw-bigup";
    let ferry =
        Ferry::start(FerryOpts::new(gw, mq.port).with(|c| c.north.max_packet_bytes = 1 << 20));
    let mut backend = Backend::connect(mq.port, gw).await;
    let mut receipts = receipts_reader(mq.port, gw).await;
    let mut device = Device::connect(ferry.south_port, "d1").await;
    let boot = boot_id();

    // One ack array of over 528 kB: twenty real acks among 9,500 others.
    let ids = device.publish_many("t", &boot, "u", 20).await;
    let north = backend
        .messages_until(SECS_30, |all| all.len() >= ids.len())
        .await;
    assert_eq!(north.len(), ids.len());
    let mut acks: Vec<Value> = (0..9500)
        .map(|i| json!({"device": "ghost", "msg_id": format!("ghost-{i:06}"), "status": "ok"}))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        acks.insert(
            i * 400,
            json!({"device": "d1", "msg_id": id, "status": "ok"}),
        );
    }
    let array = serde_json::to_vec(&acks).unwrap();
    assert!(array.len() > 528_000, "{} bytes", array.len());
    backend.publish_ack_raw(array).await;
    let got = device
        .receipts_until(SECS_30, |all| ids_with(all, "delivered").len() == ids.len())
        .await;
    assert_eq!(ids_with(&got, "delivered").len(), ids.len(), "{got:?}");

    // A 200 kB downlink (over south.max_payload_bytes) and a 2 MiB one (over
    // north.max_packet_bytes): both rejected by msg_id, each exactly once.
    let big =
        serde_json::to_vec(&json!({"msg_id": "big-down", "payload": "b".repeat(200_000)})).unwrap();
    let huge = serde_json::to_vec(&json!({"msg_id": "huge-down", "payload": "h".repeat(2 << 20)}))
        .unwrap();
    backend
        .publish_raw(
            &north_topics(gw).down_to(&DeviceId::new("d1").unwrap()),
            big,
        )
        .await;
    backend
        .publish_raw(
            &north_topics(gw).down_to(&DeviceId::new("d1").unwrap()),
            huge,
        )
        .await;
    let mut all = Vec::new();
    let rejected = |all: &[Value], id: &str| {
        all.iter()
            .filter(|r| r["msg_id"] == id && status(r) == "rejected")
            .count()
    };
    let both = north_receipts_until(&mut receipts, &mut all, SECS_30, |all| {
        rejected(all, "big-down") == 1 && rejected(all, "huge-down") == 1
    })
    .await;
    assert!(both, "{all:?}\n{}", ferry.log_tail());
    for r in all.iter().filter(|r| status(r) == "rejected") {
        assert!(
            r["reason"].as_str().unwrap_or("").starts_with("too_large"),
            "{r}"
        );
        assert_eq!(r["device"], "d1", "{r}");
    }
    let log = ferry.log();
    assert!(
        log.contains("north message over north.max_packet_bytes acknowledged")
            && log.contains("total=1"),
        "logged and counted"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM dead_letter WHERE direction = 'down' AND reason LIKE 'too_large%'",
            []
        ),
        2
    );

    // Traffic goes on, both ways, on the first connection.
    let ok = serde_json::to_vec(&json!({"msg_id": "small-down", "payload": "hello"})).unwrap();
    backend
        .publish_raw(&north_topics(gw).down_to(&DeviceId::new("d1").unwrap()), ok)
        .await;
    let stored = north_receipts_until(&mut receipts, &mut all, SECS_30, |all| {
        all.iter()
            .any(|r| r["msg_id"] == "small-down" && status(r) == "stored")
    })
    .await;
    assert!(stored, "{all:?}");
    let more = device.publish_many("t", &boot, "v", 5).await;
    let north = backend
        .messages_until(SECS_30, |all| all.len() >= more.len())
        .await;
    assert_eq!(north.len(), more.len());
    // Nothing was redelivered: still exactly one rejection each.
    north_receipts_until(&mut receipts, &mut all, Duration::from_millis(500), |_| {
        false
    })
    .await;
    assert_eq!(rejected(&all, "big-down"), 1);
    assert_eq!(rejected(&all, "huge-down"), 1);
    assert_eq!(
        north_connects(&ferry.log()),
        1,
        "the north link never dropped"
    );
}

/// An envelope as bytes.
fn envelope(id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"msg_id": id, "payload": {"v": 1}})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_pipelined_uplinks_with_the_north_link_down_all_get_stored() {
    // Nothing listens upstream: every message waits in the store.
    let ferry = Ferry::start(FerryOpts::new("gw-burst", support::free_port()));
    let mut device = Device::connect(ferry.south_port, "burst").await;
    let boot = boot_id();
    let n = 2000;
    let topic = device.up_topic("t");
    for i in 0..n {
        device
            .publish_raw(&topic, envelope(&format!("{boot}-{i}")))
            .await;
    }
    let got = device
        .receipts_until(SECS_60, |all| ids_with(all, "stored").len() == n)
        .await;
    assert_eq!(ids_with(&got, "stored").len(), n, "{} receipts", got.len());
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE state = 'stored'", []),
        n as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_stops_reading_for_three_seconds_still_gets_every_receipt() {
    let ferry = Ferry::start(FerryOpts::new("gw-pause", support::free_port()));
    let mut raw = RawMqtt::connect(ferry.south_port, "pauser", 60).await;
    raw.subscribe(&["devices/pauser/ack".to_string()]).await;
    let boot = boot_id();
    let n = 2000;
    let publishes: Vec<_> = (0..n)
        .map(|i| raw.publish("devices/pauser/up/t", envelope(&format!("{boot}-{i}"))))
        .collect();
    raw.send_many(publishes).await;
    // Reads nothing at all for three seconds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut stored = HashSet::new();
    raw.read_publishes(SECS_60, |p| {
        let r: Value = serde_json::from_slice(&p.payload).unwrap();
        if status(&r) == "stored" {
            stored.insert(r["msg_id"].as_str().unwrap().to_string());
        }
        stored.len() == n
    })
    .await;
    assert_eq!(
        stored.len(),
        n,
        "stored receipts for {} of {n}",
        stored.len()
    );
}

/// Connects `ids` as devices (ack and inbox subscribed, `online` said),
/// at most `parallel` connecting at once.
async fn connect_devices(port: u16, ids: Vec<String>, parallel: usize) -> Vec<RawMqtt> {
    use futures_util::stream::{self, StreamExt};
    stream::iter(ids)
        .map(|id| async move {
            let mut raw = RawMqtt::connect(port, &id, 60).await;
            let codes = raw
                .subscribe(&[device_topics(&id).ack(), device_topics(&id).inbox()])
                .await;
            assert!(codes
                .iter()
                .all(|c| !matches!(c, rumqttc::SubscribeReasonCode::Failure)));
            let online = raw.publish(&device_topics(&id).status(), &br#"{"online":true}"#[..]);
            raw.send(online).await;
            raw
        })
        .buffer_unordered(parallel)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_returns_to_its_first_round_after_twenty_thousand_devices_come_and_go() {
    support::raise_fd_limit();
    let ferry = Ferry::start(
        FerryOpts::new("gw-churn", support::free_port()).with(|c| c.south.max_connections = 6000),
    );
    let pid = ferry.pid().expect("ferry runs");
    let rounds = 4;
    let per_round = 5000;
    let mut after = Vec::new();
    for round in 0..rounds {
        let ids = (0..per_round)
            .map(|i| format!("churn-{round}-{i}"))
            .collect::<Vec<_>>();
        let devices = connect_devices(ferry.south_port, ids, 200).await;
        let connected = support::rss_kib(pid).unwrap();
        for mut d in devices {
            d.send(rumqttc::Packet::Disconnect).await;
        }
        // Let the broker and the pipeline see every device leave: all of
        // them gone (on a loaded machine that takes longer than the 2 s
        // that follow), then 2 s more.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while ferry.metrics().get("ferry_devices_online") != Some(0.0)
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let left = support::rss_kib(pid).unwrap();
        eprintln!(
            "round {round}: {connected} KiB with {per_round} connected, {left} KiB after they left"
        );
        after.push(left);
    }
    let growth = after[rounds - 1] as i64 - after[0] as i64;
    assert!(
        growth < 64 * 1024,
        "RSS after each round (KiB): {after:?}: grew {growth} KiB"
    );
    assert!(
        !ferry.log().contains(" ERROR "),
        "a device leaving is no error"
    );
}
