//! Sparkplug B edge nodes (`[south.sparkplug]`, docs/PROTOCOL.md
//! "Sparkplug B edge nodes"), against the real binary and a real Mosquitto
//! in both south modes: an edge node that speaks real Sparkplug B protobuf
//! (ferry's codec, Eclipse Tahu's v1.0.7 `sparkplug_b.proto`, prost 0.14)
//! publishes NBIRTH, DBIRTH, NDATA and DDATA with seq 0..n, through an
//! upstream outage and its primary host going offline, then dies (its
//! NDEATH is its will). The backend gets every message once, in order,
//! those stored while they could not go north marked historical (in the
//! body and in the payload's metrics); STATE offline holds forwarding and
//! STATE online releases it (another device's uplink goes meanwhile); a
//! seq gap is counted and logged, not fixed.

use std::time::Duration;

use base64::Engine;
use ferry::config::RawSparkplug;
use ferry::protocol::sparkplug::{decode, encode_death_example, encode_example};
use rumqttc::{Packet, QoS};
use serde_json::Value;

use crate::support::{Backend, Device, Ferry, FerryOpts, Mode, Mosquitto, NorthMessage, RawMqtt};

const GROUP: &str = "plant";
const NODE: &str = "node-1";
const HOST: &str = "scada";
const SECS_30: Duration = Duration::from_secs(30);

fn topic(kind: &str, device: Option<&str>) -> String {
    match device {
        Some(d) => format!("spBv1.0/{GROUP}/{kind}/{NODE}/{d}"),
        None => format!("spBv1.0/{GROUP}/{kind}/{NODE}"),
    }
}

/// The edge node: a bare MQTT 3.1.1 client whose will is its NDEATH.
struct EdgeNode {
    raw: RawMqtt,
}

impl EdgeNode {
    async fn connect(port: u16, bd_seq: u64) -> EdgeNode {
        let mut connect = rumqttc::Connect::new(NODE);
        connect.keep_alive = 60;
        connect.last_will = Some(rumqttc::LastWill::new(
            topic("NDEATH", None),
            encode_death_example(bd_seq),
            QoS::AtLeastOnce,
            false,
        ));
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("tcp to the device broker");
        let (raw, ack) = RawMqtt::try_connect_packet(Box::new(stream), connect)
            .await
            .unwrap_or_else(|e| panic!("edge node: {e}"));
        assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
        EdgeNode { raw }
    }

    /// Publishes at QoS 1 and waits for its PUBACK.
    async fn publish(&mut self, kind: &str, device: Option<&str>, payload: Vec<u8>) {
        let packet = self.raw.publish(&topic(kind, device), payload);
        let Packet::Publish(p) = &packet else {
            unreachable!("a publish")
        };
        let pkid = p.pkid;
        self.raw.send(packet).await;
        loop {
            match self.raw.recv(SECS_30).await {
                Some(Packet::PubAck(a)) if a.pkid == pkid => return,
                Some(_) => {}
                None => panic!("no PUBACK for {kind}"),
            }
        }
    }

    /// NDATA (even seq) or DDATA of `pump` (odd seq).
    async fn data(&mut self, seq: u64) {
        let value = seq as f64;
        if seq.is_multiple_of(2) {
            let payload = encode_example(seq, None, &[("temp", value)]);
            self.publish("NDATA", None, payload).await
        } else {
            let payload = encode_example(seq, None, &[("rpm", value), ("amps", value)]);
            self.publish("DDATA", Some("pump"), payload).await
        }
    }
}

/// The primary host says whether it is online: retained, on the upstream.
async fn host_state(upstream: u16, online: bool) {
    let body = format!(
        "{{\"online\": {online}, \"timestamp\": {}}}",
        ferry::protocol::now_ms()
    );
    let port = upstream.to_string();
    let topic = format!("spBv1.0/STATE/{HOST}");
    let args = [
        "-h",
        "127.0.0.1",
        "-p",
        &port,
        "-q",
        "1",
        "-r",
        "-t",
        &topic,
        "-m",
        &body,
    ];
    let status = tokio::task::block_in_place(|| {
        std::process::Command::new("mosquitto_pub")
            .args(args)
            .status()
            .expect("mosquitto_pub (apt-get install -y mosquitto-clients)")
    });
    assert!(status.success(), "mosquitto_pub STATE: {status}");
}

