//! The stall rule (`stall.rs`) on a whole session, against broker ends
//! written by hand, in paused time: a node that takes the session and
//! acknowledges nothing is left for the next endpoint, named, with what
//! was in flight the owner's again; a node that acknowledges slowly but
//! steadily, and one that is idle, are kept.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::{Packet, PubAck, QoS, SubAck, SubscribeReasonCode};
use tokio::net::TcpListener;
use tokio::sync::mpsc::Receiver;
use tokio::time::Instant;

use super::super::super::by_hand::ByHand;
use super::super::super::{Announce, Endpoint, Event, Options, Problem, Session};

/// `Options::puback_timeout` in these tests.
const BOUND: Duration = Duration::from_secs(10);
/// Longer than anything a test waits for.
const FOREVER: Duration = Duration::from_secs(3600);

/// How a broker end treats the session's publishes: the first `at_once`
/// acknowledged as they come, the rest one every `then_every` (oldest
/// first), or never.
#[derive(Clone, Copy)]
struct Acks {
    at_once: usize,
    then_every: Option<Duration>,
}

const NEVER: Acks = Acks {
    at_once: 0,
    then_every: None,
};
/// The announce (the retained status) only.
const THE_ANNOUNCE: Acks = Acks {
    at_once: 1,
    then_every: None,
};
const ALL: Acks = Acks {
    at_once: usize::MAX,
    then_every: None,
};

/// Serves one connection on `listener` as `acks` says, answering every
/// SUBSCRIBE and PINGREQ, until the client closes it; the topics of the
/// publishes it read.
async fn serve(listener: &TcpListener, acks: Acks) -> Vec<String> {
    let mut broker = ByHand::accept(listener, false).await;
    let mut topics = Vec::new();
    let mut waiting: VecDeque<u16> = VecDeque::new();
    let mut next_ack: Option<Instant> = None;
    loop {
        let packet = tokio::select! {
            packet = broker.read_within(FOREVER) => packet,
            _ = crate::deadlines::sleep_until(next_ack), if next_ack.is_some() => {
                if let Some(pkid) = waiting.pop_front() {
                    broker.write(|b| PubAck::new(pkid).write(b)).await;
                }
                next_ack = acks.then_every.filter(|_| !waiting.is_empty()).map(|d| Instant::now() + d);
                continue;
            }
        };
        match packet {
            None | Some(Packet::Disconnect) => return topics,
            Some(Packet::Subscribe(s)) => {
                let granted = vec![SubscribeReasonCode::Success(QoS::AtLeastOnce); s.filters.len()];
                broker
                    .write(|b| SubAck::new(s.pkid, granted).write(b))
                    .await;
            }
            Some(Packet::PingReq) => broker.write(|b| rumqttc::PingResp.write(b)).await,
            Some(Packet::Publish(p)) => {
                topics.push(p.topic.clone());
                if topics.len() <= acks.at_once {
                    broker.write(|b| PubAck::new(p.pkid).write(b)).await;
                } else if let Some(every) = acks.then_every {
                    waiting.push_back(p.pkid);
                    next_ack = next_ack.or(Some(Instant::now() + every));
                }
            }
            Some(_) => {}
        }
    }
}

/// A gateway-like session (manual acks, no replay, a retained announce,
/// the stall rule at [`BOUND`]) on one broker end per listener, in order.
fn session(listeners: &[&TcpListener]) -> (Session<u32>, Receiver<Event<u32>>) {
    let endpoints: Vec<Endpoint> = listeners
        .iter()
        .map(|l| Endpoint::new("127.0.0.1", l.local_addr().unwrap().port()))
        .collect();
    let mut opts = Options::new("north", "127.0.0.1", endpoints[0].port, "stalls");
    opts.endpoints = endpoints;
    opts.auto_ack = false;
    opts.replay = false;
    opts.keep_alive = Duration::from_secs(5);
    opts.subscriptions = vec!["in/#".into()];
    opts.announce = Some(Announce {
        topic: "status".into(),
        body: Arc::new(|| Bytes::from_static(b"online")),
    });
    opts.puback_timeout = Some(BOUND);
    Session::start(opts)
}

/// The next event, within `within` (paused time) — `None` if none came.
/// Paused time jumps to the next timer whenever the runtime waits, on I/O
/// too, so a test waits for events with no tight timeout of its own.
async fn next(events: &mut Receiver<Event<u32>>, within: Duration) -> Option<Event<u32>> {
    tokio::time::timeout(within, events.recv()).await.ok()?
}

async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_node_that_takes_the_session_and_acknowledges_nothing_is_left_for_the_next() {
    let (stalled, working) = (listener().await, listener().await);
    let (_session, mut events) = session(&[&stalled, &working]);
    let t0 = Instant::now();
    let stalled_port = stalled.local_addr().unwrap().port();
    let on_stalled = tokio::spawn(async move { serve(&stalled, NEVER).await });

    // No PUBACK for the announce: never up there, and left after the bound.
    let failed = match next(&mut events, FOREVER).await {
        Some(Event::Failed(f)) => f,
        other => panic!("not a failure: {other:?}"),
    };
    let took = t0.elapsed();
    assert!(took >= BOUND && took < BOUND * 2, "{took:?}");
    assert_eq!(failed.endpoint.port, stalled_port);
    assert!(
        matches!(failed.problem, Problem::Stalled { outstanding: 1, waited } if waited >= BOUND),
        "{failed:?}"
    );
    assert!(
        failed.error.contains("no PUBACK for any of 1 publishes")
            && failed.error.contains("moves nothing"),
        "{}",
        failed.error
    );
    // The connection is closed, not held: the node saw the announce, then
    // the end.
    assert_eq!(on_stalled.await.unwrap(), ["status"]);

    let on_working = tokio::spawn(async move { serve(&working, ALL).await });
    match next(&mut events, FOREVER).await {
        Some(Event::Up { endpoint: 1, .. }) => {}
        other => panic!("not up on the next endpoint: {other:?}"),
    }
    on_working.abort();
}

