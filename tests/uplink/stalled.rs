//! A north node that takes the session but moves nothing (issue 31): it
//! CONNACKs, SUBACKs and answers pings, and never acknowledges a publish,
//! as an overloaded or half-partitioned cluster node does. With it first
//! in `north.endpoints` and a real Mosquitto second, ferry must leave it
//! within `north.puback_timeout_ms`, say so (`link_stalled`, and
//! `north.last_error` in the status), and deliver every uplink on the
//! Mosquitto, those that were in flight on the stalled node included.

use std::sync::{Arc, Mutex};

use rumqttc::{ConnAck, ConnectReturnCode, Packet, PubAck, QoS, SubAck, SubscribeReasonCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::support::logged;

/// `north.puback_timeout_ms` here: short, so a test takes seconds.
const BOUND_MS: u64 = 1000;
const UPLINKS: usize = 5;

/// A north node written by hand, on a free loopback port: MQTT 3.1.1 just
/// far enough to take a session (CONNACK, every filter granted at QoS 1,
/// PINGRESP), and a PUBACK for the first `acks` publishes of each
/// connection only. The topics published to it are kept.
struct StalledNode {
    port: u16,
    published: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StalledNode {
    async fn start(acks: usize) -> StalledNode {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let port = listener.local_addr().unwrap().port();
        let published = Arc::new(Mutex::new(Vec::new()));
        let kept = published.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, acks, kept.clone()));
            }
        });
        StalledNode {
            port,
            published,
            task,
        }
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn published(&self) -> Vec<String> {
        self.published.lock().unwrap().clone()
    }
}