/// How often ferry logged `event`.
fn logged(ferry: &Ferry, event: &str) -> usize {
    ferry.log().matches(&format!("event=\"{event}\"")).count()
}

/// Waits until ferry logged `event` more than `before` times.
async fn until_logged(ferry: &Ferry, event: &str, before: usize) {
    for _ in 0..300 {
        if logged(ferry, event) > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("ferry never logged {event}:\n{}", ferry.log_tail());
}

/// Collects what the backend gets from the edge node until `n` distinct
/// messages have come (or 30 s passed), adding them to `got`.
async fn until_got(backend: &mut Backend, got: &mut Vec<NorthMessage>, n: usize) {
    let mut had: Vec<String> = got.iter().map(|m| m.msg_id().to_string()).collect();
    had.sort_unstable();
    had.dedup();
    let distinct = |new: &[NorthMessage]| {
        let mut ids = had.clone();
        for m in new.iter().filter(|m| m.device() == NODE) {
            if !ids.iter().any(|id| id == m.msg_id()) {
                ids.push(m.msg_id().to_string());
            }
        }
        ids.len()
    };
    let new = backend
        .messages_until(SECS_30, |all| distinct(all) >= n)
        .await;
    got.extend(new.into_iter().filter(|m| m.device() == NODE));
    let mut ids: Vec<&str> = got.iter().map(|m| m.msg_id()).collect();
    ids.sort_unstable();
    ids.dedup();
    let count = ids.len();
    assert!(
        count >= n,
        "{count} of {n} Sparkplug messages north: {:#?}",
        got.iter().map(|m| &m.body).collect::<Vec<_>>()
    );
}

/// Waits until the backend's acks of `n` of the node's messages are
/// committed: nothing of them is in flight any more.
async fn until_delivered(ferry: &Ferry, n: i64) {
    let sql = "SELECT COUNT(*) FROM uplink WHERE device = ?1 AND state = 'delivered'";
    for _ in 0..300 {
        if ferry.query_i64(sql, [NODE]) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{n} of the node's messages never delivered");
}

/// Nothing of the edge node comes north for a while.
async fn nothing_for(backend: &mut Backend, what: &str) {
    let came = backend.drain_for(Duration::from_secs(3)).await;
    let of_node: Vec<&Value> = came
        .iter()
        .filter(|m| m.device() == NODE)
        .map(|m| &m.body)
        .collect();
    assert!(of_node.is_empty(), "{what}: {of_node:#?}");
}

both_modes!(an_edge_node_through_an_outage_and_its_hosts_state);
async fn an_edge_node_through_an_outage_and_its_hosts_state(mode: Mode) {
    let gateway = "gw-spb";
    let mut mq = Mosquitto::start();
    let opts = FerryOpts::new(gateway, mq.port).with(|c| {
        c.south.sparkplug = RawSparkplug {
            enabled: true,
            host_id: Some(HOST.into()),
        }
    });
    let ferry = Ferry::start_in(mode, opts);
    let mut backend = Backend::connect_auto_ack(mq.port, gateway).await;
    let mut got = Vec::new();

    // The host is online: births and data go north live.
    host_state(mq.port, true).await;
    until_logged(&ferry, "sparkplug_host_online", 0).await;
    let gauge = |f: &Ferry| f.metrics().get("ferry_sparkplug_host_online");
    assert_eq!(gauge(&ferry), Some(1.0), "the host online, on the gauge");
    let mut node = EdgeNode::connect(ferry.south_port, 0).await;
    let birth = encode_example(0, Some(0), &[("temp", 20.0)]);
    node.publish("NBIRTH", None, birth).await;
    let dbirth = encode_example(1, None, &[("rpm", 0.0), ("amps", 0.0)]);
    node.publish("DBIRTH", Some("pump"), dbirth).await;
    node.data(2).await;
    node.data(3).await;
    until_got(&mut backend, &mut got, 4).await;
    until_delivered(&ferry, 4).await;

    // The upstream goes away: what the node sends meanwhile is stored
    // historical, and its PUBACK comes all the same.
    let downs = logged(&ferry, "north_link_down");
    mq.stop();
    until_logged(&ferry, "north_link_down", downs).await;
    for seq in 4..=7 {
        node.data(seq).await;
    }
    // Back, but without the host's retained STATE (the broker forgot it):
    // held until the host says it is online again.
    let ups = logged(&ferry, "north_link_up");
    mq.restart();
    assert!(backend.wait_subacks(2, SECS_30).await, "backend back");
    until_logged(&ferry, "north_link_up", ups).await;
    nothing_for(&mut backend, "no STATE since the reconnect: held").await;
    host_state(mq.port, true).await;
    until_got(&mut backend, &mut got, 8).await;

    // The host goes offline: held, stored historical; a seq gap (9 never
    // sent) is counted and stored as it came.
    let offline = logged(&ferry, "sparkplug_host_offline");
    host_state(mq.port, false).await;
    until_logged(&ferry, "sparkplug_host_offline", offline).await;
    assert_eq!(gauge(&ferry), Some(0.0), "and offline");
    node.data(8).await;
    node.data(10).await;
    nothing_for(&mut backend, "host offline: held").await;
    // Another device's uplink does not wait for the host.
    let device = Device::connect(ferry.south_port, "press-7").await;
    device
        .publish_envelope("t", "press-7-1", serde_json::json!(1))
        .await;
    let came = backend
        .messages_until(SECS_30, |all| all.iter().any(|m| m.device() == "press-7"))
        .await;
    assert!(came.iter().any(|m| m.device() == "press-7"), "{came:?}");
    assert!(
        !came.iter().any(|m| m.device() == NODE),
        "the node's still held: {came:?}"
    );
    host_state(mq.port, true).await;
    until_got(&mut backend, &mut got, 10).await;

    // Live again; then the node dies and its will, the NDEATH, follows.
    node.data(11).await;
    drop(node);
    until_got(&mut backend, &mut got, 12).await;

    // Every message once, in order, historical where it waited.
    let mut seen = std::collections::BTreeSet::new();
    for m in &got {
        assert!(
            seen.insert(m.msg_id().to_string()),
            "forwarded twice: {}",
            m.body
        );
    }
    let expected: [(&str, Option<u64>, bool); 12] = [
        ("NBIRTH", Some(0), false),
        ("DBIRTH", Some(1), false),
        ("NDATA", Some(2), false),
        ("DDATA", Some(3), false),
        ("NDATA", Some(4), true),
        ("DDATA", Some(5), true),
        ("NDATA", Some(6), true),
        ("DDATA", Some(7), true),
        ("NDATA", Some(8), true),
        ("NDATA", Some(10), true),
        ("DDATA", Some(11), false),
        ("NDEATH", None, false),
    ];
    assert_eq!(got.len(), expected.len());
    for (i, (m, (kind, seq, historical))) in got.iter().zip(expected).enumerate() {
        let b = &m.body;
        assert!(m.topic.ends_with(&format!("/up/{NODE}/spb")), "{}", m.topic);
        assert_eq!(b["stream"], "spb", "{b}");
        assert_eq!(b["seq"].as_u64(), Some(i as u64 + 1), "ferry's seq: {b}");
        let spb = &b["sparkplug"];
        assert_eq!(spb["message_type"], kind, "{b}");
        assert_eq!(spb["seq"].as_u64(), seq, "{b}");
        assert_eq!(spb["group_id"], GROUP, "{b}");
        assert_eq!(spb["edge_node_id"], NODE, "{b}");
        assert_eq!(
            b["historical"].as_bool().unwrap_or(false),
            historical,
            "{b}"
        );
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b["payload_b64"].as_str().expect("payload_b64"))
            .expect("base64");
        let payload = decode(&bytes).expect("Sparkplug B payload");
        assert!(!payload.metrics.is_empty(), "{b}");
        for metric in &payload.metrics {
            assert_eq!(
                metric.is_historical.unwrap_or(false),
                historical,
                "{kind} {seq:?}: {metric:?}"
            );
        }
        assert_eq!(payload.seq, seq, "{b}");
    }
    assert_eq!(got[0].body["sparkplug"]["bd_seq"], 0);
    assert_eq!(got[11].body["sparkplug"]["bd_seq"], 0, "the NDEATH's bdSeq");

    // The gap was seen, counted and logged, once.
    let metrics = ferry.metrics();
    assert_eq!(metrics.value("ferry_sparkplug_seq_gaps_total"), 1.0);
    assert_eq!(metrics.value("ferry_sparkplug_historical_total"), 6.0);
    assert_eq!(metrics.value("ferry_sparkplug_from_devices_total"), 12.0);
    assert_eq!(metrics.value("ferry_sparkplug_out_of_session_total"), 0.0);
    let log = ferry.log();
    let gap = log
        .lines()
        .find(|l| l.contains("event=\"sparkplug_seq_gap\""))
        .expect("a sparkplug_seq_gap line");
    assert!(
        gap.contains("expected=9") && gap.contains("got=10"),
        "{gap}"
    );
    assert_eq!(logged(&ferry, "sparkplug_seq_gap"), 1);
}

/// With logins an edge node publishes as itself only: under another edge
/// node's id its publish is refused `unauthorized` and dead-lettered (its
/// own are stored on stream `spb`), and a will on another node's NDEATH
/// refuses the CONNECT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_logins_an_edge_node_publishes_only_as_itself() {
    let mq = Mosquitto::start();
    let logins = [("node-1", "pw-1"), ("node-2", "pw-2")];
    let opts = FerryOpts::new("gw-spb-iso", mq.port)
        .with_passwords(&logins)
        .with(|c| c.south.sparkplug.enabled = true);
    let ferry = Ferry::start(opts);
    let port = ferry.south_port;
    let (raw, _) = RawMqtt::try_connect_login(port, NODE, 30, Some((NODE, "pw-1")))
        .await
        .expect("node-1 connects");
    let mut own = EdgeNode { raw };
    own.publish("NBIRTH", None, encode_example(0, Some(3), &[("t", 1.0)]))
        .await;
    let (mut other, _) = RawMqtt::try_connect_login(port, "node-2", 30, Some(("node-2", "pw-2")))
        .await
        .expect("node-2 connects");
    let forged = other.publish(&topic("NDATA", None), encode_example(1, None, &[]));
    other.send(forged).await;
    let refused =
        "SELECT COUNT(*) FROM dead_letter WHERE device = 'node-2' AND reason LIKE 'unauthorized%'";
    for _ in 0..100 {
        if ferry.query_i64(refused, []) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ferry.query_i64(refused, []), 1, "{}", ferry.log_tail());
    let stored = "SELECT COUNT(*) FROM uplink WHERE device = ?1 AND stream = 'spb'";
    assert_eq!(ferry.query_i64(stored, [NODE]), 1, "only its own NBIRTH");
    assert_eq!(ferry.query_i64(stored, ["node-2"]), 0);

    let mut connect = rumqttc::Connect::new("node-2");
    connect.keep_alive = 30;
    connect.set_login("node-2", "pw-2");
    connect.last_will = Some(rumqttc::LastWill::new(
        topic("NDEATH", None),
        encode_death_example(3),
        QoS::AtLeastOnce,
        false,
    ));
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("tcp");
    let refused = RawMqtt::try_connect_packet(Box::new(stream), connect).await;
    assert!(
        matches!(&refused, Ok((_, ack)) if ack.code != rumqttc::ConnectReturnCode::Success)
            || refused.is_err(),
        "a will as another edge node: {:?}",
        refused.map(|(_, a)| a)
    );
}