#[tokio::test(start_paused = true)]
async fn what_was_in_flight_on_a_stalled_node_is_the_owners_to_send_on_the_next_uncounted() {
    let (stalled, working) = (listener().await, listener().await);
    let (session, mut events) = session(&[&stalled, &working]);
    let on_stalled = tokio::spawn(async move { serve(&stalled, THE_ANNOUNCE).await });
    let Some(Event::Up {
        epoch, endpoint: 0, ..
    }) = next(&mut events, FOREVER).await
    else {
        panic!("not up on the first endpoint");
    };
    for tag in 0..3 {
        assert!(session.publish(format!("out/{tag}"), Bytes::new(), false, tag, epoch));
    }
    // Taken, never acknowledged: down, and the node is to blame, not a
    // message (no `Refused`, which would count an attempt against it).
    assert!(matches!(
        next(&mut events, FOREVER).await,
        Some(Event::Down)
    ));
    match next(&mut events, FOREVER).await {
        Some(Event::Failed(f)) => assert!(
            matches!(f.problem, Problem::Stalled { outstanding: 3, .. }),
            "{f:?}"
        ),
        other => panic!("not a failure: {other:?}"),
    }
    assert_eq!(
        on_stalled.await.unwrap(),
        ["status", "out/0", "out/1", "out/2"]
    );

    // The owner sends them again on the next node, where they arrive whole
    // and in order, once each: none was held back as a suspect.
    let on_working = tokio::spawn(async move { serve(&working, ALL).await });
    let Some(Event::Up {
        epoch, endpoint: 1, ..
    }) = next(&mut events, FOREVER).await
    else {
        panic!("not up on the next endpoint");
    };
    for tag in 0..3 {
        assert!(session.publish(format!("out/{tag}"), Bytes::new(), false, tag, epoch));
    }
    for tag in 0..3 {
        match next(&mut events, FOREVER).await {
            Some(Event::Published(t)) => assert_eq!(t, tag),
            other => panic!("{tag} not published: {other:?}"),
        }
    }
    on_working.abort();
}

#[tokio::test(start_paused = true)]
async fn a_node_that_acknowledges_slowly_but_steadily_is_kept() {
    let slow = listener().await;
    let (session, mut events) = session(&[&slow]);
    // The announce at once, then one PUBACK every 8 s: each within the
    // bound of the last, the fifth publish 40 s after it was written.
    let steady = Acks {
        at_once: 1,
        then_every: Some(Duration::from_secs(8)),
    };
    let on_slow = tokio::spawn(async move { serve(&slow, steady).await });
    let Some(Event::Up { epoch, .. }) = next(&mut events, FOREVER).await else {
        panic!("not up");
    };
    let t0 = Instant::now();
    for tag in 0..5 {
        assert!(session.publish(format!("out/{tag}"), Bytes::new(), false, tag, epoch));
    }
    for tag in 0..5 {
        match next(&mut events, FOREVER).await {
            Some(Event::Published(t)) => assert_eq!(t, tag),
            other => panic!("{tag}: {other:?} after {:?}", t0.elapsed()),
        }
    }
    assert!(
        t0.elapsed() >= Duration::from_secs(40),
        "{:?}",
        t0.elapsed()
    );
    on_slow.abort();
}

#[tokio::test(start_paused = true)]
async fn a_node_the_session_sends_nothing_is_kept_however_long_it_idles() {
    let idle = listener().await;
    let (_session, mut events) = session(&[&idle]);
    let on_idle = tokio::spawn(async move { serve(&idle, ALL).await });
    assert!(matches!(
        next(&mut events, FOREVER).await,
        Some(Event::Up { .. })
    ));
    // Ten bounds of pings and nothing else.
    let event = next(&mut events, BOUND * 10).await;
    assert!(event.is_none(), "{event:?}");
    on_idle.abort();
}

/// A stalled connection never counts as one that lasted: node after node
/// that stalls makes the backoff grow (here `stable_after` is zero, so
/// any other connection that was accepted would start it again).
#[tokio::test(start_paused = true)]
async fn nodes_that_stall_one_after_the_other_make_the_backoff_grow() {
    let (first, second) = (listener().await, listener().await);
    let (_session, mut events) = session(&[&first, &second]);
    let nodes = tokio::spawn(async move {
        serve(&first, NEVER).await;
        serve(&second, NEVER).await;
    });
    let mut failures = Vec::new();
    while failures.len() < 2 {
        match next(&mut events, FOREVER).await {
            Some(Event::Failed(f)) => {
                assert!(matches!(f.problem, Problem::Stalled { .. }), "{f:?}");
                failures.push(f.failures);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(failures, [1, 2]);
    nodes.abort();
}
