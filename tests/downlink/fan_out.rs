//! One downlink to many devices, each on its own cursor, and what the
//! cursors report back north: `read` receipts, a `nack` into the dead letters.

use super::*;

both_modes!(a_downlink_to_three_devices_is_delivered_to_each_on_its_own_cursor_the_offline_one_when_it_connects);
async fn a_downlink_to_three_devices_is_delivered_to_each_on_its_own_cursor_the_offline_one_when_it_connects(
    mode: Mode,
) {
    let (a, b, c) = ("dev-a", "dev-b", "dev-c");
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-down-fan", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let mut dev_a = device_client(ferry.south_port, a);
    let mut dev_b = device_client(ferry.south_port, b);
    connected(&mut dev_a, a).await;
    connected(&mut dev_b, b).await;
    let (mut inbox_a, mut inbox_b, mut inbox_c) =
        (Inbox::default(), Inbox::default(), Inbox::default());

    // dev-a gets one message of its own first, so its seqs run ahead.
    let own = format!("fan-{boot}-own");
    north.send(&[a], &own, json!("for a only"));
    take_inbox(&mut dev_a, SECS_20, true, &mut inbox_a, |i| {
        !i.handed.is_empty()
    })
    .await;
    north
        .expect(SECS_20, "`delivered` for dev-a's own message", |r| {
            count_with(r, "delivered") == 1
        })
        .await;

    let shared = format!("fan-{boot}-all");
    north.send(&[a, b, c], &shared, json!("for all three"));
    take_inbox(&mut dev_a, SECS_20, true, &mut inbox_a, |i| {
        i.handed.len() >= 2
    })
    .await;
    take_inbox(&mut dev_b, SECS_20, true, &mut inbox_b, |i| {
        !i.handed.is_empty()
    })
    .await;
    north
        .expect(SECS_20, "`delivered` for dev-a and dev-b", |r| {
            let d = seqs_with(r, "delivered");
            d.contains_key(&key(&shared, a)) && d.contains_key(&key(&shared, b))
        })
        .await;
    north.settle(QUIET).await;
    let stored = seqs_with(&north.receipts, "stored");
    assert_eq!(stored.get(&key(&shared, a)), Some(&2), "dev-a's seq");
    assert_eq!(stored.get(&key(&shared, b)), Some(&1), "dev-b's seq");
    assert_eq!(stored.get(&key(&shared, c)), Some(&1), "dev-c's seq");
    assert!(
        statuses_of(&north.receipts, &shared, c) == ["stored"],
        "dev-c is offline: only `stored`, got {:?}",
        statuses_of(&north.receipts, &shared, c)
    );
    assert_eq!(inbox_a.seqs(), vec![1, 2]);
    assert_eq!(inbox_a.handed[1].msg_id, shared);
    assert_eq!(inbox_b.seqs(), vec![1]);
    assert_eq!(inbox_b.handed[0].msg_id, shared);

    let cursor =
        |d: &str| ferry.query_i64("SELECT delivered_upto FROM devices WHERE device = ?1", [d]);
    eventually(SECS_20, "dev-a's and dev-b's cursors move", || {
        cursor(a) == 2 && cursor(b) == 1
    })
    .await;
    assert_eq!(cursor(c), 0, "dev-c's cursor before it connected");
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_message WHERE msg_id = ?1",
            [&shared]
        ),
        1,
        "the shared message is stored once"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery d JOIN down_message m ON m.id = d.message_id \
             WHERE m.msg_id = ?1",
            [&shared]
        ),
        3,
        "one delivery per device"
    );

    let mut dev_c = device_client(ferry.south_port, c);
    take_inbox(&mut dev_c, SECS_20, true, &mut inbox_c, |i| {
        !i.handed.is_empty()
    })
    .await;
    assert_eq!(inbox_c.seqs(), vec![1]);
    assert_eq!(inbox_c.handed[0].msg_id, shared);
    assert_eq!(
        inbox_c.handed[0]
            .body
            .as_ref()
            .map(|b| b["payload"].clone()),
        Some(json!("for all three"))
    );
    north
        .expect(SECS_20, "`delivered` for dev-c", |r| {
            seqs_with(r, "delivered").get(&key(&shared, c)) == Some(&1)
        })
        .await;
    eventually(SECS_20, "dev-c's cursor moves", || cursor(c) == 1).await;
    assert_eq!((cursor(a), cursor(b)), (2, 1), "the others' cursors stay");
    north.settle(QUIET).await;
    assert_eq!(
        north
            .receipts
            .iter()
            .filter(|r| status(r) == "delivered" && r["msg_id"] == shared.as_str())
            .count(),
        3,
        "one `delivered` per device"
    );
}

