//! Inbox batches: a backlog sent in order one confirmed batch at a time,
//! resumed from the confirmed cursor after a crash, sent again after a
//! reconnect or an unconfirmed timeout.

use super::*;

both_modes!(a_thousand_downlinks_for_a_new_device_are_stored_then_sent_in_order_one_confirmed_batch_at_a_time);
async fn a_thousand_downlinks_for_a_new_device_are_stored_then_sent_in_order_one_confirmed_batch_at_a_time(
    mode: Mode,
) {
    const N: u64 = 1000;
    const DEVICE: &str = "panel-backlog";
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-down-backlog", mq.port).with(|c| {
            c.downlink.batch_size = 200;
            c.downlink.confirm_timeout_ms = 10_000;
        }),
    );
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let mut sent: HashMap<String, u64> = HashMap::new();
    for i in 1..=N {
        let id = format!("bl-{boot}-{i:04}");
        north.send(&[DEVICE], &id, json!({"n": i}));
        sent.insert(id, i);
    }
    north
        .expect(SECS_60, "1000 `stored` receipts", |r| {
            count_with(r, "stored") == N as usize
        })
        .await;
    let stored = seqs_with(&north.receipts, "stored");
    let mut seq_to_id: HashMap<u64, String> = HashMap::new();
    for ((msg_id, device), seq) in &stored {
        assert_eq!(device, DEVICE, "`stored` receipt for another device");
        assert!(sent.contains_key(msg_id), "receipt for unknown {msg_id}");
        assert!(
            seq_to_id.insert(*seq, msg_id.clone()).is_none(),
            "seq {seq} assigned twice"
        );
    }
    assert_eq!(
        seq_to_id.keys().copied().collect::<BTreeSet<_>>(),
        (1..=N).collect::<BTreeSet<_>>(),
        "the device's seqs are 1..=1000"
    );
    assert_eq!(
        count_with(&north.receipts, "delivered"),
        0,
        "`delivered` before the device ever connected"
    );

    // A device that holds each confirm back and checks nothing else comes.
    let mut device = BareClient::device(&ferry, DEVICE).await;
    let mut next = 1u64;
    let mut batches = 0;
    while next <= N {
        let batch = device
            .next_json(SECS_30)
            .await
            .unwrap_or_else(|| panic!("no batch from seq {next} within 30 s"));
        let seqs = batch_seqs(&batch);
        batches += 1;
        assert!(
            seqs.len() <= 200,
            "batch of {} > batch_size 200",
            seqs.len()
        );
        assert_eq!(
            seqs[0],
            next,
            "batch {batches} starts at {} after a confirm up to {}",
            seqs[0],
            next - 1
        );
        for m in batch["messages"].as_array().expect("checked") {
            let seq = m["seq"].as_u64().expect("checked");
            let msg_id = m["msg_id"].as_str().unwrap_or("");
            assert_eq!(Some(msg_id), seq_to_id.get(&seq).map(String::as_str), "{m}");
            assert_eq!(m["payload"]["n"].as_u64(), sent.get(msg_id).copied(), "{m}");
            assert!(m["ts"].is_u64(), "inbox entry without ts: {m}");
        }
        let last = *seqs.last().expect("non-empty");
        assert_eq!(batch["more"], last < N, "`more` after seq {last} of {N}");
        if let Some(early) = device.next_json(Duration::from_millis(300)).await {
            panic!(
                "a batch arrived while the one up to {last} was unconfirmed: {}",
                batch_seqs(&early).first().copied().unwrap_or(0)
            );
        }
        device
            .publish(
                &device_topics(DEVICE).confirm(),
                json!({ "upto": last }).to_string(),
            )
            .await;
        next = last + 1;
    }
    assert!(batches >= 5, "1000 messages in {batches} batches of ≤ 200");
    assert!(
        device.next_json(QUIET).await.is_none(),
        "a batch after everything was confirmed"
    );

    north
        .expect(SECS_30, "1000 `delivered` receipts", |r| {
            count_with(r, "delivered") == N as usize
        })
        .await;
    let delivered = seqs_with(&north.receipts, "delivered");
    for (k, seq) in &stored {
        assert_eq!(delivered.get(k), Some(seq), "`delivered` seq for {k:?}");
        let statuses = statuses_of(&north.receipts, &k.0, &k.1);
        let first_delivered = statuses.iter().position(|s| s == "delivered");
        assert!(
            statuses.iter().position(|s| s == "stored") < first_delivered,
            "{k:?}: receipts out of state order: {statuses:?}"
        );
    }
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = ?1",
            [DEVICE]
        ),
        N as i64
    );
}

