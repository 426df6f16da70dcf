//! A bare device client at any protocol level the embedded broker speaks:
//! MQTT 3.1 and 3.1.1 through [`RawMqtt`] (3.1 differs only in its
//! CONNECT), MQTT 5 through [`Raw5`] (rumqttc's v5 codec, no event loop).
//! It sends exactly what it is told; [`AnyDevice::next_message`]
//! acknowledges what it reads.

use std::time::Duration;

use bytes::BytesMut;
use rumqttc::v5::mqttbytes::v5;
use rumqttc::v5::mqttbytes::QoS as QoS5;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::RawMqtt;

const SECS_10: Duration = Duration::from_secs(10);

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

/// A bare MQTT 5 client.
pub struct Raw5 {
    tcp: TcpStream,
    buf: BytesMut,
    pkid: u16,
}

impl Raw5 {
    /// TCP connect and CONNECT (clean start, keep-alive 60, the device's
    /// login if the test gave it one); the CONNACK, or why there is none.
    pub async fn try_connect(port: u16, id: &str) -> Result<(Raw5, v5::ConnAck), String> {
        let tcp = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("tcp connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let mut raw = Raw5 {
            tcp,
            buf: BytesMut::new(),
            pkid: 0,
        };
        let connect = v5::Connect {
            keep_alive: 60,
            client_id: id.into(),
            clean_start: true,
            properties: None,
        };
        let login = super::session::login_for(port, id).map(|(u, p)| v5::Login::new(u, p));
        raw.send(v5::Packet::Connect(connect, None, login)).await;
        match raw.recv(SECS_10).await {
            Some(v5::Packet::ConnAck(ack)) => Ok((raw, ack)),
            other => Err(format!("{id}: expected CONNACK, got {other:?}")),
        }
    }

    /// Connects and insists on being accepted.
    pub async fn connect(port: u16, id: &str) -> Raw5 {
        let (raw, ack) = Raw5::try_connect(port, id).await.unwrap();
        assert_eq!(ack.code, v5::ConnectReturnCode::Success, "{id}");
        raw
    }

    pub fn next_pkid(&mut self) -> u16 {
        self.pkid = self.pkid % u16::MAX + 1;
        self.pkid
    }

    pub async fn send(&mut self, packet: v5::Packet) {
        let mut out = BytesMut::new();
        packet.write(&mut out, None).expect("encode");
        self.tcp.write_all(&out).await.expect("write");
    }

    /// A QoS 1 PUBLISH on `topic` (empty: by alias) with these properties.
    pub async fn publish(&mut self, topic: &str, payload: Vec<u8>, props: v5::PublishProperties) {
        let mut p = v5::Publish::new(topic, QoS5::AtLeastOnce, payload, Some(props));
        p.pkid = self.next_pkid();
        self.send(v5::Packet::Publish(p)).await;
    }

    /// SUBSCRIBE to `filters` at QoS 1; the SUBACK's reason codes.
    pub async fn subscribe(&mut self, filters: &[String]) -> Vec<v5::SubscribeReasonCode> {
        let filters = filters
            .iter()
            .map(|f| v5::Filter::new(f.clone(), QoS5::AtLeastOnce));
        let mut sub = v5::Subscribe::new_many(filters, None);
        sub.pkid = self.next_pkid();
        self.send(v5::Packet::Subscribe(sub)).await;
        loop {
            match self.recv(SECS_10).await {
                Some(v5::Packet::SubAck(ack)) => return ack.return_codes,
                Some(_) => continue,
                None => panic!("no SUBACK"),
            }
        }
    }

    /// The next packet within `timeout`; `None` when the socket closed or
    /// nothing came.
    pub async fn recv(&mut self, timeout: Duration) -> Option<v5::Packet> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(p) = v5::Packet::read(&mut self.buf, None) {
                return Some(p);
            }
            let read = tokio::time::timeout_at(deadline, self.tcp.read_buf(&mut self.buf)).await;
            match read {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }
}

/// A device speaking one protocol level.
pub enum AnyDevice {
    V4(RawMqtt),
    V5(Raw5),
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
            Level::V5 => AnyDevice::V5(Raw5::connect(port, id).await),
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
                .subscribe(filters)
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
            AnyDevice::V5(raw) => raw.publish(topic, payload, Default::default()).await,
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
