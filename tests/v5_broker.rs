//! MQTT 5 on the embedded broker's port, where its properties could reach
//! past ferry's rules (vendor/README.md, patches 44–53): a topic alias
//! carries no publish past isolation, a device cannot forge the broker's
//! own `ferry-` marks, and an alias out of range ends the connection with
//! a reason. Seen by a bare MQTT 5 client (rumqttc's v5 codec, no event
//! loop) that sends exactly what it is told.

use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use serde_json::{json, Value};

use crate::support::raw_v5::RawV5;
use crate::support::{free_port, Backend, Ferry, FerryOpts, Mosquitto};

const SECS_10: Duration = Duration::from_secs(10);

/// Receipts (acknowledged) until one for `msg_id`.
async fn receipt_for(raw: &mut RawV5, msg_id: &str) -> Option<Value> {
    loop {
        match raw.recv(SECS_10).await? {
            Packet::Publish(p) => {
                if p.qos == QoS::AtLeastOnce {
                    let ack = rumqttc::v5::mqttbytes::v5::PubAck::new(p.pkid, None);
                    raw.send(Packet::PubAck(ack)).await;
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

/// Connects as `id` and subscribes to its `ack`.
async fn device(port: u16, id: &str) -> RawV5 {
    let mut raw = RawV5::connect(port, id).await;
    raw.subscribe(&format!("devices/{id}/ack")).await;
    raw
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
    let mut raw = device(ferry.south_port, "al-w").await;
    // Alias 1 set on the victim's topic: refused like any such publish.
    raw.publish_with("devices/al-v/up/t", envelope("forged-1"), alias(1))
        .await;
    let r = receipt_for(&mut raw, "forged-1").await.expect("a receipt");
    assert_eq!(r["status"], "rejected", "{r}");
    // Used again with an empty topic: the same topic, the same refusal.
    raw.publish_with("", envelope("forged-2"), alias(1)).await;
    let r = receipt_for(&mut raw, "forged-2").await.expect("a receipt");
    assert_eq!(r["status"], "rejected", "{r}");
    assert!(
        r["reason"].as_str().unwrap().starts_with("unauthorized"),
        "{r}"
    );
    // Alias 2 on its own topic works, by topic and by alias.
    raw.publish_with("devices/al-w/up/t", envelope("own-1"), alias(2))
        .await;
    raw.publish_with("", envelope("own-2"), alias(2)).await;
    for id in ["own-1", "own-2"] {
        let r = receipt_for(&mut raw, id).await.expect("a receipt");
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
    let mut raw = device(ferry.south_port, "fg-a").await;
    // A small publish claiming to be an oversized one cut short, and to
    // come from another device: both marks are the broker's, and go.
    let props = PublishProperties {
        user_properties: vec![
            ("ferry-oversize".into(), "99999999".into()),
            ("ferry-publisher".into(), "fg-b".into()),
        ],
        ..Default::default()
    };
    raw.publish_with("devices/fg-a/up/t", envelope("small-1"), props)
        .await;
    let r = receipt_for(&mut raw, "small-1").await.expect("a receipt");
    assert_eq!(r["status"], "stored", "stored as what it is: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_out_of_range_ends_the_connection_with_its_reason() {
    let ferry = Ferry::start(FerryOpts::new("gw-alias-max", free_port()));
    let mut raw = device(ferry.south_port, "al-x").await;
    raw.publish_with("devices/al-x/up/t", envelope("x-1"), alias(33))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_will_cannot_forge_the_brokers_own_marks_either() {
    use rumqttc::v5::mqttbytes::v5::{Connect, LastWill, LastWillProperties};
    let ferry = Ferry::start(FerryOpts::new("gw-will-forge", free_port()));
    // A will on the device's own up topic that claims, by the broker's
    // marks, to be another device's quarantined publish.
    let props = LastWillProperties {
        delay_interval: None,
        payload_format_indicator: None,
        message_expiry_interval: None,
        content_type: None,
        response_topic: None,
        correlation_data: None,
        user_properties: vec![
            ("ferry-publisher".into(), "wf-victim".into()),
            ("ferry-topic".into(), "devices/wf-victim/up/t".into()),
        ],
    };
    let will = LastWill::new(
        "devices/wf-a/up/t",
        envelope("will-1"),
        QoS::AtLeastOnce,
        false,
        Some(props),
    );
    let connect = Connect {
        keep_alive: 60,
        client_id: "wf-a".into(),
        clean_start: true,
        properties: None,
    };
    let (raw, ack) = RawV5::try_connect_packet(ferry.south_port, connect, Some(will))
        .await
        .unwrap();
    assert_eq!(
        ack.code,
        rumqttc::v5::mqttbytes::v5::ConnectReturnCode::Success
    );
    // Gone without DISCONNECT: the will is published.
    drop(raw);
    crate::support::receipts::eventually(
        SECS_10,
        "the will is stored as wf-a's own uplink",
        || ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'wf-a'", []) == 1,
    )
    .await;
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        0,
        "nothing taken for a quarantined publish of wf-victim's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enhanced_authentication_is_refused_with_bad_authentication_method() {
    use rumqttc::v5::mqttbytes::v5::{Connect, ConnectProperties, ConnectReturnCode};
    let ferry = Ferry::start(FerryOpts::new("gw-auth-method", free_port()));
    let mut props = ConnectProperties::new();
    props.authentication_method = Some("SCRAM-SHA-1".into());
    let connect = Connect {
        keep_alive: 60,
        client_id: "am-a".into(),
        clean_start: true,
        properties: Some(props),
    };
    let (_raw, ack) = RawV5::try_connect_packet(ferry.south_port, connect, None)
        .await
        .unwrap();
    assert_eq!(ack.code, ConnectReturnCode::BadAuthenticationMethod);
}

/// A publish whose properties make it larger than the maximum packet size
/// the CONNACK gave (`south.max_payload_bytes` + 1024) is refused for
/// its packet's size, which the reason gives with the limit it is over:
/// not its payload's, which is small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_too_large_for_its_properties_is_refused_by_its_packets_size() {
    use rumqttc::v5::mqttbytes::v5::Publish;
    let ferry = Ferry::start(FerryOpts::new("gw-props-size", free_port()));
    let mut raw = device(ferry.south_port, "ps-a").await;
    let props = PublishProperties {
        user_properties: vec![
            ("a".into(), "x".repeat(40_000)),
            ("b".into(), "y".repeat(40_000)),
        ],
        ..Default::default()
    };
    let mut publish = Publish::new(
        "devices/ps-a/up/t",
        QoS::AtLeastOnce,
        envelope("big-props"),
        Some(props),
    );
    publish.pkid = raw.next_pkid();
    let mut wire = bytes::BytesMut::new();
    Packet::Publish(publish.clone())
        .write(&mut wire, None)
        .unwrap();
    let size = wire.len();
    assert!(size > 65536 + 1024 && publish.payload.len() < 100);
    raw.send(Packet::Publish(publish)).await;
    let r = receipt_for(&mut raw, "big-props").await.expect("a receipt");
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(
        r["reason"],
        format!(
            "too_large: {size} bytes > 66560, the largest packet a device may send \
             (south.max_payload_bytes + 1024)"
        ),
        "{r}"
    );
}

/// A device connecting under the id of a connected MQTT 5 device takes
/// its session over; the old connection is told so, DISCONNECT 0x8E
/// (Session taken over), before it is closed. An MQTT 3.1.1 connection,
/// which has no DISCONNECT from the server, is just closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_taken_over_is_told_session_taken_over_in_mqtt_5() {
    use rumqttc::v5::mqttbytes::v5::DisconnectReasonCode;
    let ferry = Ferry::start(FerryOpts::new("gw-taken", free_port()));
    let mut old = device(ferry.south_port, "tk-a").await;
    let _new = device(ferry.south_port, "tk-a").await;
    let mut reason = None;
    while let Some(p) = old.recv(SECS_10).await {
        if let Packet::Disconnect(d) = p {
            reason = Some(d.reason_code);
        }
    }
    assert_eq!(reason, Some(DisconnectReasonCode::SessionTakenOver));

    let mut old = crate::support::RawMqtt::connect(ferry.south_port, "tk-b", 60).await;
    let _new = crate::support::RawMqtt::connect(ferry.south_port, "tk-b", 60).await;
    let mut packets = Vec::new();
    while let Some(p) = old.recv(SECS_10).await {
        packets.push(p);
    }
    assert!(
        !packets
            .iter()
            .any(|p| matches!(p, rumqttc::Packet::Disconnect)),
        "{packets:?}"
    );
}

/// A receive maximum of 0, or a maximum packet size of 0, in a CONNECT is
/// a protocol error (MQTT 5 §3.1.2.11.3, §3.1.2.11.4): refused with
/// CONNACK 0x82, and the connection closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_maximum_or_maximum_packet_size_of_zero_is_refused_as_a_protocol_error() {
    use rumqttc::v5::mqttbytes::v5::{Connect, ConnectProperties, ConnectReturnCode};
    let ferry = Ferry::start(FerryOpts::new("gw-zero-max", free_port()));
    for (id, receive_maximum, max_packet_size) in [("zm-a", Some(0), None), ("zm-b", None, Some(0))]
    {
        let mut props = ConnectProperties::new();
        props.receive_maximum = receive_maximum;
        props.max_packet_size = max_packet_size;
        let connect = Connect {
            keep_alive: 60,
            client_id: id.into(),
            clean_start: true,
            properties: Some(props),
        };
        let (mut raw, ack) = RawV5::try_connect_packet(ferry.south_port, connect, None)
            .await
            .unwrap();
        assert_eq!(ack.code, ConnectReturnCode::ProtocolError, "{id}");
        assert!(raw.recv(SECS_10).await.is_none(), "{id}: closed");
    }
    assert!(
        ferry.log().contains("connect_protocol_error"),
        "said: {}",
        ferry.log_tail()
    );
    // The same with values that are no error is let in.
    let mut props = ConnectProperties::new();
    props.receive_maximum = Some(1);
    props.max_packet_size = Some(1024);
    let connect = Connect {
        keep_alive: 60,
        client_id: "zm-c".into(),
        clean_start: true,
        properties: Some(props),
    };
    let (_raw, ack) = RawV5::try_connect_packet(ferry.south_port, connect, None)
        .await
        .unwrap();
    assert_eq!(ack.code, ConnectReturnCode::Success);
}

/// An MQTT 5 DISCONNECT may change a session expiry that is not 0
/// (§3.14.2.2.2), lengthening it too, held to `south.max_session_expiry_s`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnect_may_lengthen_the_session_expiry_up_to_the_cap() {
    use rumqttc::v5::mqttbytes::v5::{
        Connect, ConnectProperties, Disconnect, DisconnectProperties, DisconnectReasonCode,
    };
    let ferry = Ferry::start(
        FerryOpts::new("gw-disc-expiry", free_port()).with(|c| c.south.max_session_expiry_s = 2),
    );
    let connect = || {
        let mut props = ConnectProperties::new();
        props.session_expiry_interval = Some(1);
        Connect {
            keep_alive: 60,
            client_id: "de-a".into(),
            clean_start: false,
            properties: Some(props),
        }
    };
    let leave = |expiry: u32| {
        Packet::Disconnect(Disconnect {
            reason_code: DisconnectReasonCode::NormalDisconnection,
            properties: Some(DisconnectProperties {
                session_expiry_interval: Some(expiry),
                reason_string: None,
                user_properties: vec![],
                server_reference: None,
            }),
        })
    };
    let (mut raw, ack) = RawV5::try_connect_packet(ferry.south_port, connect(), None)
        .await
        .unwrap();
    assert!(!ack.session_present);
    raw.subscribe("devices/de-a/ack").await;
    // Connected with 1 s; the DISCONNECT asks for an hour, held to 2 s.
    raw.send(leave(3600)).await;
    drop(raw);
    tokio::time::sleep(Duration::from_millis(1400)).await;
    let (mut raw, ack) = RawV5::try_connect_packet(ferry.south_port, connect(), None)
        .await
        .unwrap();
    assert!(
        ack.session_present,
        "the session outlives the CONNECT's 1 s: the DISCONNECT lengthened it"
    );
    raw.send(leave(3600)).await;
    drop(raw);
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let (_raw, ack) = RawV5::try_connect_packet(ferry.south_port, connect(), None)
        .await
        .unwrap();
    assert!(
        !ack.session_present,
        "gone after south.max_session_expiry_s (2 s), whatever the DISCONNECT asked"
    );
}
