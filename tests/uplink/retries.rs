//! The backend's `nack`: without retry the message fails into the dead
//! letters; with retry it is resent with the same seq until acked.

use super::*;

both_modes!(a_nack_without_retry_fails_the_message_and_dead_letters_it);
async fn a_nack_without_retry_fails_the_message_and_dead_letters_it(mode: Mode) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-nack", mq.port));
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

both_modes!(a_nack_with_retry_resends_the_same_seq_until_the_backend_acks);
async fn a_nack_with_retry_resends_the_same_seq_until_the_backend_acks(mode: Mode) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-retry", mq.port));
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
