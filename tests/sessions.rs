//! Persistent sessions on the embedded broker (vendor/README.md, patch
//! 44), seen by a bare MQTT 3.1.1 client that acknowledges only what it is
//! told to: a device that connects without a clean session keeps its
//! subscriptions to its own `ack` and `inbox` across a reconnect, is told
//! its session is present, and gets again the receipts it had not
//! acknowledged when its connection dropped, each under the packet id it
//! was first sent with; a clean session gets none of
//! it; a session is gone once its expiry (`south.max_session_expiry_s`)
//! has passed.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::{free_port, Ferry, FerryOpts, RawMqtt};

const SECS_10: Duration = Duration::from_secs(10);

/// A CONNECT as `id` with keep-alive 60 and this clean session flag; the
/// client and its CONNACK.
async fn connect(port: u16, id: &str, clean_session: bool) -> (RawMqtt, rumqttc::ConnAck) {
    RawMqtt::connect_session(port, id, clean_session).await
}

/// The next receipt PUBLISH, not acknowledged: its packet, payload parsed.
async fn next_receipt(raw: &mut RawMqtt) -> Option<(rumqttc::Publish, Value)> {
    receipt_within(raw, SECS_10).await
}

/// The next receipt PUBLISH within `timeout`, not acknowledged.
async fn receipt_within(raw: &mut RawMqtt, timeout: Duration) -> Option<(rumqttc::Publish, Value)> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match raw.recv(left).await? {
            rumqttc::Packet::Publish(p) => {
                let v = serde_json::from_slice(&p.payload).expect("a receipt is JSON");
                return Some((p, v));
            }
            _ => continue,
        }
    }
}

fn envelope(msg_id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"msg_id": msg_id, "payload": {"t": 1}})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_not_acknowledged_before_a_drop_comes_again_after_a_reconnect_with_its_session() {
    let ferry = Ferry::start(FerryOpts::new("gw-sess", free_port()));
    let (mut raw, ack) = connect(ferry.south_port, "sess-a", false).await;
    assert!(!ack.session_present, "nothing to resume the first time");
    raw.subscribe(&["devices/sess-a/ack".to_string()]).await;
    let publish = raw.publish("devices/sess-a/up/t", envelope("m-1"));
    raw.send(publish).await;
    let (first, receipt) = next_receipt(&mut raw).await.expect("a receipt");
    assert_eq!(receipt["msg_id"], "m-1");
    assert_eq!(receipt["status"], "stored");
    assert!(!first.dup);
    // Gone without acknowledging the receipt, or saying DISCONNECT.
    drop(raw);

    let (mut raw, ack) = connect(ferry.south_port, "sess-a", false).await;
    assert!(ack.session_present, "the session is resumed");
    let (again, receipt) = next_receipt(&mut raw)
        .await
        .expect("the unacknowledged receipt is sent again");
    assert_eq!(receipt["msg_id"], "m-1", "{receipt}");
    assert!(again.dup, "sent again, marked DUP");
    raw.send(rumqttc::Packet::PubAck(rumqttc::PubAck::new(again.pkid)))
        .await;
    // The subscription is back without a SUBSCRIBE: a new uplink's receipt
    // arrives.
    let publish = raw.publish("devices/sess-a/up/t", envelope("m-2"));
    raw.send(publish).await;
    let (_, receipt) = next_receipt(&mut raw)
        .await
        .expect("a receipt on the kept subscription");
    assert_eq!(receipt["msg_id"], "m-2", "{receipt}");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink", []),
        2,
        "each stored once"
    );
}

