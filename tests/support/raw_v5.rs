//! A bare MQTT 5 client on one TCP socket, packets encoded and decoded by
//! rumqttc's v5 codec and nothing else: for publishes whose properties a
//! test chooses exactly (user properties, message expiry).

use std::time::Duration;

use bytes::BytesMut;
use rumqttc::v5::mqttbytes::v5::{
    Connect, Filter, Login, Packet, PubAck, Publish, PublishProperties, Subscribe,
};
use rumqttc::v5::mqttbytes::QoS;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{CONNECT_TIMEOUT, MAX_PACKET};

/// A bare MQTT 5 client: it sends what it is told, and acknowledges the
/// QoS 1 publishes it reads.
pub struct RawV5 {
    stream: TcpStream,
    buf: BytesMut,
    next_pkid: u16,
}

impl RawV5 {
    /// `connect` (any MQTT 5 CONNECT) with this will and the client's test
    /// login if it has one; the CONNACK, or why there is none.
    pub async fn try_connect_packet(
        port: u16,
        connect: Connect,
        will: Option<rumqttc::v5::mqttbytes::v5::LastWill>,
    ) -> Result<(RawV5, rumqttc::v5::mqttbytes::v5::ConnAck), String> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("tcp connect: {e}"))?;
        let mut raw = RawV5 {
            stream,
            buf: BytesMut::new(),
            next_pkid: 0,
        };
        let login =
            super::session::login_for(port, &connect.client_id).map(|(u, p)| Login::new(u, p));
        raw.send(Packet::Connect(connect, will, login)).await;
        match raw.recv(CONNECT_TIMEOUT).await {
            Some(Packet::ConnAck(ack)) => Ok((raw, ack)),
            other => Err(format!("expected an MQTT 5 CONNACK, got {other:?}")),
        }
    }

    /// CONNECT (clean start, MQTT 5) as `client_id`, with its test login if
    /// it has one, and insists on a successful CONNACK.
    pub async fn connect(port: u16, client_id: &str) -> RawV5 {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("{client_id}: tcp connect: {e}"));
        let _ = stream.set_nodelay(true);
        let mut raw = RawV5 {
            stream,
            buf: BytesMut::new(),
            next_pkid: 0,
        };
        let login = super::session::login_for(port, client_id).map(|(u, p)| Login::new(u, p));
        let connect = Connect {
            keep_alive: 30,
            client_id: client_id.into(),
            clean_start: true,
            properties: None,
        };
        raw.send(Packet::Connect(connect, None, login)).await;
        match raw.recv(CONNECT_TIMEOUT).await {
            Some(Packet::ConnAck(ack)) => assert_eq!(
                ack.code,
                rumqttc::v5::mqttbytes::v5::ConnectReturnCode::Success,
                "{client_id}: CONNACK {ack:?}"
            ),
            other => panic!("{client_id}: expected an MQTT 5 CONNACK, got {other:?}"),
        }
        raw
    }

    pub fn next_pkid(&mut self) -> u16 {
        self.next_pkid = self.next_pkid % u16::MAX + 1;
        self.next_pkid
    }

    pub async fn send(&mut self, packet: Packet) {
        let mut out = BytesMut::new();
        packet
            .write(&mut out, None)
            .unwrap_or_else(|e| panic!("encode {packet:?}: {e:?}"));
        self.stream.write_all(&out).await.expect("raw v5 write");
    }

    /// SUBSCRIBE at QoS 1 to `filter`; waits for the SUBACK.
    pub async fn subscribe(&mut self, filter: &str) {
        let mut sub = Subscribe::new(Filter::new(filter, QoS::AtLeastOnce), None);
        sub.pkid = self.next_pkid();
        self.send(Packet::Subscribe(sub)).await;
        loop {
            match self.recv(CONNECT_TIMEOUT).await {
                Some(Packet::SubAck(_)) => return,
                Some(_) => continue,
                None => panic!("no SUBACK for {filter}"),
            }
        }
    }

    /// SUBSCRIBE at QoS 1 to every filter in one packet; the SUBACK's
    /// reason codes.
    pub async fn subscribe_all(
        &mut self,
        filters: &[String],
    ) -> Vec<rumqttc::v5::mqttbytes::v5::SubscribeReasonCode> {
        let filters = filters
            .iter()
            .map(|f| Filter::new(f.clone(), QoS::AtLeastOnce));
        let mut sub = Subscribe::new_many(filters, None);
        sub.pkid = self.next_pkid();
        self.send(Packet::Subscribe(sub)).await;
        loop {
            match self.recv(CONNECT_TIMEOUT).await {
                Some(Packet::SubAck(ack)) => return ack.return_codes,
                Some(_) => continue,
                None => panic!("no SUBACK"),
            }
        }
    }

    /// A QoS 1 PUBLISH of `payload` on `topic` (empty: by alias) with
    /// exactly these properties.
    pub async fn publish_with(
        &mut self,
        topic: &str,
        payload: impl Into<bytes::Bytes>,
        props: PublishProperties,
    ) {
        let mut p = Publish::new(topic, QoS::AtLeastOnce, payload, Some(props));
        p.pkid = self.next_pkid();
        self.send(Packet::Publish(p)).await;
    }

    /// A QoS 1 PUBLISH of `payload` on `topic` with these user properties
    /// (in order) and message expiry.
    pub async fn publish(
        &mut self,
        topic: &str,
        payload: impl Into<bytes::Bytes>,
        user: &[(&str, &str)],
        expiry_s: Option<u32>,
    ) {
        let props = PublishProperties {
            message_expiry_interval: expiry_s,
            user_properties: user
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let mut p = Publish::new(topic, QoS::AtLeastOnce, payload, Some(props));
        p.pkid = self.next_pkid();
        self.send(Packet::Publish(p)).await;
    }

    /// The next packet; `None` on timeout or a closed socket.
    pub async fn recv(&mut self, timeout: Duration) -> Option<Packet> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match Packet::read(&mut self.buf, Some(MAX_PACKET as u32)) {
                Ok(p) => return Some(p),
                Err(rumqttc::v5::mqttbytes::Error::InsufficientBytes(_)) => {}
                Err(e) => panic!("not MQTT 5: {e:?}"),
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// The JSON publishes that arrive within `timeout`, each acknowledged,
    /// until `done` says enough.
    pub async fn json_until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut got = Vec::new();
        while !done(&got) {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.recv(left).await {
                Some(Packet::Publish(p)) => {
                    if p.qos == QoS::AtLeastOnce {
                        self.send(Packet::PubAck(PubAck::new(p.pkid, None))).await;
                    }
                    got.push(serde_json::from_slice(&p.payload).unwrap_or(Value::Null));
                }
                Some(_) => {}
                None => break,
            }
        }
        got
    }
}
