//! A broker end written by hand, for the tests of what no real broker
//! does (acknowledging out of order, never acknowledging): it sends and
//! reads exactly what a test says, packets encoded by rumqttc.

use std::time::Duration;

/// One end of a broker that acknowledges out of order, written by
/// hand: no real broker does, and rumqttc's collision needs it.
pub struct ByHand {
    stream: tokio::net::TcpStream,
    buf: bytes::BytesMut,
}

impl ByHand {
    pub async fn accept(listener: &tokio::net::TcpListener, session_present: bool) -> ByHand {
        let (stream, _) = listener.accept().await.expect("the client connects");
        // Nagle would hold a small packet until the client's (delayed) ACK
        // of the last: in paused time the clock jumps ahead meanwhile.
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let mut broker = ByHand {
            stream,
            buf: bytes::BytesMut::new(),
        };
        assert!(matches!(
            broker.read().await,
            Some(rumqttc::Packet::Connect(..))
        ));
        broker
            .write(|b| {
                rumqttc::ConnAck::new(rumqttc::ConnectReturnCode::Success, session_present).write(b)
            })
            .await;
        broker
    }

    /// The next packet, or `None` if none comes within 2 s.
    pub async fn read(&mut self) -> Option<rumqttc::Packet> {
        self.read_within(Duration::from_secs(2)).await
    }

    /// The next packet, or `None` if none comes within `within` or the
    /// client closed the connection. Cancel-safe: what was read stays.
    pub async fn read_within(&mut self, within: Duration) -> Option<rumqttc::Packet> {
        use tokio::io::AsyncReadExt;
        loop {
            match rumqttc::Packet::read(&mut self.buf, 1 << 20) {
                Ok(packet) => return Some(packet),
                Err(rumqttc::Error::InsufficientBytes(_)) => {}
                Err(e) => panic!("not MQTT: {e:?}"),
            }
            let read = self.stream.read_buf(&mut self.buf);
            match tokio::time::timeout(within, read).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }

    pub async fn write(
        &mut self,
        packet: impl FnOnce(&mut bytes::BytesMut) -> Result<usize, rumqttc::Error>,
    ) {
        use tokio::io::AsyncWriteExt;
        let mut out = bytes::BytesMut::new();
        packet(&mut out).unwrap();
        self.stream.write_all(&out).await.unwrap();
    }

    /// The topics of the publishes that arrive until `last` or a 2 s
    /// silence, each acknowledged if `ack`.
    pub async fn topics_until(&mut self, last: &str, ack: bool) -> Vec<String> {
        let mut topics = Vec::new();
        while let Some(packet) = self.read().await {
            if let rumqttc::Packet::Publish(p) = packet {
                if ack {
                    self.write(|b| rumqttc::PubAck::new(p.pkid).write(b)).await;
                }
                topics.push(p.topic.clone());
                if p.topic == last {
                    break;
                }
            }
        }
        topics
    }
}
