//! A new way to reach the broker (`reach.rs`): taken at once while down,
//! moving off a node no longer listed, staying on one still listed.

use std::time::Duration;

use rumqttc::Packet;

use super::super::super::{Endpoint, Event, Options, Reach, Reconnect, Session, Transport};
use super::serve;

/// A broker end on a free port.
async fn listener() -> (tokio::net::TcpListener, Endpoint) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, Endpoint::new("127.0.0.1", port))
}

fn reach(endpoints: Vec<Endpoint>) -> Reach {
    Reach {
        endpoints,
        prefer_first: None,
        credentials: None,
        keep_alive: Duration::from_secs(30),
        puback_timeout: None,
        transport: Transport::Tcp,
    }
}

/// The next `Up`, within `within`: its node.
async fn up(events: &mut tokio::sync::mpsc::Receiver<Event<u32>>, within: Duration) -> Endpoint {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(Event::Up { node, .. })) => return node,
            Ok(Some(_)) => {}
            other => panic!("no Up within {within:?}: {other:?}"),
        }
    }
}

fn options(first: &Endpoint) -> Options {
    let mut opts = Options::new("reach", first.host.clone(), first.port, "reach-test");
    opts.subscriptions = vec!["in/#".into()];
    // A long backoff: only the new settings can end the wait in time.
    opts.reconnect = Reconnect {
        base: Duration::from_secs(60),
        max: Duration::from_secs(60),
        stable_after: Duration::ZERO,
    };
    opts
}

#[tokio::test]
async fn while_down_the_wait_ends_and_the_new_node_is_reached_at_once() {
    // Nothing listens here: the first attempt fails, the next is a minute off.
    let (dead, gone) = listener().await;
    drop(dead);
    let (session, mut events) = Session::<u32>::start(options(&gone));
    loop {
        match tokio::time::timeout(Duration::from_secs(5), events.recv()).await {
            Ok(Some(Event::Failed(_))) => break,
            Ok(Some(_)) => {}
            other => panic!("no failure: {other:?}"),
        }
    }
    let (live, there) = listener().await;
    session.reach(reach(vec![there.clone()]));
    let serving = tokio::spawn(async move { (serve(&live).await, live) });
    assert_eq!(up(&mut events, Duration::from_secs(5)).await, there);
    drop(serving);
}

#[tokio::test]
async fn up_on_a_node_still_listed_it_stays_and_on_one_no_longer_listed_it_moves() {
    let (a_listener, a) = listener().await;
    let (b_listener, b) = listener().await;
    let (session, mut events) = Session::<u32>::start(options(&a));
    let mut on_a = serve(&a_listener).await;
    assert_eq!(up(&mut events, Duration::from_secs(5)).await, a);

    // Still listed (second now): nothing is sent, the connection stays.
    session.reach(reach(vec![b.clone(), a.clone()]));
    assert!(
        on_a.read_within(Duration::from_millis(500)).await.is_none(),
        "the session left a node still listed"
    );
    // No longer listed: a clean DISCONNECT, then the new list's first.
    session.reach(reach(vec![b.clone()]));
    assert!(matches!(on_a.read().await, Some(Packet::Disconnect)));
    drop(on_a); // as a broker closes the connection on DISCONNECT
    let _on_b = serve(&b_listener).await;
    assert_eq!(up(&mut events, Duration::from_secs(5)).await, b);
}