both_modes!(a_catch_up_cut_by_sigkill_resumes_after_restart_from_the_confirmed_cursor);
async fn a_catch_up_cut_by_sigkill_resumes_after_restart_from_the_confirmed_cursor(mode: Mode) {
    const N: u64 = 250;
    const BATCH: u64 = 50;
    const DEVICE: &str = "panel-crash";
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-down-crash", mq.port).with(|c| {
            c.downlink.batch_size = 50;
            c.downlink.confirm_timeout_ms = 10_000;
        }),
    );
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    for i in 1..=N {
        north.send(&[DEVICE], &format!("cr-{boot}-{i:04}"), json!(i));
    }
    north
        .expect(SECS_60, "250 `stored` receipts", |r| {
            count_with(r, "stored") == N as usize
        })
        .await;
    let confirm_topic = device_topics(DEVICE).confirm();

    // Batches 1 and 2 confirmed, batch 3 received and left unconfirmed.
    let mut device = BareClient::device(&ferry, DEVICE).await;
    let mut received: Vec<u64> = Vec::new();
    for b in 1..=3u64 {
        let batch = device
            .next_json(SECS_30)
            .await
            .unwrap_or_else(|| panic!("no batch {b} within 30 s"));
        let seqs = batch_seqs(&batch);
        assert_eq!(
            (seqs[0], seqs.len() as u64),
            ((b - 1) * BATCH + 1, BATCH),
            "batch {b}"
        );
        received.extend(&seqs);
        if b < 3 {
            device
                .publish(&confirm_topic, json!({ "upto": b * BATCH }).to_string())
                .await;
        }
    }
    // Batch 3 is only read after the confirm of batch 2 was committed.
    let cursor = ferry.query_i64(
        "SELECT delivered_upto FROM devices WHERE device = ?1",
        [DEVICE],
    );
    assert_eq!(cursor, 2 * BATCH as i64, "confirmed cursor before the kill");
    let unconfirmed = (2 * BATCH + 1)..=(3 * BATCH);

    ferry.kill();
    ferry.restart();

    // The device reconnects by itself and confirms everything it gets.
    let mut after_restart: Vec<Vec<u64>> = Vec::new();
    while received.iter().max() < Some(&N) {
        let batch = device.next_json(SECS_30).await.unwrap_or_else(|| {
            panic!(
                "no batch after restart within 30 s (device resubscribed {} times, got {after_restart:?})",
                device.subacks()
            )
        });
        let seqs = batch_seqs(&batch);
        let last = *seqs.last().expect("non-empty");
        received.extend(&seqs);
        after_restart.push(seqs);
        device
            .publish(&confirm_topic, json!({ "upto": last }).to_string())
            .await;
    }
    assert_eq!(
        after_restart[0][0],
        2 * BATCH + 1,
        "the first batch after the restart starts right after the confirmed cursor"
    );
    let distinct: BTreeSet<u64> = received.iter().copied().collect();
    assert_eq!(
        distinct,
        (1..=N).collect::<BTreeSet<_>>(),
        "every seq arrived: no gap"
    );
    let mut seen = HashSet::new();
    for seq in &received {
        if !seen.insert(*seq) {
            assert!(
                unconfirmed.contains(seq),
                "seq {seq} arrived twice but was confirmed before the kill ({after_restart:?})"
            );
        }
    }
    eventually(SECS_20, "the cursor reaches 250", || {
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = ?1",
            [DEVICE],
        ) == N as i64
    })
    .await;
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM down_delivery", []),
        N as i64,
        "nothing queued twice"
    );
    assert!(
        device.next_json(QUIET).await.is_none(),
        "a batch after everything was confirmed"
    );
}

