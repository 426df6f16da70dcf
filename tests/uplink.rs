//! The uplink path end to end: devices on ferry's south broker, the real
//! `ferry` binary, a real Mosquitto upstream and a backend client on it.
//!
//! Each test starts its own Mosquitto and ferry on free ports and checks one
//! behaviour of docs/PROTOCOL.md from the outside: receipts on
//! `devices/{id}/ack`, messages on `ferry/{gateway}/up/...`, and rows in the
//! store.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::support::{boot_id, Backend, Device, Ferry, FerryOpts, Mosquitto, NorthMessage};
use serde_json::{json, Value};

const SECS_5: Duration = Duration::from_secs(5);
const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

fn status(r: &Value) -> &str {
    r["status"].as_str().unwrap_or("")
}

/// How many distinct msg_ids have a receipt with `wanted` status.
fn ids_with_status(receipts: &[Value], wanted: &str) -> usize {
    receipts
        .iter()
        .filter(|r| status(r) == wanted)
        .filter_map(|r| r["msg_id"].as_str())
        .collect::<HashSet<_>>()
        .len()
}

/// The receipts for one msg_id, in arrival order.
fn receipts_for<'a>(receipts: &'a [Value], msg_id: &str) -> Vec<&'a Value> {
    receipts.iter().filter(|r| r["msg_id"] == msg_id).collect()
}

/// Distinct (device, msg_id) pairs the backend has seen.
fn distinct_north(messages: &[NorthMessage]) -> usize {
    messages
        .iter()
        .map(|m| (m.device().to_string(), m.msg_id().to_string()))
        .collect::<HashSet<_>>()
        .len()
}

