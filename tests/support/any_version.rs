//! A bare device client at any protocol level the embedded broker speaks:
//! MQTT 3.1 and 3.1.1 through [`RawMqtt`] (3.1 differs only in its
//! CONNECT), MQTT 5 through [`RawV5`] (rumqttc's v5 codec, no event loop).
//! It sends exactly what it is told; [`AnyDevice::next_message`]
//! acknowledges what it reads.

use std::time::Duration;

use rumqttc::v5::mqttbytes::v5;
use rumqttc::v5::mqttbytes::QoS as QoS5;

use super::raw_v5::RawV5;
use super::RawMqtt;

/// An MQTT protocol level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    V31,
    V311,
    V5,
}

impl Level {
    pub const ALL: [Level; 3] = [Level::V31, Level::V311, Level::V5];
}

/// A device speaking one protocol level.
pub enum AnyDevice {
    V4(RawMqtt),
    V5(RawV5),
}

impl AnyDevice {
    /// Connects as `id` at `level` (with the device's login if the test
    /// gave it one) and insists on being accepted.
    pub async fn connect(level: Level, port: u16, id: &str) -> AnyDevice {
        match level {
            Level::V31 => {
                let login = super::session::login_for(port, id);
                let login = login.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
                let (raw, ack) = RawMqtt::try_connect_v31(port, id, login)
                    .await
                    .unwrap_or_else(|e| panic!("{id}: {e}"));
                assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success, "{id}");
                AnyDevice::V4(raw)
            }
            Level::V311 => AnyDevice::V4(RawMqtt::connect(port, id, 60).await),
            Level::V5 => AnyDevice::V5(RawV5::connect(port, id).await),
        }
    }

    /// SUBSCRIBE to `filters`; for each, whether it was granted.
    pub async fn subscribe(&mut self, filters: &[String]) -> Vec<bool> {
        match self {
            AnyDevice::V4(raw) => raw
                .subscribe(filters)
                .await
                .into_iter()
                .map(|c| matches!(c, rumqttc::SubscribeReasonCode::Success(_)))
                .collect(),
            AnyDevice::V5(raw) => raw
                .subscribe_all(filters)
                .await
                .into_iter()
                .map(|c| matches!(c, v5::SubscribeReasonCode::Success(_)))
                .collect(),
        }
    }

    /// A QoS 1 PUBLISH.
    pub async fn publish(&mut self, topic: &str, payload: Vec<u8>) {
        match self {
            AnyDevice::V4(raw) => {
                let p = raw.publish(topic, payload);
                raw.send(p).await;
            }
            AnyDevice::V5(raw) => raw.publish_with(topic, payload, Default::default()).await,
        }
    }

    /// The next PUBLISH within `timeout`, acknowledged: its topic and
    /// payload.
    pub async fn next_message(&mut self, timeout: Duration) -> Option<(String, Vec<u8>)> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self {
                AnyDevice::V4(raw) => match raw.recv(left).await? {
                    rumqttc::Packet::Publish(p) => {
                        if p.qos != rumqttc::QoS::AtMostOnce {
                            raw.send(rumqttc::Packet::PubAck(rumqttc::PubAck::new(p.pkid)))
                                .await;
                        }
                        return Some((p.topic, p.payload.to_vec()));
                    }
                    _ => continue,
                },
                AnyDevice::V5(raw) => match raw.recv(left).await? {
                    v5::Packet::Publish(p) => {
                        if p.qos != QoS5::AtMostOnce {
                            let ack = v5::PubAck::new(p.pkid, None);
                            raw.send(v5::Packet::PubAck(ack)).await;
                        }
                        let topic = String::from_utf8_lossy(&p.topic).into_owned();
                        return Some((topic, p.payload.to_vec()));
                    }
                    _ => continue,
                },
            }
        }
    }
}