both_modes!(a_device_reconnecting_without_confirming_gets_the_same_batch_and_its_client_drops_the_duplicates);
async fn a_device_reconnecting_without_confirming_gets_the_same_batch_and_its_client_drops_the_duplicates(
    mode: Mode,
) {
    const DEVICE: &str = "panel-redo";
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-down-redo", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let ids: Vec<String> = (1..=5).map(|i| format!("rd-{boot}-{i}")).collect();
    for id in &ids {
        north.send(&[DEVICE], id, json!({"text": id}));
    }
    north
        .expect(SECS_30, "5 `stored` receipts", |r| {
            count_with(r, "stored") == 5
        })
        .await;

    let mut device = device_client(ferry.south_port, DEVICE);
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_30, false, &mut inbox, |i| {
        i.handed.len() >= 5
    })
    .await;
    // On connect the gateway may push the batch and answer the client's
    // pull with it too: let that settle first.
    inbox_until(&mut device, QUIET, false, &mut inbox, |_| false).await;
    assert_eq!(inbox.seqs(), vec![1, 2, 3, 4, 5]);

    // Cut the connection without having confirmed anything: the client
    // reconnects, the same batch comes again and nothing is handed twice.
    cut_off(ferry.south_port, DEVICE).await;
    let mut again = Inbox::default();
    take_inbox(&mut device, SECS_30, false, &mut again, |i| {
        i.disconnects >= 1 && i.connects >= 1 && i.duplicates >= 5
    })
    .await;
    inbox_until(&mut device, QUIET, false, &mut again, |_| false).await;
    assert!(
        again.handed.is_empty(),
        "the client handed messages again after the reconnect: {again:?}"
    );
    assert_eq!(
        again.duplicates % 5,
        0,
        "the same batch of 5, whole, each time it came: {again:?}"
    );
    let handed_ids: Vec<&str> = inbox.handed.iter().map(|m| m.msg_id.as_str()).collect();
    assert_eq!(
        handed_ids,
        ids.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert!(
        inbox
            .handed
            .iter()
            .all(|m| m.body.is_some() && m.status.is_none()),
        "{inbox:?}"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = ?1",
            [DEVICE]
        ),
        0,
        "nothing was confirmed"
    );

    device.confirm(5);
    north
        .expect(SECS_20, "5 `delivered` receipts", |r| {
            count_with(r, "delivered") == 5
        })
        .await;
}

both_modes!(an_unconfirmed_batch_is_sent_again_with_a_growing_timeout_while_the_device_is_online);
async fn an_unconfirmed_batch_is_sent_again_with_a_growing_timeout_while_the_device_is_online(
    mode: Mode,
) {
    const DEVICE: &str = "panel-slow";
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-down-resend", mq.port).with(|c| c.downlink.confirm_timeout_ms = 300),
    );
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    for i in 1..=3 {
        north.send(&[DEVICE], &format!("slow-{boot}-{i}"), json!(i));
    }
    north
        .expect(SECS_20, "3 `stored` receipts", |r| {
            count_with(r, "stored") == 3
        })
        .await;

    // A device that never confirms: the same batch, at growing intervals.
    let mut device = BareClient::device(&ferry, DEVICE).await;
    let mut arrivals = Vec::new();
    for n in 1..=3 {
        let batch = device
            .next_json(SECS_20)
            .await
            .unwrap_or_else(|| panic!("copy {n} of the batch did not come within 20 s"));
        assert_eq!(batch_seqs(&batch), vec![1, 2, 3], "copy {n}");
        arrivals.push(Instant::now());
    }
    let first_gap = arrivals[1] - arrivals[0];
    let second_gap = arrivals[2] - arrivals[1];
    assert!(
        first_gap >= Duration::from_millis(250),
        "resent after {first_gap:?} < confirm_timeout_ms 300"
    );
    assert!(
        second_gap >= Duration::from_millis(500),
        "second resend after {second_gap:?}: the timeout doubles to 600 ms"
    );

    // Offline by its own word: no more resends.
    device
        .publish(
            &device_topics(DEVICE).status(),
            json!({"online": false}).to_string(),
        )
        .await;
    // A copy already on its way may still land.
    let _ = device.next_json(Duration::from_millis(200)).await;
    assert!(
        device
            .next_json(Duration::from_millis(2500))
            .await
            .is_none(),
        "a batch was resent to a device that said it is offline"
    );

    device
        .publish(
            &device_topics(DEVICE).confirm(),
            json!({"upto": 3}).to_string(),
        )
        .await;
    north
        .expect(SECS_20, "3 `delivered` receipts", |r| {
            count_with(r, "delivered") == 3
        })
        .await;
    assert!(
        device.next_json(QUIET).await.is_none(),
        "a batch after everything was confirmed"
    );
}
