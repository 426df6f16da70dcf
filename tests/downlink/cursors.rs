//! The cursors a device sends (docs/PROTOCOL.md, "Downlink batches"): a
//! pull past the head or from behind the cursor, and the confirm of what
//! such a pull replayed. A device's numbers are its own word: none of them
//! may wrap, move a cursor past what was sent, or hold up the next batch.

use super::*;

/// The downlink queue of `device` with `n` messages, all stored.
async fn queued(north: &mut North, device: &str, prefix: &str, n: usize) {
    let boot = boot_id();
    for i in 1..=n {
        north.send(&[device], &format!("{prefix}-{boot}-{i}"), json!(i));
    }
    north
        .expect(SECS_20, "`stored` receipts", |r| {
            count_with(r, "stored") == n
        })
        .await;
}

/// Takes the first batch, checks it is `seqs`, and confirms its last seq,
/// waiting for the cursor to get there.
async fn take_and_confirm(device: &mut BareClient, ferry: &Ferry, id: &str, seqs: &[u64]) {
    let batch = device.next_json(SECS_20).await.expect("a batch");
    assert_eq!(batch_seqs(&batch), seqs);
    let last = *seqs.last().expect("non-empty");
    device
        .publish(
            &device_topics(id).confirm(),
            json!({ "upto": last }).to_string(),
        )
        .await;
    let cursor = || ferry.query_i64("SELECT delivered_upto FROM devices WHERE device = ?1", [id]);
    eventually(SECS_20, "the cursor reaches the confirm", || {
        cursor() == last as i64
    })
    .await;
}

both_modes!(a_pull_after_a_seq_past_the_head_is_answered_with_an_empty_batch);
async fn a_pull_after_a_seq_past_the_head_is_answered_with_an_empty_batch(mode: Mode) {
    const DEVICE: &str = "panel-far";
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-down-far", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    queued(&mut north, DEVICE, "far", 3).await;
    let mut device = BareClient::device(&ferry, DEVICE).await;
    take_and_confirm(&mut device, &ferry, DEVICE, &[1, 2, 3]).await;

    let pull = device_topics(DEVICE).pull();
    for after in [i64::MAX as u64, 1 << 63, u64::MAX - 1, u64::MAX] {
        device
            .publish(&pull, json!({ "after": after }).to_string())
            .await;
        let batch = device
            .next_json(SECS_20)
            .await
            .unwrap_or_else(|| panic!("no answer to a pull after {after}"));
        assert_eq!(
            batch,
            json!({"messages": [], "more": false}),
            "a pull after {after} is past seq 3: nothing to send"
        );
    }
    // Past u64, negative or fractional: not a seq, ignored as malformed.
    for after in ["18446744073709551616", "-1", "1.5"] {
        device
            .publish(&pull, format!(r#"{{"after": {after}}}"#))
            .await;
    }
    assert!(
        device.next_json(QUIET).await.is_none(),
        "a pull that is not a seq is not answered"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = ?1",
            [DEVICE]
        ),
        3,
        "no pull moved the cursor"
    );
    assert!(
        ferry.log().contains("ignoring a malformed control message"),
        "the malformed pulls are logged"
    );
}

both_modes!(a_confirm_of_a_replayed_batch_releases_it_and_the_next_downlink_comes_at_once);
async fn a_confirm_of_a_replayed_batch_releases_it_and_the_next_downlink_comes_at_once(mode: Mode) {
    const DEVICE: &str = "panel-replay";
    /// Long, so that a batch released only by the timeout cannot pass for
    /// one released by the confirm.
    const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-down-replay", mq.port)
            .with(|c| c.downlink.confirm_timeout_ms = CONFIRM_TIMEOUT.as_millis() as u64),
    );
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    queued(&mut north, DEVICE, "rp", 3).await;
    let mut device = BareClient::device(&ferry, DEVICE).await;
    take_and_confirm(&mut device, &ferry, DEVICE, &[1, 2, 3]).await;

    // The device asks for everything again, and confirms the replay.
    let topics = device_topics(DEVICE);
    device
        .publish(&topics.pull(), json!({"after": 0}).to_string())
        .await;
    let replay = device.next_json(SECS_20).await.expect("the replay");
    assert_eq!(batch_seqs(&replay), vec![1, 2, 3]);
    device
        .publish(&topics.confirm(), json!({"upto": 3}).to_string())
        .await;
    // The confirm is ordered before the downlink by the time it takes the
    // backend's publish to reach ferry; either order must release it.
    let sent = Instant::now();
    north.send(&[DEVICE], &format!("rp-{}-new", boot_id()), json!("new"));
    let batch = device
        .next_json(CONFIRM_TIMEOUT)
        .await
        .expect("the new downlink");
    let took = sent.elapsed();
    assert_eq!(batch_seqs(&batch), vec![4], "{batch}");
    assert!(
        took < Duration::from_secs(5),
        "the new downlink took {took:?}: the replay was released by the {CONFIRM_TIMEOUT:?} timeout, not by its confirm"
    );
    assert!(
        !ferry.log().contains("not confirmed in time"),
        "a confirmed replay was taken for unconfirmed:\n{}",
        ferry.log_tail()
    );
    device
        .publish(&topics.confirm(), json!({"upto": 4}).to_string())
        .await;
    north
        .expect(SECS_20, "`delivered` for the new downlink", |r| {
            count_with(r, "delivered") == 4
        })
        .await;
}

both_modes!(a_confirm_or_nack_far_ahead_reaches_only_what_the_device_was_sent);
async fn a_confirm_or_nack_far_ahead_reaches_only_what_the_device_was_sent(mode: Mode) {
    const DEVICE: &str = "panel-ahead";
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-down-ahead", mq.port).with(|c| {
            c.downlink.batch_size = 2;
            c.downlink.confirm_timeout_ms = 30_000;
        }),
    );
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    queued(&mut north, DEVICE, "ah", 4).await;
    let mut device = BareClient::device(&ferry, DEVICE).await;
    let first = device.next_json(SECS_20).await.expect("the first batch");
    assert_eq!(batch_seqs(&first), vec![1, 2]);

    // Seq 4 was never sent: a nack of it refuses nothing, and a confirm
    // as far as a u64 goes covers what the device has, 1 and 2.
    let topics = device_topics(DEVICE);
    device
        .publish(
            &topics.nack(),
            json!({"seq": 4, "reason": "never seen"}).to_string(),
        )
        .await;
    device
        .publish(&topics.confirm(), json!({"upto": u64::MAX}).to_string())
        .await;
    let next = device.next_json(SECS_20).await.expect("the second batch");
    assert_eq!(
        batch_seqs(&next),
        vec![3, 4],
        "3 and 4 are still to deliver"
    );
    north.settle(QUIET).await;
    assert_eq!(
        count_with(&north.receipts, "delivered"),
        2,
        "`delivered` for 1 and 2 only"
    );
    assert_eq!(count_with(&north.receipts, "failed"), 0, "nothing nacked");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        0,
        "no dead letter for an unsent seq"
    );
    device
        .publish(&topics.confirm(), json!({"upto": 4}).to_string())
        .await;
    north
        .expect(SECS_20, "4 `delivered` receipts", |r| {
            count_with(r, "delivered") == 4
        })
        .await;
}