/// Checks that every msg_id got `stored` and then `delivered` with the same
/// seq, and nothing else; returns msg_id → seq.
fn assert_stored_then_delivered(
    device: &str,
    msg_ids: &[String],
    receipts: &[Value],
) -> HashMap<String, u64> {
    let mut seqs = HashMap::new();
    for id in msg_ids {
        let mine = receipts_for(receipts, id);
        let stored = mine.iter().position(|r| status(r) == "stored");
        let delivered = mine.iter().position(|r| status(r) == "delivered");
        let (Some(stored), Some(delivered)) = (stored, delivered) else {
            panic!("{device}/{id}: expected `stored` and `delivered`, got {mine:?}");
        };
        assert!(
            stored < delivered,
            "{device}/{id}: `delivered` came before `stored`: {mine:?}"
        );
        let seq = mine[stored]["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("{device}/{id}: `stored` without a u64 seq: {mine:?}"));
        assert!(seq >= 1, "{device}/{id}: seq must be ≥ 1, got {seq}");
        assert_eq!(
            mine[delivered]["seq"].as_u64(),
            Some(seq),
            "{device}/{id}: `delivered` seq differs from `stored` seq: {mine:?}"
        );
        assert!(
            mine.iter()
                .all(|r| matches!(status(r), "stored" | "delivered")),
            "{device}/{id}: unexpected receipt: {mine:?}"
        );
        seqs.insert(id.clone(), seq);
    }
    let distinct: HashSet<_> = seqs.values().collect();
    assert_eq!(
        distinct.len(),
        seqs.len(),
        "{device}: two messages share a seq: {seqs:?}"
    );
    seqs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_messages_from_ten_devices_are_stored_then_delivered_in_seq_order() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-bulk", mq.port));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-bulk").await;
    let boot = boot_id();

    let mut publishers = Vec::new();
    for d in 0..10 {
        let device = Device::connect(ferry.south_port, &format!("bulk-{d}")).await;
        let boot = boot.clone();
        publishers.push(tokio::spawn(async move {
            let ids = device.publish_many("line3/temp", &boot, "m", 100).await;
            (device, ids)
        }));
    }
    let mut devices = Vec::new();
    for p in publishers {
        devices.push(p.await.expect("publisher task"));
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stored_seqs: HashMap<(String, String), u64> = HashMap::new();
    let mut delivered_total = 0;
    for (device, ids) in &mut devices {
        let left = deadline.saturating_duration_since(Instant::now());
        let receipts = device
            .receipts_until(left, |all| ids_with_status(all, "delivered") == ids.len())
            .await;
        assert_eq!(
            ids_with_status(&receipts, "stored"),
            100,
            "{}: `stored` receipts for 100 messages",
            device.id
        );
        assert_eq!(
            ids_with_status(&receipts, "delivered"),
            100,
            "{}: `delivered` receipts for 100 messages",
            device.id
        );
        for (id, seq) in assert_stored_then_delivered(&device.id, ids, &receipts) {
            stored_seqs.insert((device.id.clone(), id), seq);
        }
        delivered_total += receipts.iter().filter(|r| status(r) == "delivered").count();
    }
    // Late duplicates of `delivered` would show up here.
    for (device, _) in &mut devices {
        let extra = device
            .receipts_until(Duration::from_millis(300), |_| false)
            .await;
        delivered_total += extra.iter().filter(|r| status(r) == "delivered").count();
    }
    assert_eq!(delivered_total, 1000, "one `delivered` receipt per message");

    let north = backend
        .messages_until(SECS_10, |all| distinct_north(all) == 1000)
        .await;
    assert_eq!(distinct_north(&north), 1000, "backend saw every message");
    let mut seen = HashSet::new();
    let mut last_seq: HashMap<String, u64> = HashMap::new();
    for m in &north {
        let key = (m.device().to_string(), m.msg_id().to_string());
        if !seen.insert(key.clone()) {
            continue; // an at-least-once resend; ordering is about first sends
        }
        let b = &m.body;
        assert_eq!(b["gateway"], "gw-bulk", "north body: {b}");
        assert!(b["device"].is_string(), "north body without device: {b}");
        assert!(b["msg_id"].is_string(), "north body without msg_id: {b}");
        assert_eq!(b["stream"], "line3/temp", "north body: {b}");
        assert!(b["stored_ts"].is_u64(), "north body without stored_ts: {b}");
        assert!(
            b["ts"].is_u64(),
            "north body without the envelope's ts: {b}"
        );
        assert!(b["payload"]["i"].is_u64(), "north body payload: {b}");
        assert_eq!(b["payload"]["tag"], "m", "north body payload: {b}");
        assert_eq!(
            m.topic,
            format!("ferry/gw-bulk/up/{}/line3/temp", m.device()),
            "north topic"
        );
        let seq = m
            .seq()
            .unwrap_or_else(|| panic!("north body without seq: {b}"));
        assert_eq!(
            Some(&seq),
            stored_seqs.get(&key),
            "north seq differs from the `stored` receipt for {key:?}"
        );
        if let Some(prev) = last_seq.insert(key.0.clone(), seq) {
            assert!(
                seq > prev,
                "{}: seq {seq} reached the backend after {prev}",
                key.0
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_uplink_is_answered_with_its_original_seq_and_stored_once() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-dup", mq.port));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-dup").await;
    let mut device = Device::connect(ferry.south_port, "dup-1").await;
    let boot = boot_id();
    let first = format!("{boot}-1");

    device.publish_envelope("t", &first, json!({"v": 1})).await;
    let (stored, _) = device.next_receipt_for(&first, SECS_10).await;
    let stored = stored.expect("`stored` for the first publish");
    assert_eq!(status(&stored), "stored", "first receipt: {stored}");
    let seq = stored["seq"].as_u64().expect("seq in `stored`");

    // Resent after `stored`: answered again, then `delivered` once acked.
    device.publish_envelope("t", &first, json!({"v": 1})).await;
    let receipts = device
        .receipts_until(SECS_10, |all| receipts_for(all, &first).len() >= 2)
        .await;
    let mine = receipts_for(&receipts, &first);
    assert_eq!(
        mine.len(),
        2,
        "expected the duplicate's answer and `delivered`: {mine:?}"
    );
    for r in &mine {
        assert_eq!(r["seq"].as_u64(), Some(seq), "original seq: {r}");
        assert!(
            matches!(status(r), "stored" | "delivered"),
            "duplicate answer: {r}"
        );
    }
    assert!(
        status(mine[0]) != "delivered" || status(mine[1]) == "delivered",
        "receipts went back from `delivered` to `stored`: {mine:?}"
    );
    assert!(
        mine.iter().any(|r| status(r) == "delivered"),
        "no `delivered`: {mine:?}"
    );

    // Resent after `delivered`: answered `delivered` with the original seq.
    device.publish_envelope("t", &first, json!({"v": 1})).await;
    let (again, skipped) = device.next_receipt_for(&first, SECS_10).await;
    let again = again.expect("an answer to the duplicate sent after `delivered`");
    assert_eq!(status(&again), "delivered", "{again}");
    assert_eq!(again["seq"].as_u64(), Some(seq), "{again}");
    assert!(skipped.is_empty(), "unexpected receipts: {skipped:?}");

    let north = backend.drain_for(Duration::from_millis(800)).await;
    let copies = north.iter().filter(|m| m.msg_id() == first).count();
    assert_eq!(copies, 1, "backend must see the message once: {north:?}");

    let rows = ferry.query_i64(
        "SELECT COUNT(*) FROM uplink WHERE device = ?1 AND msg_id = ?2",
        ["dup-1", first.as_str()],
    );
    assert_eq!(rows, 1, "uplink rows for the duplicated msg_id");

    let second = format!("{boot}-2");
    device.publish_envelope("t", &second, json!({"v": 2})).await;
    let (next, _) = device.next_receipt_for(&second, SECS_10).await;
    let next = next.expect("`stored` for the next message");
    assert_eq!(status(&next), "stored", "{next}");
    assert_eq!(
        next["seq"].as_u64(),
        Some(seq + 1),
        "the duplicates must not have used up seqs: {next}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_without_retry_fails_the_message_and_dead_letters_it() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-nack", mq.port));
    let mut backend = Backend::connect(mq.port, "gw-nack").await;
    let mut device = Device::connect(ferry.south_port, "nack-1").await;
    let id = format!("{}-1", boot_id());

    device.publish_envelope("t", &id, json!({"v": 1})).await;
    let (stored, _) = device.next_receipt_for(&id, SECS_10).await;
    let stored = stored.expect("`stored`");
    assert_eq!(status(&stored), "stored", "{stored}");
    let seq = stored["seq"].as_u64().expect("seq");

    let m = backend.next_message(SECS_10).await.expect("north message");
    assert_eq!(
        (m.device(), m.msg_id(), m.seq()),
        ("nack-1", id.as_str(), Some(seq))
    );
    backend.nack("nack-1", &id, "unknown sensor", false).await;

    let (failed, _) = device.next_receipt_for(&id, SECS_10).await;
    let failed = failed.expect("`failed` after a nack with retry:false");
    assert_eq!(status(&failed), "failed", "{failed}");
    assert_eq!(failed["seq"].as_u64(), Some(seq), "{failed}");
    let reason = failed["reason"].as_str().unwrap_or("");
    assert!(reason.starts_with("nacked"), "reason: {failed}");
    assert!(
        reason.contains("unknown sensor"),
        "reason keeps the backend's words: {failed}"
    );

    let dead_reason: String = ferry
        .db()
        .query_row(
            "SELECT reason FROM dead_letter WHERE device = ?1 AND msg_id = ?2",
            ["nack-1", id.as_str()],
            |r| r.get(0),
        )
        .expect("a dead_letter row for the nacked message");
    assert!(
        dead_reason.starts_with("nacked"),
        "dead_letter.reason: {dead_reason}"
    );
    let state: String = ferry
        .db()
        .query_row(
            "SELECT state FROM uplink WHERE device = ?1 AND msg_id = ?2",
            ["nack-1", id.as_str()],
            |r| r.get(0),
        )
        .expect("uplink row");
    assert_eq!(state, "dead");

    // Past the ack timeout plus a backoff: a final nack is never resent.
    let resent = backend.drain_for(Duration::from_millis(2600)).await;
    assert!(resent.is_empty(), "resent after a final nack: {resent:?}");
    let extra = device
        .receipts_until(Duration::from_millis(100), |_| false)
        .await;
    assert!(extra.is_empty(), "receipts after `failed`: {extra:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_with_retry_resends_the_same_seq_until_the_backend_acks() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-retry", mq.port));
    let mut backend = Backend::connect(mq.port, "gw-retry").await;
    let mut device = Device::connect(ferry.south_port, "retry-1").await;
    let id = format!("{}-1", boot_id());

    device.publish_envelope("t", &id, json!({"v": 1})).await;
    let (stored, _) = device.next_receipt_for(&id, SECS_10).await;
    let stored = stored.expect("`stored`");
    let seq = stored["seq"].as_u64().expect("seq");

    let m = backend.next_message(SECS_10).await.expect("first send");
    assert_eq!((m.msg_id(), m.seq()), (id.as_str(), Some(seq)));
    backend.nack("retry-1", &id, "busy", true).await;

    let again = backend
        .next_message(SECS_5)
        .await
        .expect("a resend after nack with retry:true");
    assert_eq!(
        (again.device(), again.msg_id(), again.seq()),
        ("retry-1", id.as_str(), Some(seq)),
        "the resend carries the same seq"
    );
    let early = device
        .receipts_until(Duration::from_millis(100), |_| false)
        .await;
    assert!(early.is_empty(), "no receipt before the ack: {early:?}");

    backend.ack_ok("retry-1", &id).await;
    let (delivered, _) = device.next_receipt_for(&id, SECS_10).await;
    let delivered = delivered.expect("`delivered` after the ack");
    assert_eq!(status(&delivered), "delivered", "{delivered}");
    assert_eq!(delivered["seq"].as_u64(), Some(seq), "{delivered}");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        0,
        "a retried nack is not a dead letter"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_stored_during_a_ten_second_upstream_outage_are_delivered_after_it() {
    let mut mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new("gw-outage", mq.port));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-outage").await;
    let boot = boot_id();

    // Warm-up: the whole path works before the outage.
    let mut devices = Vec::new();
    let mut receipts: Vec<Vec<Value>> = Vec::new();
    let mut ids: Vec<Vec<String>> = Vec::new();
    for d in 0..3 {
        let mut device = Device::connect(ferry.south_port, &format!("out-{d}")).await;
        let warm = device.publish_many("t", &boot, "warm", 1).await;
        let got = device
            .receipts_until(SECS_30, |all| ids_with_status(all, "delivered") == 1)
            .await;
        assert_eq!(ids_with_status(&got, "delivered"), 1, "warm-up: {got:?}");
        devices.push(device);
        receipts.push(got);
        ids.push(warm);
    }

    mq.stop();
    let outage = Instant::now();
    for (d, device) in devices.iter().enumerate() {
        let sent = device.publish_many("t", &boot, "out", 50).await;
        ids[d].extend(sent);
    }
    for (d, device) in devices.iter_mut().enumerate() {
        let until = (outage + Duration::from_secs(9)).saturating_duration_since(Instant::now());
        let got = device
            .receipts_until(until, |all| ids_with_status(all, "stored") == 50)
            .await;
        receipts[d].extend(got);
        assert_eq!(
            ids_with_status(&receipts[d], "stored"),
            ids[d].len(),
            "{}: every message is `stored` while upstream is down",
            device.id
        );
        assert_eq!(
            ids_with_status(&receipts[d], "delivered"),
            1,
            "{}: nothing can be delivered while upstream is down",
            device.id
        );
    }
    assert!(
        ferry.is_running(),
        "ferry died during the outage:\n{}",
        ferry.log_tail()
    );
    tokio::time::sleep((outage + SECS_10).saturating_duration_since(Instant::now())).await;

    mq.restart();
    assert!(
        backend.wait_subacks(2, SECS_10).await,
        "backend did not resubscribe after the restart"
    );
    let deadline = Instant::now() + Duration::from_secs(45);
    for (d, device) in devices.iter_mut().enumerate() {
        let want = ids[d].len();
        let left = deadline.saturating_duration_since(Instant::now());
        let have = ids_with_status(&receipts[d], "delivered");
        let got = device
            .receipts_until(left, |all| have + ids_with_status(all, "delivered") >= want)
            .await;
        receipts[d].extend(got);
        assert_eq!(
            ids_with_status(&receipts[d], "delivered"),
            want,
            "{}: everything is `delivered` after the outage",
            device.id
        );
        assert_stored_then_delivered(&device.id, &ids[d], &receipts[d]);
    }

    let north = backend
        .messages_until(SECS_10, |all| distinct_north(all) == 153)
        .await;
    assert_eq!(distinct_north(&north), 153, "backend saw every message");
    let outage_ids: HashSet<(&str, &str)> = north
        .iter()
        .map(|m| (m.device(), m.msg_id()))
        .filter(|(_, id)| id.contains("-out"))
        .collect();
    assert_eq!(outage_ids.len(), 150, "backend saw every outage message");
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []), 0);
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE state <> 'delivered'", []),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_messages_survive_a_sigkill_and_are_delivered_after_restart_with_their_seqs() {
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new("gw-crash", mq.port));
    let boot = boot_id();

    let mut devices = Vec::new();
    let mut ids = Vec::new();
    for d in 0..2 {
        let device = Device::connect(ferry.south_port, &format!("crash-{d}")).await;
        ids.push(device.publish_many("t", &boot, "c", 25).await);
        devices.push(device);
    }
    let mut stored: HashMap<(String, String), u64> = HashMap::new();
    for device in devices.iter_mut() {
        let got = device
            .receipts_until(SECS_10, |all| ids_with_status(all, "stored") == 25)
            .await;
        assert_eq!(
            ids_with_status(&got, "stored"),
            25,
            "{}: {got:?}",
            device.id
        );
        for r in got.iter().filter(|r| status(r) == "stored") {
            let key = (device.id.clone(), r["msg_id"].as_str().unwrap().to_string());
            stored.insert(key, r["seq"].as_u64().expect("seq"));
        }
    }

    ferry.kill();
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE state = 'stored'", []),
        50,
        "every `stored` message is in the store after SIGKILL"
    );
    ferry.restart();
    for device in devices.iter_mut() {
        assert!(
            device.wait_subacks(2, Duration::from_secs(15)).await,
            "{} did not reconnect to the restarted ferry",
            device.id
        );
    }
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-crash").await;

    let deadline = Instant::now() + SECS_30;
    for device in devices.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = device
            .receipts_until(left, |all| ids_with_status(all, "delivered") == 25)
            .await;
        assert_eq!(
            ids_with_status(&got, "delivered"),
            25,
            "{}: {got:?}",
            device.id
        );
        for r in &got {
            let key = (
                device.id.clone(),
                r["msg_id"].as_str().unwrap_or("").to_string(),
            );
            assert_eq!(status(r), "delivered", "{r}");
            assert_eq!(
                r["seq"].as_u64(),
                stored.get(&key).copied(),
                "seq kept: {r}"
            );
        }
    }
    let north = backend
        .messages_until(SECS_10, |all| distinct_north(all) == 50)
        .await;
    assert_eq!(distinct_north(&north), 50);
    for m in &north {
        let key = (m.device().to_string(), m.msg_id().to_string());
        assert_eq!(m.seq(), stored.get(&key).copied(), "north seq for {key:?}");
    }
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM uplink", []), 50);
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM (SELECT DISTINCT device, msg_id FROM uplink)",
            []
        ),
        50
    );

    // Seqs are never reused across a restart.
    let last = (0..25)
        .filter_map(|i| stored.get(&("crash-0".to_string(), ids[0][i].clone())))
        .max()
        .copied()
        .expect("crash-0 seqs");
    let fresh = format!("{boot}-after");
    devices[0].publish_envelope("t", &fresh, json!({})).await;
    let (r, _) = devices[0].next_receipt_for(&fresh, SECS_10).await;
    let r = r.expect("`stored` after the restart");
    assert_eq!(status(&r), "stored", "{r}");
    assert_eq!(r["seq"].as_u64(), Some(last + 1), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_unidentified_and_oversized_uplinks_are_rejected_while_others_flow() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(
        FerryOpts::new("gw-reject", mq.port).with(|c| c.south.max_payload_bytes = 1024),
    );
    let _backend = Backend::connect_auto_ack(mq.port, "gw-reject").await;
    let mut bad = Device::connect(ferry.south_port, "reject-bad").await;
    let mut good = Device::connect(ferry.south_port, "reject-good").await;
    let boot = boot_id();

    let mut good_ids = good.publish_many("t", &boot, "a", 10).await;
    let big_id = format!("{boot}-big");
    let big = serde_json::to_vec(&json!({"msg_id": big_id, "payload": "x".repeat(2000)})).unwrap();
    let cases: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("malformed", b"{not json".to_vec(), None),
        (
            "malformed",
            br#"{"ts": 1764470000123, "payload": {"temp": 1}}"#.to_vec(),
            None,
        ),
        ("too_large", big, Some(big_id.as_str())),
    ];
    let topic = bad.up_topic("t");
    for (code, bytes, id) in &cases {
        bad.publish_raw(&topic, bytes.clone()).await;
        let r = bad
            .next_receipt(SECS_10)
            .await
            .unwrap_or_else(|| panic!("no receipt for a {code} uplink"));
        assert_eq!(status(&r), "rejected", "{code}: {r}");
        let reason = r["reason"].as_str().unwrap_or("");
        assert!(reason.starts_with(code), "{code}: reason {r}");
        let id_ok = r["msg_id"].is_null() || id.is_some_and(|id| r["msg_id"] == id);
        assert!(id_ok, "{code}: msg_id must be null where unknown: {r}");
        let row = r["dead_letter"]
            .as_i64()
            .unwrap_or_else(|| panic!("{code}: no dead_letter id: {r}"));
        let (device, dl_reason, raw): (Option<String>, String, Vec<u8>) = ferry
            .db()
            .query_row(
                "SELECT device, reason, raw FROM dead_letter WHERE id = ?1",
                [row],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap_or_else(|e| panic!("{code}: dead_letter row {row}: {e}"));
        assert_eq!(
            device.as_deref(),
            Some("reject-bad"),
            "{code}: dead_letter.device"
        );
        assert!(
            dl_reason.starts_with(code),
            "{code}: dead_letter.reason {dl_reason}"
        );
        assert_eq!(&raw, bytes, "{code}: dead_letter.raw holds the bytes sent");
    }

    // The rejected device is still connected and served.
    let ok_id = format!("{boot}-ok");
    bad.publish_envelope("t", &ok_id, json!(1)).await;
    let (r, _) = bad.next_receipt_for(&ok_id, SECS_10).await;
    assert_eq!(r.as_ref().map(status), Some("stored"), "{r:?}");

    good_ids.extend(good.publish_many("t", &boot, "b", 10).await);
    let got = good
        .receipts_until(SECS_30, |all| ids_with_status(all, "delivered") == 20)
        .await;
    assert_stored_then_delivered("reject-good", &good_ids, &got);
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        3,
        "one dead letter per rejected uplink"
    );
}
