//! A bare MQTT 3.1.1 client on one TCP socket: packets written and read by
//! hand (rumqttc only encodes and decodes them), no event loop.

use std::time::Duration;

use rumqttc::QoS;

use super::{CONNECT_TIMEOUT, MAX_PACKET};

/// A bare MQTT 3.1.1 client: it sends exactly what it is told, reads only
/// when asked, and acknowledges nothing by itself. For the edges a real
/// client library would smooth over (keep-alive 0, a device that stops
/// reading, a packet over the broker's limit, a refused CONNECT).
pub struct RawMqtt {
    stream: tokio::net::TcpStream,
    buf: bytes::BytesMut,
    next_pkid: u16,
}

impl RawMqtt {
    /// TCP connect and CONNECT; the CONNACK, or why there is none.
    pub async fn try_connect(
        port: u16,
        client_id: &str,
        keep_alive: u16,
    ) -> Result<(RawMqtt, rumqttc::ConnAck), String> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("tcp connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        let mut raw = RawMqtt {
            stream,
            buf: bytes::BytesMut::new(),
            next_pkid: 0,
        };
        let mut connect = rumqttc::Connect::new(client_id);
        connect.keep_alive = keep_alive;
        connect.clean_session = true;
        raw.send(rumqttc::Packet::Connect(connect)).await;
        match raw.recv(CONNECT_TIMEOUT).await {
            Some(rumqttc::Packet::ConnAck(ack)) => Ok((raw, ack)),
            Some(other) => Err(format!("expected CONNACK, got {other:?}")),
            None => Err("no CONNACK: the socket closed or nothing came".into()),
        }
    }

    /// Connects and insists on an accepted session.
    pub async fn connect(port: u16, client_id: &str, keep_alive: u16) -> RawMqtt {
        let (raw, ack) = RawMqtt::try_connect(port, client_id, keep_alive)
            .await
            .unwrap_or_else(|e| panic!("{client_id}: {e}"));
        assert_eq!(
            ack.code,
            rumqttc::ConnectReturnCode::Success,
            "{client_id} refused"
        );
        raw
    }

    pub fn next_pkid(&mut self) -> u16 {
        self.next_pkid = self.next_pkid % u16::MAX + 1;
        self.next_pkid
    }

    fn encode(packet: &rumqttc::Packet, out: &mut bytes::BytesMut) {
        packet
            .write(out, usize::MAX)
            .unwrap_or_else(|e| panic!("encode {packet:?}: {e}"));
    }

    /// Writes one packet.
    pub async fn send(&mut self, packet: rumqttc::Packet) {
        self.send_many(std::iter::once(packet)).await;
    }

    /// Writes many packets in one go (the socket write may block until the
    /// broker reads).
    pub async fn send_many(&mut self, packets: impl IntoIterator<Item = rumqttc::Packet>) {
        use tokio::io::AsyncWriteExt;
        let mut out = bytes::BytesMut::new();
        for p in packets {
            RawMqtt::encode(&p, &mut out);
        }
        self.stream.write_all(&out).await.expect("raw write");
    }

    /// Writes bytes as they are (a packet written by hand, or garbage); an
    /// error once the broker has closed the connection.
    pub async fn write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await
    }

    /// A QoS 1 PUBLISH with a fresh packet id.
    pub fn publish(&mut self, topic: &str, payload: impl Into<Vec<u8>>) -> rumqttc::Packet {
        let mut p = rumqttc::Publish::new(topic, QoS::AtLeastOnce, payload);
        p.pkid = self.next_pkid();
        rumqttc::Packet::Publish(p)
    }

    /// SUBSCRIBE at QoS 1; returns the SUBACK's codes.
    pub async fn subscribe(&mut self, filters: &[String]) -> Vec<rumqttc::SubscribeReasonCode> {
        let mut sub = rumqttc::Subscribe::new_many(
            filters
                .iter()
                .map(|f| rumqttc::SubscribeFilter::new(f.clone(), QoS::AtLeastOnce)),
        );
        sub.pkid = self.next_pkid();
        self.send(rumqttc::Packet::Subscribe(sub)).await;
        loop {
            match self.recv(CONNECT_TIMEOUT).await {
                Some(rumqttc::Packet::SubAck(ack)) => return ack.return_codes,
                Some(_) => continue,
                None => panic!("no SUBACK"),
            }
        }
    }

    /// The next packet; `None` on timeout or a closed socket.
    pub async fn recv(&mut self, timeout: Duration) -> Option<rumqttc::Packet> {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match rumqttc::Packet::read(&mut self.buf, MAX_PACKET) {
                Ok(p) => return Some(p),
                Err(rumqttc::Error::InsufficientBytes(_)) => {}
                Err(e) => panic!("raw read: {e}"),
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Whether the broker closed the socket within `timeout` (packets that
    /// arrive meanwhile are discarded).
    pub async fn closed_within(&mut self, timeout: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut scratch = [0u8; 4096];
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut scratch)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
                Err(_) => return false,
            }
        }
    }

    /// Reads for `timeout`, acknowledging every QoS 1 PUBLISH and handing
    /// its payload to `on_publish` until it returns true.
    pub async fn read_publishes(
        &mut self,
        timeout: Duration,
        mut on_publish: impl FnMut(&rumqttc::Publish) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            match self.recv(left).await {
                Some(rumqttc::Packet::Publish(p)) => {
                    if p.qos == QoS::AtLeastOnce {
                        self.send(rumqttc::Packet::PubAck(rumqttc::PubAck::new(p.pkid)))
                            .await;
                    }
                    if on_publish(&p) {
                        return true;
                    }
                }
                Some(_) => {}
                None => return false,
            }
        }
    }
}
