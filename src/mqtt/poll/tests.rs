//! The poller against broker ends written by hand.

use super::super::by_hand::ByHand;
use super::super::link::accepts;
use super::*;

/// rumqttc connects to `format!("{host}:{port}")` and names the TLS
/// server `host`: an IPv6 endpoint is kept without its brackets, and
/// that address must still resolve (std splits at the last colon).
#[tokio::test]
async fn an_ipv6_endpoint_resolves_the_way_rumqttc_writes_it() {
    let ipv6 = Endpoint::new("::1", 1883);
    let written = format!("{}:{}", ipv6.host, ipv6.port);
    let resolved: Vec<_> = tokio::net::lookup_host(written).await.unwrap().collect();
    assert_eq!(resolved, vec!["[::1]:1883".parse().unwrap()]);
    assert!(rustls::pki_types::ServerName::try_from(ipv6.host.as_str()).is_ok());
}

#[tokio::test]
async fn the_check_of_an_endpoint_is_a_bounded_tcp_connect() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let open = Endpoint::new("127.0.0.1", port);
    assert!(accepts(open.clone(), Duration::from_secs(2)).await);
    drop(listener);
    assert!(!accepts(open, Duration::from_secs(2)).await);
}

/// Takes the poller's events until one matches; the test plays the
/// session, answering an error with "reconnect at once".
async fn until(
    polled: &mut mpsc::UnboundedReceiver<Polled>,
    to: &Endpoint,
    want: impl Fn(&Wire) -> bool,
) {
    let wait = async {
        loop {
            match polled.recv().await.expect("the poller runs") {
                Polled::Event(event, _) if want(&event) => return,
                Polled::Event(..) => {}
                Polled::Error(_, resume) => {
                    let _ = resume.send(Resume {
                        delay: Duration::ZERO,
                        to: to.clone(),
                    });
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .expect("the event came");
}

/// Publishes t/1 and t/2 (window 2), the broker acknowledges t/2 only,
/// t/3 collides on t/1's packet id, the connection drops; then what
/// the next connection carries of t/1, t/3 and t/4 (published on it).
async fn after_a_collision(replay: bool) -> Vec<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = Endpoint::new("127.0.0.1", listener.local_addr().unwrap().port());
    let mut opts =
        super::super::options::Options::new("test", "127.0.0.1", endpoint.port, "collider");
    opts.inflight = 2;
    opts.replay = replay;
    let (client, eventloop) = client(&opts);
    let (tx, mut polled) = mpsc::unbounded_channel();
    let _poller = PollerGuard(tokio::spawn(run(eventloop, tx, PollerReach::fixed(&opts))));

    let mut first = ByHand::accept(&listener, false).await;
    for topic in ["t/1", "t/2"] {
        assert!(client.try_publish(topic.into(), false, b"x".to_vec()));
    }
    assert_eq!(first.topics_until("t/2", false).await, ["t/1", "t/2"]);
    first.write(|b| rumqttc::PubAck::new(2).write(b)).await;
    assert!(client.try_publish("t/3".into(), false, b"x".to_vec()));
    until(&mut polled, &endpoint, |e| matches!(e, Wire::AwaitAck(1))).await;
    drop(first);

    // With replay, the broker keeps the session: rumqttc resends.
    let mut second = tokio::select! {
        b = ByHand::accept(&listener, replay) => b,
        _ = until(&mut polled, &endpoint, |_| false) => unreachable!(),
    };
    until(&mut polled, &endpoint, |e| {
        matches!(e, Wire::ConnAck { .. })
    })
    .await;
    assert!(client.try_publish("t/4".into(), false, b"x".to_vec()));
    let drain = tokio::spawn(async move { until(&mut polled, &endpoint, |_| false).await });
    let topics = second.topics_until("t/4", true).await;
    drain.abort();
    topics
}

#[tokio::test]
async fn a_collision_on_a_lost_connection_does_not_stall_the_next_one() {
    // Without replay the pipeline resends; the next connection must
    // carry new publishes at all (it carried nothing but pings).
    assert_eq!(after_a_collision(false).await, ["t/4"]);
}

#[tokio::test]
async fn with_replay_the_publish_that_collided_is_resent_in_order() {
    assert_eq!(after_a_collision(true).await, ["t/1", "t/3", "t/4"]);
}

/// Whether the link fails within `within` (keep-alive 1 s) with a
/// broker that sends a publish every 200 ms (`talking`) or nothing,
/// and never answers a PINGREQ: its PINGRESPs are behind a backlog,
/// or it stopped.
async fn fails_within(talking: bool, within: Duration) -> bool {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut opts = super::super::options::Options::new("test", "127.0.0.1", port, "pinger");
    opts.keep_alive = Duration::from_secs(1);
    let (_client, eventloop) = client(&opts);
    let (tx, mut polled) = mpsc::unbounded_channel();
    let _poller = PollerGuard(tokio::spawn(run(eventloop, tx, PollerReach::fixed(&opts))));
    let mut broker = ByHand::accept(&listener, false).await;
    let deadline = tokio::time::Instant::now() + within;
    let mut every = tokio::time::interval(Duration::from_millis(200));
    let mut n = 0;
    loop {
        tokio::select! {
            p = polled.recv() => match p.expect("the poller runs") {
                Polled::Error(..) => return true,
                Polled::Event(..) => {}
            },
            _ = every.tick(), if talking => {
                n += 1;
                let publish = rumqttc::Publish::new(format!("t/{n}"), QoS::AtMostOnce, vec![1]);
                broker.write(|b| publish.write(b)).await;
            }
            _ = tokio::time::sleep_until(deadline) => return false,
        }
    }
}

#[tokio::test]
async fn a_broker_that_keeps_sending_keeps_the_link_though_its_pingresp_is_late() {
    // rumqttc alone failed it one keep-alive after its first PINGREQ.
    assert!(!fails_within(true, Duration::from_secs(4)).await);
}

#[tokio::test]
async fn a_broker_that_falls_silent_loses_the_link_one_keep_alive_after_the_ping() {
    assert!(fails_within(false, Duration::from_secs(4)).await);
}
