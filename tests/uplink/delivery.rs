//! The uplink as it should go: many devices stored then delivered in seq
//! order, a duplicate answered with its original seq, and bad uplinks
//! rejected while others flow.

use super::*;

both_modes!(a_thousand_messages_from_ten_devices_are_stored_then_delivered_in_seq_order);
async fn a_thousand_messages_from_ten_devices_are_stored_then_delivered_in_seq_order(mode: Mode) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-bulk", mq.port));
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
            north_topics("gw-bulk").up(&DeviceId::new(m.device()).unwrap(), "line3/temp"),
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

both_modes!(a_duplicate_uplink_is_answered_with_its_original_seq_and_stored_once);
async fn a_duplicate_uplink_is_answered_with_its_original_seq_and_stored_once(mode: Mode) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-dup", mq.port));
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

both_modes!(malformed_unidentified_and_oversized_uplinks_are_rejected_while_others_flow);
async fn malformed_unidentified_and_oversized_uplinks_are_rejected_while_others_flow(mode: Mode) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
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

both_modes!(duplicates_racing_the_backend_ack_never_take_a_receipt_back_to_stored);
async fn duplicates_racing_the_backend_ack_never_take_a_receipt_back_to_stored(mode: Mode) {
    // Every message is sent, then sent again three times at once, while
    // the backend acks at full speed: each duplicate is looked up while its
    // `delivered` may be committing. Receipts for one message must still
    // arrive in state order (docs/PROTOCOL.md).
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-dup-race", mq.port));
    let _backend = Backend::connect_auto_ack(mq.port, "gw-dup-race").await;
    let mut device = Device::connect(ferry.south_port, "race-1").await;
    let boot = boot_id();
    let n = 200;
    let ids: Vec<String> = (0..n).map(|i| format!("{boot}-{i:04}")).collect();
    for id in &ids {
        for _ in 0..4 {
            device.publish_envelope("t", id, json!(1)).await;
        }
    }
    let got = device
        .receipts_until(SECS_30, |all| ids_with_status(all, "delivered") == n)
        .await;
    assert_eq!(
        ids_with_status(&got, "delivered"),
        n,
        "every message delivered"
    );
    for id in &ids {
        let mine = receipts_for(&got, id);
        if let Some(first_delivered) = mine.iter().position(|r| status(r) == "delivered") {
            assert!(
                mine[first_delivered..]
                    .iter()
                    .all(|r| status(r) == "delivered"),
                "{id}: a receipt went back after `delivered`: {mine:?}"
            );
        }
    }
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink", []),
        n as i64,
        "each stored once"
    );
}