/// [MQTT-4.4.0-1]: after a reconnect with the session, an unacknowledged
/// PUBLISH is sent again under its original packet id (a client that
/// deduplicates by packet id must see the same id), marked DUP; the ids of
/// new ones go on after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_receipt_comes_again_under_its_original_packet_id() {
    let ferry = Ferry::start(FerryOpts::new("gw-pkid", free_port()));
    let (mut raw, _) = connect(ferry.south_port, "sess-p", false).await;
    raw.subscribe(&["devices/sess-p/ack".to_string()]).await;
    let mut sent = Vec::new();
    for m in ["m-1", "m-2"] {
        let publish = raw.publish("devices/sess-p/up/t", envelope(m));
        raw.send(publish).await;
        let (p, receipt) = next_receipt(&mut raw).await.expect("a receipt");
        assert_eq!(receipt["msg_id"], m, "{receipt}");
        sent.push(p);
    }
    assert_ne!(sent[0].pkid, sent[1].pkid);
    // The first acknowledged, the second not; then gone.
    raw.send(rumqttc::Packet::PubAck(rumqttc::PubAck::new(sent[0].pkid)))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(raw);

    let (mut raw, ack) = connect(ferry.south_port, "sess-p", false).await;
    assert!(ack.session_present);
    let (again, receipt) = next_receipt(&mut raw)
        .await
        .expect("the unacknowledged receipt is sent again");
    assert_eq!(receipt["msg_id"], "m-2", "{receipt}");
    assert_eq!(
        again.pkid, sent[1].pkid,
        "sent again under its original packet id, not a new one"
    );
    assert!(again.dup, "marked DUP");
    raw.send(rumqttc::Packet::PubAck(rumqttc::PubAck::new(again.pkid)))
        .await;
    let publish = raw.publish("devices/sess-p/up/t", envelope("m-3"));
    raw.send(publish).await;
    let (next, receipt) = next_receipt(&mut raw).await.expect("a new receipt");
    assert_eq!(receipt["msg_id"], "m-3", "{receipt}");
    assert!(!next.dup, "a first send is not DUP");
    assert_ne!(next.pkid, again.pkid, "a new id for a new receipt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_session_resumes_nothing_and_leaves_nothing() {
    let ferry = Ferry::start(FerryOpts::new("gw-clean", free_port()));
    let (mut raw, _) = connect(ferry.south_port, "sess-c", false).await;
    raw.subscribe(&["devices/sess-c/ack".to_string()]).await;
    drop(raw);
    // A clean session ends the kept one.
    let (raw, ack) = connect(ferry.south_port, "sess-c", true).await;
    assert!(!ack.session_present);
    drop(raw);
    let (mut raw, ack) = connect(ferry.south_port, "sess-c", false).await;
    assert!(!ack.session_present, "the clean session left none behind");
    let publish = raw.publish("devices/sess-c/up/t", envelope("c-1"));
    raw.send(publish).await;
    // A stored receipt comes within milliseconds when it comes at all.
    let receipt = receipt_within(&mut raw, Duration::from_secs(1)).await;
    assert!(
        receipt.is_none(),
        "no subscription, no receipt: {receipt:?}"
    );
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM uplink", []), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_gone_once_its_expiry_has_passed() {
    let ferry = Ferry::start(
        FerryOpts::new("gw-expiry", free_port()).with(|c| c.south.max_session_expiry_s = 1),
    );
    let (mut raw, _) = connect(ferry.south_port, "sess-e", false).await;
    raw.subscribe(&["devices/sess-e/ack".to_string()]).await;
    drop(raw);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (_raw, ack) = connect(ferry.south_port, "sess-e", false).await;
    assert!(!ack.session_present, "the session expired after 1 s");
    let log = ferry.log();
    assert!(
        log.contains("sessions_expired"),
        "the expired session was freed:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_subscribed_once_gets_its_inbox_after_a_reconnect_with_its_session() {
    use ferry::client::backend::{BackendClient, BackendOptions};
    let mq = crate::support::Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-sess-inbox", mq.port));
    let backend =
        BackendClient::connect(BackendOptions::new("127.0.0.1", mq.port, "gw-sess-inbox"));
    let (mut raw, _) = connect(ferry.south_port, "sess-i", false).await;
    raw.subscribe(&["devices/sess-i/ack".into(), "devices/sess-i/inbox".into()])
        .await;
    drop(raw);
    // Sent while the device is away.
    backend.send_down(&["sess-i"], json!({"msg_id": "d-1", "payload": "shift B"}));
    crate::support::receipts::eventually(SECS_10, "the downlink is stored", || {
        ferry.query_i64(
            "SELECT COUNT(*) FROM down_delivery WHERE device = 'sess-i'",
            [],
        ) == 1
    })
    .await;
    // The firmware subscribes once, at its first boot: not now.
    let (mut raw, ack) = connect(ferry.south_port, "sess-i", false).await;
    assert!(ack.session_present);
    let (batch, body) = next_receipt(&mut raw)
        .await
        .expect("the inbox batch, on the kept subscription");
    assert_eq!(batch.topic, "devices/sess-i/inbox");
    assert_eq!(body["messages"][0]["msg_id"], "d-1", "{body}");
}