impl Drop for StalledNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection, until the client closes it.
async fn serve(mut socket: TcpStream, acks: usize, published: Arc<Mutex<Vec<String>>>) {
    let _ = socket.set_nodelay(true);
    let mut buf = bytes::BytesMut::new();
    let mut publishes = 0;
    loop {
        let packet = match Packet::read(&mut buf, 1 << 24) {
            Ok(packet) => packet,
            Err(rumqttc::Error::InsufficientBytes(_)) => match socket.read_buf(&mut buf).await {
                Ok(n) if n > 0 => continue,
                _ => return,
            },
            Err(_) => return,
        };
        let mut out = bytes::BytesMut::new();
        let written = match packet {
            Packet::Connect(..) => ConnAck::new(ConnectReturnCode::Success, false).write(&mut out),
            Packet::Subscribe(s) => {
                let granted = vec![SubscribeReasonCode::Success(QoS::AtLeastOnce); s.filters.len()];
                SubAck::new(s.pkid, granted).write(&mut out)
            }
            Packet::PingReq => rumqttc::PingResp.write(&mut out),
            Packet::Publish(p) => {
                published.lock().unwrap().push(p.topic.clone());
                publishes += 1;
                if publishes > acks {
                    continue;
                }
                PubAck::new(p.pkid).write(&mut out)
            }
            Packet::Disconnect => return,
            _ => continue,
        };
        if written.is_err() || socket.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// ferry with `first` (the stalled node) and then the Mosquitto on
/// `mq_port` as its upstream nodes.
fn opts(gateway: &str, first: &StalledNode, mq_port: u16) -> FerryOpts {
    let list = vec![first.endpoint(), format!("127.0.0.1:{mq_port}")];
    FerryOpts::new(gateway, mq_port).with(move |c| {
        c.north.endpoints = list;
        c.north.puback_timeout_ms = BOUND_MS;
    })
}

/// Until the backend has every one of `ids` (or `timeout` passed): the
/// distinct msg_ids it has.
async fn backend_has(backend: &mut Backend, ids: &[String], timeout: Duration) -> HashSet<String> {
    let got = backend
        .messages_until(timeout, |seen| {
            let have: HashSet<&str> = seen.iter().map(|m| m.msg_id()).collect();
            ids.iter().all(|id| have.contains(id.as_str()))
        })
        .await;
    got.iter().map(|m| m.msg_id().to_string()).collect()
}

/// The stalled node is named: a WARN `link_stalled` with its endpoint, and
/// `north.last_error` in the status saying what it did, in words.
fn assert_named(ferry: &Ferry, node: &StalledNode) {
    let log = ferry.log();
    let at = format!("endpoint={}", node.endpoint());
    let line = log
        .lines()
        .find(|l| l.contains("event=\"link_stalled\"") && l.contains(&at))
        .unwrap_or_else(|| panic!("no link_stalled naming {at}:\n{}", ferry.log_tail()));
    assert!(
        line.contains("WARN") && line.contains("link=north"),
        "{line}"
    );
    let status = ferry.admin_json("/api/status");
    let error = status["north"]["last_error"].as_str().unwrap_or("");
    assert!(
        error.starts_with(&format!(
            "{} took the session but moved nothing: no PUBACK for any of",
            node.endpoint()
        )) && error.contains("north.puback_timeout_ms"),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_north_node_that_never_acknowledges_is_left_and_every_uplink_reaches_the_next() {
    const GATEWAY: &str = "gw-stalled";
    let mq = Mosquitto::start();
    let node = StalledNode::start(0).await;
    let mut backend = Backend::connect_auto_ack(mq.port, GATEWAY).await;
    let started = Instant::now();
    let ferry = Ferry::start(opts(GATEWAY, &node, mq.port));
    let device = Device::connect(ferry.south_port, "st-1").await;
    let ids = device.publish_many("t", &boot_id(), "s", UPLINKS).await;

    let got = backend_has(&mut backend, &ids, SECS_10).await;
    assert_eq!(
        got.len(),
        UPLINKS,
        "{} of {UPLINKS} uplinks reached the backend:\n{}",
        got.len(),
        ferry.log_tail()
    );
    assert!(started.elapsed() < SECS_10, "{:?}", started.elapsed());
    assert_named(&ferry, &node);
    // All it ever got was the retained status, which it never acknowledged.
    let published = node.published();
    assert!(
        !published.is_empty() && published.iter().all(|t| t.ends_with("/status")),
        "{published:?}"
    );
    assert!(
        logged(
            &ferry.log(),
            "north_endpoint_switched",
            "reason=\"failover\""
        ) >= 1,
        "{}",
        ferry.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uplinks_in_flight_on_a_node_that_stops_acknowledging_are_delivered_on_the_next() {
    const GATEWAY: &str = "gw-stalls-later";
    let mq = Mosquitto::start();
    // It acknowledges the retained status, so the link is up there; then
    // nothing more.
    let node = StalledNode::start(1).await;
    let mut backend = Backend::connect_auto_ack(mq.port, GATEWAY).await;
    let ferry = Ferry::start(opts(GATEWAY, &node, mq.port));
    let mut devices = vec![Device::connect(ferry.south_port, "st-2").await];
    let ids = vec![devices[0].publish_many("t", &boot_id(), "s", UPLINKS).await];

    let got = backend_has(&mut backend, &ids[0], SECS_10).await;
    assert_eq!(
        got.len(),
        UPLINKS,
        "{} of {UPLINKS} uplinks reached the backend:\n{}",
        got.len(),
        ferry.log_tail()
    );
    let mut receipts = vec![Vec::new()];
    assert_all_delivered(&mut devices, &ids, &mut receipts, SECS_10).await;
    // They were in flight on the stalled node first.
    let on_node = node
        .published()
        .iter()
        .filter(|t| t.contains("/up/"))
        .count();
    assert!(
        on_node >= UPLINKS,
        "{on_node} uplinks went to the stalled node"
    );
    assert_named(&ferry, &node);
    // A stall is the node's fault: no attempt was counted against them
    // (the one each has is the send that was delivered).
    assert_eq!(ferry.query_i64("SELECT MAX(attempts) FROM uplink", []), 1);
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []), 0);
}
