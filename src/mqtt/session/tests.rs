//! The session against a broker end written by hand.

use std::time::Duration;

use rumqttc::{Packet, PubAck, Publish, QoS, SubAck, SubscribeReasonCode};

use super::super::by_hand::ByHand;
use super::super::{Event, Options, Session};

/// Acks the owner releases while rumqttc's request queue is full (its own
/// window of publishes full, the broker not acknowledging them, and the
/// owner's fire-and-forget sends queued behind) wait, and go out in
/// receive order once the broker acknowledges again. Dropped, each would
/// hold one of the broker's inflight slots for good.
#[tokio::test]
async fn acks_wait_for_room_in_a_full_request_queue_and_keep_their_order() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut opts = Options::new("test", "127.0.0.1", port, "acker");
    opts.auto_ack = false;
    opts.replay = false;
    opts.inflight = 10;
    opts.subscriptions = vec!["in/#".into()];
    let (session, mut events) = Session::<u32>::start(opts);

    let mut broker = ByHand::accept(&listener, false).await;
    let Some(Packet::Subscribe(subscribe)) = broker.read().await else {
        panic!("no SUBSCRIBE");
    };
    let granted = vec![SubscribeReasonCode::Success(QoS::AtLeastOnce)];
    broker
        .write(|b| SubAck::new(subscribe.pkid, granted).write(b))
        .await;
    let up = tokio::time::timeout(Duration::from_secs(5), events.recv()).await;
    assert!(matches!(up, Ok(Some(Event::Up { .. }))), "{up:?}");

    // Fill the window (written, never acknowledged), then the queue.
    let mut sent = 0;
    while session.send("out/x", b"x".to_vec(), false) {
        sent += 1;
    }
    let mut window = Vec::new();
    for _ in 0..10 {
        match broker.read().await {
            Some(Packet::Publish(p)) => window.push(p.pkid),
            other => panic!("not a publish: {other:?}"),
        }
    }
    while session.send("out/x", b"x".to_vec(), false) {
        sent += 1;
    }
    assert!(sent > 10, "the queue took {sent}");
    for pkid in 1..=5u16 {
        let mut publish = Publish::new(format!("in/{pkid}"), QoS::AtLeastOnce, b"m".to_vec());
        publish.pkid = pkid;
        broker.write(|b| publish.write(b)).await;
    }
    for _ in 1..=5 {
        let message = loop {
            match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
                Ok(Some(Event::Message(m))) => break m,
                Ok(Some(_)) => {}
                other => panic!("no message: {other:?}"),
            }
        };
        session.ack(message.token);
    }
    // Let the session try (and fail) to queue them.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The broker acknowledges everything from now on.
    for pkid in window {
        broker.write(|b| PubAck::new(pkid).write(b)).await;
    }
    let mut acked = Vec::new();
    let mut written = 10;
    while acked.len() < 5 {
        match broker.read().await {
            Some(Packet::Publish(p)) => {
                written += 1;
                broker.write(|b| PubAck::new(p.pkid).write(b)).await;
            }
            Some(Packet::PubAck(ack)) => acked.push(ack.pkid),
            Some(_) => {}
            None => panic!("silence; acks so far {acked:?}, {written} of {sent} publishes"),
        }
    }
    assert_eq!(acked, [1, 2, 3, 4, 5]);
}