both_modes!(read_cursors_send_read_receipts_and_a_nack_fails_the_delivery_into_the_dead_letters);
async fn read_cursors_send_read_receipts_and_a_nack_fails_the_delivery_into_the_dead_letters(
    mode: Mode,
) {
    const DEVICE: &str = "panel-read";
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-down-read", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let mut device = device_client(ferry.south_port, DEVICE);
    connected(&mut device, DEVICE).await;
    let ids: Vec<String> = (1..=3).map(|i| format!("rn-{boot}-{i}")).collect();
    for id in &ids {
        north.send(&[DEVICE], id, json!({"screen": id}));
    }
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_20, false, &mut inbox, |i| {
        i.handed.len() >= 3
    })
    .await;
    assert_eq!(inbox.seqs(), vec![1, 2, 3]);

    device.confirm(2);
    device.nack(3, "no such screen");
    north
        .expect(SECS_20, "`delivered` ×2 and `failed`", |r| {
            count_with(r, "delivered") == 2 && count_with(r, "failed") == 1
        })
        .await;
    device.read(2);
    north
        .expect(SECS_20, "`read` ×2", |r| count_with(r, "read") == 2)
        .await;
    north.settle(QUIET).await;

    for id in &ids[..2] {
        assert_eq!(
            statuses_of(&north.receipts, id, DEVICE),
            ["stored", "delivered", "read"],
            "{id}"
        );
    }
    assert_eq!(
        statuses_of(&north.receipts, &ids[2], DEVICE),
        ["stored", "failed"],
        "{}",
        ids[2]
    );
    let failed = north
        .receipts
        .iter()
        .find(|r| status(r) == "failed")
        .expect("checked");
    assert_eq!(failed["seq"], 3, "{failed}");
    let reason = failed["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with("nacked") && reason.contains("no such screen"),
        "`failed` reason: {failed}"
    );
    let read = seqs_with(&north.receipts, "read");
    assert_eq!(read.get(&key(&ids[0], DEVICE)), Some(&1));
    assert_eq!(read.get(&key(&ids[1], DEVICE)), Some(&2));

    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM dead_letter WHERE direction = 'down' AND device = ?1 \
             AND msg_id = ?2 AND reason LIKE 'nacked%'",
            [DEVICE, ids[2].as_str()]
        ),
        1,
        "a dead letter for the nacked delivery"
    );
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM dead_letter", []),
        1,
        "only the nacked delivery is a dead letter"
    );
    let state = |seq: i64| -> String {
        ferry
            .db()
            .query_row(
                "SELECT state FROM down_delivery WHERE device = ?1 AND seq = ?2",
                rusqlite::params![DEVICE, seq],
                |r| r.get(0),
            )
            .expect("delivery row")
    };
    assert_eq!(
        (state(1), state(2), state(3)),
        ("read".into(), "read".into(), "dead".into())
    );
    assert_eq!(
        ferry.query_i64("SELECT read_upto FROM devices WHERE device = ?1", [DEVICE]),
        2
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = ?1",
            [DEVICE]
        ),
        3,
        "the nacked delivery counts as handled"
    );
}
