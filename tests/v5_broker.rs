//! MQTT 5 on the embedded broker's port, where its properties could reach
//! past ferry's rules (vendor/README.md, patches 44–53): a topic alias
//! carries no publish past isolation, a device cannot forge the broker's
//! own `ferry-` marks, and an alias out of range ends the connection with
//! a reason. Seen by a bare MQTT 5 client (rumqttc's v5 codec, no event
//! loop) that sends exactly what it is told.

use std::time::Duration;

use bytes::BytesMut;
use rumqttc::v5::mqttbytes::v5::{
    Connect, ConnectReturnCode, Filter, Packet, Publish, PublishProperties, Subscribe,
};
use rumqttc::v5::mqttbytes::QoS;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{free_port, Backend, Ferry, FerryOpts, Mosquitto};

const SECS_10: Duration = Duration::from_secs(10);

/// A bare MQTT 5 client.
struct Raw5 {
    tcp: TcpStream,
    buf: BytesMut,
    pkid: u16,
}

impl Raw5 {
    async fn connect(port: u16, id: &str) -> Raw5 {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut raw = Raw5 {
            tcp,
            buf: BytesMut::new(),
            pkid: 0,
        };
        let connect = Connect {
            keep_alive: 60,
            client_id: id.into(),
            clean_start: true,
            properties: None,
        };
        raw.send(Packet::Connect(connect, None, None)).await;
        match raw.recv(SECS_10).await {
            Some(Packet::ConnAck(ack)) => assert_eq!(ack.code, ConnectReturnCode::Success),
            other => panic!("{id}: expected CONNACK, got {other:?}"),
        }
        let filter = Filter::new(format!("devices/{id}/ack"), QoS::AtLeastOnce);
        let mut sub = Subscribe::new(filter, None);
        sub.pkid = 1;
        raw.send(Packet::Subscribe(sub)).await;
        assert!(matches!(raw.recv(SECS_10).await, Some(Packet::SubAck(_))));
        raw
    }

    async fn send(&mut self, packet: Packet) {
        let mut out = BytesMut::new();
        packet.write(&mut out, None).expect("encode");
        self.tcp.write_all(&out).await.expect("write");
    }

    /// A QoS 1 PUBLISH on `topic` (empty: by alias) with these properties.
    async fn publish(&mut self, topic: &str, payload: Vec<u8>, props: PublishProperties) {
        self.pkid += 1;
        let mut p = Publish::new(topic, QoS::AtLeastOnce, payload, Some(props));
        p.pkid = self.pkid;
        self.send(Packet::Publish(p)).await;
    }

    /// The next packet within `timeout`; `None` when the socket closed or
    /// nothing came.
    async fn recv(&mut self, timeout: Duration) -> Option<Packet> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(p) = Packet::read(&mut self.buf, None) {
                return Some(p);
            }
            let read = tokio::time::timeout_at(deadline, self.tcp.read_buf(&mut self.buf)).await;
            match read {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }

    /// Receipts (acknowledged) until one for `msg_id`.
    async fn receipt_for(&mut self, msg_id: &str) -> Option<Value> {
        loop {
            match self.recv(SECS_10).await? {
                Packet::Publish(p) => {
                    if p.qos == QoS::AtLeastOnce {
                        let ack = rumqttc::v5::mqttbytes::v5::PubAck::new(p.pkid, None);
                        self.send(Packet::PubAck(ack)).await;
                    }
                    let v: Value = serde_json::from_slice(&p.payload).unwrap();
                    if v["msg_id"] == msg_id {
                        return Some(v);
                    }
                }
                _ => continue,
            }
        }
    }
}

fn envelope(msg_id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"msg_id": msg_id, "payload": {"t": 1}})).unwrap()
}

fn alias(n: u16) -> PublishProperties {
    PublishProperties {
        topic_alias: Some(n),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_alias_carries_no_publish_past_isolation() {
    let mosquitto = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-alias", mosquitto.port));
    let mut backend = Backend::connect(mosquitto.port, "gw-alias").await;
    let mut raw = Raw5::connect(ferry.south_port, "al-w").await;
    // Alias 1 set on the victim's topic: refused like any such publish.
    raw.publish("devices/al-v/up/t", envelope("forged-1"), alias(1))
        .await;
    let r = raw.receipt_for("forged-1").await.expect("a receipt");
    assert_eq!(r["status"], "rejected", "{r}");
    // Used again with an empty topic: the same topic, the same refusal.
    raw.publish("", envelope("forged-2"), alias(1)).await;
    let r = raw.receipt_for("forged-2").await.expect("a receipt");
    assert_eq!(r["status"], "rejected", "{r}");
    assert!(
        r["reason"].as_str().unwrap().starts_with("unauthorized"),
        "{r}"
    );
    // Alias 2 on its own topic works, by topic and by alias.
    raw.publish("devices/al-w/up/t", envelope("own-1"), alias(2))
        .await;
    raw.publish("", envelope("own-2"), alias(2)).await;
    for id in ["own-1", "own-2"] {
        let r = raw.receipt_for(id).await.expect("a receipt");
        assert_eq!(r["status"], "stored", "{r}");
    }
    let north = backend.messages_until(SECS_10, |all| all.len() >= 2).await;
    // Anything more would show within this.
    let north: Vec<_> = north
        .into_iter()
        .chain(backend.drain_for(Duration::from_millis(300)).await)
        .collect();
    let seen: Vec<(String, String)> = north
        .iter()
        .map(|m| (m.device().to_string(), m.msg_id().to_string()))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("al-w".to_string(), "own-1".to_string()),
            ("al-w".to_string(), "own-2".to_string())
        ],
        "nothing reached the backend as al-v"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_cannot_forge_the_brokers_own_marks() {
    let ferry = Ferry::start(FerryOpts::new("gw-forge", free_port()));
    let mut raw = Raw5::connect(ferry.south_port, "fg-a").await;
    // A small publish claiming to be an oversized one cut short, and to
    // come from another device: both marks are the broker's, and go.
    let props = PublishProperties {
        user_properties: vec![
            ("ferry-oversize".into(), "99999999".into()),
            ("ferry-publisher".into(), "fg-b".into()),
        ],
        ..Default::default()
    };
    raw.publish("devices/fg-a/up/t", envelope("small-1"), props)
        .await;
    let r = raw.receipt_for("small-1").await.expect("a receipt");
    assert_eq!(r["status"], "stored", "stored as what it is: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_out_of_range_ends_the_connection_with_its_reason() {
    let ferry = Ferry::start(FerryOpts::new("gw-alias-max", free_port()));
    let mut raw = Raw5::connect(ferry.south_port, "al-x").await;
    raw.publish("devices/al-x/up/t", envelope("x-1"), alias(33))
        .await;
    let mut reason = None;
    while let Some(p) = raw.recv(SECS_10).await {
        if let Packet::Disconnect(d) = p {
            reason = Some(d.reason_code);
        }
    }
    assert_eq!(
        reason,
        Some(rumqttc::v5::mqttbytes::v5::DisconnectReasonCode::TopicAliasInvalid),
        "DISCONNECT 0x94, then closed"
    );
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM uplink", []), 0);
}
