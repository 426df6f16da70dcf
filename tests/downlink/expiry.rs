//! Deliveries that end without reaching their device: past the queue cap
//! or the ttl they expire, keeping their content.

use super::*;

both_modes!(past_the_queue_cap_the_oldest_deliveries_expire_as_tombstones_and_keep_their_content);
async fn past_the_queue_cap_the_oldest_deliveries_expire_as_tombstones_and_keep_their_content(
    mode: Mode,
) {
    const DEVICE: &str = "panel-cap";
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-down-cap", mq.port).with(|c| c.downlink.queue_cap = 3),
    );
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let ids: Vec<String> = (1..=5).map(|i| format!("cap-{boot}-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        north.send(&[DEVICE], id, json!({"order": i + 1}));
    }
    north
        .expect(SECS_30, "5 `stored` and 2 `expired`", |r| {
            count_with(r, "stored") == 5 && count_with(r, "expired") == 2
        })
        .await;
    north.settle(QUIET).await;
    let expired = seqs_with(&north.receipts, "expired");
    assert_eq!(
        expired,
        HashMap::from([(key(&ids[0], DEVICE), 1), (key(&ids[1], DEVICE), 2)]),
        "the two oldest expire"
    );
    for id in &ids[..2] {
        assert_eq!(
            ferry.query_i64(
                "SELECT count(*) FROM down_message WHERE msg_id = ?1 AND instr(body, ?2) > 0",
                [id.as_str(), "\"order\""]
            ),
            1,
            "{id}: its content is still stored"
        );
    }

    let mut device = device_client(ferry.south_port, DEVICE);
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_20, true, &mut inbox, |i| {
        i.handed.len() >= 5
    })
    .await;
    assert_eq!(inbox.seqs(), vec![1, 2, 3, 4, 5]);
    for (m, id) in inbox.handed.iter().zip(&ids).take(2) {
        assert_eq!(
            (m.msg_id.as_str(), m.status.as_deref(), m.body.is_none()),
            (id.as_str(), Some("expired"), true),
            "a tombstone: {m:?}"
        );
    }
    for (i, (m, id)) in inbox.handed.iter().zip(&ids).enumerate().skip(2) {
        assert_eq!(m.msg_id, *id);
        let payload = m.body.as_ref().map(|b| b["payload"].clone());
        assert_eq!(payload, Some(json!({"order": i + 1})), "{m:?}");
    }
    north
        .expect(SECS_20, "`delivered` ×3", |r| {
            count_with(r, "delivered") == 3
        })
        .await;
    north.settle(QUIET).await;
    let delivered = seqs_with(&north.receipts, "delivered");
    assert!(
        ids[..2]
            .iter()
            .all(|id| !delivered.contains_key(&key(id, DEVICE))),
        "an expired delivery reported `delivered`: {delivered:?}"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery WHERE device = ?1 AND state = 'expired'",
            [DEVICE]
        ),
        2
    );
}

both_modes!(a_downlink_whose_ttl_passes_while_its_device_is_offline_expires_and_keeps_its_content);
async fn a_downlink_whose_ttl_passes_while_its_device_is_offline_expires_and_keeps_its_content(
    mode: Mode,
) {
    let (late, away) = ("panel-late", "panel-away");
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-down-ttl", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let short = format!("ttl-{boot}-short");
    let keep = format!("ttl-{boot}-keep");
    north.client.send_down(
        &[late, away],
        json!({"msg_id": short, "payload": "gone soon", "ttl_s": 1}),
    );
    north.send(&[late], &keep, json!("no ttl"));
    north
        .expect(SECS_20, "3 `stored` receipts", |r| {
            count_with(r, "stored") == 3
        })
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // panel-late connects after the ttl: a tombstone, then the other message.
    let mut device = device_client(ferry.south_port, late);
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_20, true, &mut inbox, |i| {
        i.handed.len() >= 2
    })
    .await;
    assert_eq!(inbox.seqs(), vec![1, 2]);
    assert_eq!(
        (
            inbox.handed[0].msg_id.as_str(),
            inbox.handed[0].status.as_deref()
        ),
        (short.as_str(), Some("expired")),
        "{:?}",
        inbox.handed[0]
    );
    assert!(inbox.handed[0].body.is_none());
    assert_eq!(inbox.handed[1].msg_id, keep);

    // panel-away never connects: the periodic sweep expires its delivery.
    north
        .expect(
            SECS_20,
            "`expired` for both deliveries and `delivered`",
            |r| {
                let e = seqs_with(r, "expired");
                e.contains_key(&key(&short, late))
                    && e.contains_key(&key(&short, away))
                    && count_with(r, "delivered") == 1
            },
        )
        .await;
    north.settle(QUIET).await;
    assert_eq!(
        statuses_of(&north.receipts, &short, late),
        ["stored", "expired"]
    );
    assert_eq!(
        statuses_of(&north.receipts, &short, away),
        ["stored", "expired"]
    );
    assert_eq!(
        statuses_of(&north.receipts, &keep, late),
        ["stored", "delivered"]
    );
    let body: Vec<u8> = ferry
        .db()
        .query_row(
            "SELECT body FROM down_message WHERE msg_id = ?1",
            [&short],
            |r| r.get(0),
        )
        .expect("the expired message is still stored");
    let body: Value = serde_json::from_slice(&body).expect("stored body is JSON");
    assert_eq!(body["payload"], "gone soon", "{body}");
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery d JOIN down_message m ON m.id = d.message_id \
             WHERE m.msg_id = ?1 AND d.state = 'expired'",
            [&short]
        ),
        2
    );
}
