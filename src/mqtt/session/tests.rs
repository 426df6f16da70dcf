//! The session against a broker end written by hand.

use std::time::Duration;

use rumqttc::{Packet, PubAck, Publish, QoS, SubAck, SubscribeReasonCode};

use super::super::by_hand::ByHand;
use super::super::{Event, Options, Session};

/// A session on `in/#` with manual acks and no replay, `inflight` wide,
/// `keep_alive` apart (30 s: none in a test), connected and subscribed to
/// a broker end written by hand; with that end and the connection's epoch.
async fn subscribed(
    name: &str,
    inflight: u16,
    keep_alive: Duration,
) -> (
    Session<u32>,
    tokio::sync::mpsc::Receiver<Event<u32>>,
    ByHand,
    u64,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut opts = Options::new("test", "127.0.0.1", port, name);
    opts.auto_ack = false;
    opts.replay = false;
    opts.inflight = inflight;
    opts.keep_alive = keep_alive;
    opts.subscriptions = vec!["in/#".into()];
    let (session, mut events) = Session::<u32>::start(opts);

    let broker = serve(&listener).await;
    let up = tokio::time::timeout(Duration::from_secs(5), events.recv()).await;
    let Ok(Some(Event::Up { epoch, .. })) = up else {
        panic!("not up: {up:?}");
    };
    (session, events, broker, epoch)
}

/// Accepts the session on `listener` and grants its SUBSCRIBE.
async fn serve(listener: &tokio::net::TcpListener) -> ByHand {
    let mut broker = ByHand::accept(listener, false).await;
    let Some(Packet::Subscribe(subscribe)) = broker.read().await else {
        panic!("no SUBSCRIBE");
    };
    let granted = vec![SubscribeReasonCode::Success(QoS::AtLeastOnce)];
    broker
        .write(|b| SubAck::new(subscribe.pkid, granted).write(b))
        .await;
    broker
}

/// Acks the owner releases while rumqttc's request queue is full (its own
/// window of publishes full, the broker not acknowledging them, and the
/// owner's fire-and-forget sends queued behind) wait, and go out in
/// receive order once the broker acknowledges again. Dropped, each would
/// hold one of the broker's inflight slots for good.
#[tokio::test]
async fn acks_wait_for_room_in_a_full_request_queue_and_keep_their_order() {
    let (session, mut events, mut broker, _) =
        subscribed("acker", 10, Duration::from_secs(30)).await;

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

/// An owner that falls behind (here: reads no events for 3.5 keep-alives
/// while 6,000 of its publishes are acknowledged) must not silence the
/// link: the poller polls on, so rumqttc keeps sending its pings (a broker
/// drops a client silent for 1.5 keep-alives) and reading the answers.
/// Before, the session stopped taking the poller's events once its owner's
/// queue was full, the poller stopped polling, and no ping went out.
#[tokio::test]
async fn a_session_whose_owner_is_behind_keeps_its_link_alive() {
    let (session, mut events, mut broker, epoch) =
        subscribed("behind", 10_000, Duration::from_secs(1)).await;

    const PUBLISHES: u32 = 6_000;
    for tag in 0..PUBLISHES {
        assert!(session.publish("out/x".into(), b"x".to_vec().into(), false, tag, epoch));
    }
    // Every one acknowledged; the owner reads none of the `Published`.
    let mut acked = 0;
    while acked < PUBLISHES {
        match broker.read().await {
            Some(Packet::Publish(p)) => {
                broker.write(|b| PubAck::new(p.pkid).write(b)).await;
                acked += 1;
            }
            Some(Packet::PingReq) => broker.write(|b| rumqttc::PingResp.write(b)).await,
            other => panic!("{other:?} after {acked} publishes"),
        }
    }
    let mut pings = 0;
    let until = tokio::time::Instant::now() + Duration::from_millis(3500);
    while tokio::time::Instant::now() < until {
        match tokio::time::timeout_at(until, broker.read()).await {
            Ok(Some(Packet::PingReq)) => {
                pings += 1;
                broker.write(|b| rumqttc::PingResp.write(b)).await;
            }
            Ok(Some(other)) => panic!("{other:?}"),
            Ok(None) | Err(_) => {}
        }
    }
    assert!(
        pings >= 2,
        "{pings} pings in 3.5 keep-alives while the owner was behind"
    );

    // The owner catches up: every publish acknowledged, in order, on the
    // same connection.
    let mut published = Vec::new();
    while published.len() < PUBLISHES as usize {
        match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
            Ok(Some(Event::Published(tag))) => published.push(tag),
            other => panic!("{other:?} after {} acknowledged", published.len()),
        }
    }
    assert_eq!(published, (0..PUBLISHES).collect::<Vec<_>>());
}

mod reach;
mod stall;
