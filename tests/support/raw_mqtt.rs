//! A bare MQTT 3.1.1 client on one TCP (or TLS) socket: packets written
//! and read by hand (rumqttc only encodes and decodes them), no event loop.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::QoS;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{CONNECT_TIMEOUT, MAX_PACKET};

/// What a raw client talks over: TCP, or TLS over TCP.
pub trait RawStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> RawStream for T {}

/// A TLS client handshake over TCP to 127.0.0.1:`port` with `tls`; the
/// stream, or why there is none.
pub async fn tls_stream(
    port: u16,
    tls: Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("tcp connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("an IP is a name");
    let handshake = tokio_rustls::TlsConnector::from(tls).connect(name, tcp);
    match tokio::time::timeout(CONNECT_TIMEOUT, handshake).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("TLS handshake: {e}")),
        Err(_) => Err("TLS handshake: timed out".into()),
    }
}

/// A bare MQTT 3.1.1 client: it sends exactly what it is told, reads only
/// when asked, and acknowledges nothing by itself. For the edges a real
/// client library would smooth over (keep-alive 0, a device that stops
/// reading, a packet over the broker's limit, a refused CONNECT).
pub struct RawMqtt {
    stream: Box<dyn RawStream>,
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
        let login = super::session::login_for(port, client_id);
        let login = login.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
        RawMqtt::try_connect_login(port, client_id, keep_alive, login).await
    }

    /// [`RawMqtt::try_connect`] with this login (username, password), or
    /// none at all.
    pub async fn try_connect_login(
        port: u16,
        client_id: &str,
        keep_alive: u16,
        login: Option<(&str, &str)>,
    ) -> Result<(RawMqtt, rumqttc::ConnAck), String> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("tcp connect: {e}"))?;
        let _ = stream.set_nodelay(true);
        RawMqtt::try_connect_over(Box::new(stream), client_id, keep_alive, login).await
    }

    /// [`RawMqtt::try_connect`] over TLS with `tls`: the CONNACK, or why
    /// there is none (a refused handshake included).
    pub async fn try_connect_tls(
        port: u16,
        client_id: &str,
        keep_alive: u16,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<(RawMqtt, rumqttc::ConnAck), String> {
        let stream = tls_stream(port, tls).await?;
        RawMqtt::try_connect_over(Box::new(stream), client_id, keep_alive, None).await
    }

    /// [`RawMqtt::connect`] over TLS with `tls`.
    pub async fn connect_tls(
        port: u16,
        client_id: &str,
        keep_alive: u16,
        tls: Arc<rustls::ClientConfig>,
    ) -> RawMqtt {
        let (raw, ack) = RawMqtt::try_connect_tls(port, client_id, keep_alive, tls)
            .await
            .unwrap_or_else(|e| panic!("{client_id}: {e}"));
        assert_eq!(
            ack.code,
            rumqttc::ConnectReturnCode::Success,
            "{client_id} refused"
        );
        raw
    }

    /// CONNECT on an open stream; the CONNACK, or why there is none.
    async fn try_connect_over(
        stream: Box<dyn RawStream>,
        client_id: &str,
        keep_alive: u16,
        login: Option<(&str, &str)>,
    ) -> Result<(RawMqtt, rumqttc::ConnAck), String> {
        let mut connect = rumqttc::Connect::new(client_id);
        connect.keep_alive = keep_alive;
        connect.clean_session = true;
        if let Some((username, password)) = login {
            connect.set_login(username, password);
        }
        RawMqtt::try_connect_packet(stream, connect).await
    }

    /// A CONNECT as `id` to 127.0.0.1:`port`, keep-alive 60 and this clean
    /// session flag, that must be accepted; the client and its CONNACK.
    pub async fn connect_session(
        port: u16,
        id: &str,
        clean_session: bool,
    ) -> (RawMqtt, rumqttc::ConnAck) {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("tcp connect");
        let mut connect = rumqttc::Connect::new(id);
        connect.keep_alive = 60;
        connect.clean_session = clean_session;
        let (raw, ack) = RawMqtt::try_connect_packet(Box::new(tcp), connect)
            .await
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success, "{id}");
        (raw, ack)
    }

    /// `connect` (any CONNECT: a will, a long id) on an open stream; the
    /// CONNACK, or why there is none.
    pub async fn try_connect_packet(
        stream: Box<dyn RawStream>,
        connect: rumqttc::Connect,
    ) -> Result<(RawMqtt, rumqttc::ConnAck), String> {
        let mut raw = RawMqtt {
            stream,
            buf: bytes::BytesMut::new(),
            next_pkid: 0,
        };
        // A broker that refuses the client (a TLS certificate it does not
        // take) may close the socket before the CONNECT is written.
        raw.try_send(rumqttc::Packet::Connect(connect))
            .await
            .map_err(|e| format!("CONNECT not written: {e}"))?;
        match raw.try_recv(CONNECT_TIMEOUT).await? {
            Some(rumqttc::Packet::ConnAck(ack)) => Ok((raw, ack)),
            Some(other) => Err(format!("expected CONNACK, got {other:?}")),
            None => Err("no CONNACK: the socket closed or nothing came".into()),
        }
    }

    /// An MQTT 3.1 CONNECT (`MQIsdp`, level 3; clean session, keep-alive
    /// 60, this login) on TCP to 127.0.0.1:`port`, written by hand (rumqttc
    /// speaks 3.1.1 only; what follows the CONNECT is the same in both);
    /// the CONNACK, or why there is none.
    pub async fn try_connect_v31(
        port: u16,
        client_id: &str,
        login: Option<(&str, &str)>,
    ) -> Result<(RawMqtt, rumqttc::ConnAck), String> {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("tcp connect: {e}"))?;
        let mut raw = RawMqtt {
            stream: Box::new(stream),
            buf: bytes::BytesMut::new(),
            next_pkid: 0,
        };
        let string = |out: &mut Vec<u8>, s: &[u8]| {
            out.extend_from_slice(&(s.len() as u16).to_be_bytes());
            out.extend_from_slice(s);
        };
        let mut body = Vec::new();
        string(&mut body, b"MQIsdp");
        let flags = 0x02 | login.map_or(0, |_| 0xc0);
        body.extend_from_slice(&[3, flags, 0, 60]);
        string(&mut body, client_id.as_bytes());
        if let Some((user, password)) = login {
            string(&mut body, user.as_bytes());
            string(&mut body, password.as_bytes());
        }
        let mut packet = vec![0x10];
        let mut len = body.len();
        loop {
            let byte = (len % 128) as u8;
            len /= 128;
            packet.push(if len > 0 { byte | 0x80 } else { byte });
            if len == 0 {
                break;
            }
        }
        packet.extend_from_slice(&body);
        raw.write_raw(&packet)
            .await
            .map_err(|e| format!("CONNECT not written: {e}"))?;
        match raw.try_recv(CONNECT_TIMEOUT).await? {
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

    /// Writes one packet; the error if the socket is gone.
    pub async fn try_send(&mut self, packet: rumqttc::Packet) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut out = bytes::BytesMut::new();
        RawMqtt::encode(&packet, &mut out);
        self.stream.write_all(&out).await?;
        self.stream.flush().await
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
        // TLS may hold the last record back until flushed.
        self.stream.flush().await.expect("raw flush");
    }

    /// Closes the sending half (TCP FIN), as the kernel does for a client
    /// killed with nothing left unread: the broker reads what was sent,
    /// then the end, and ends the connection. What it wrote before that
    /// can still be read ([`RawMqtt::try_recv`] until the socket closes).
    pub async fn shutdown_write(&mut self) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.stream.shutdown().await
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
        self.try_recv(timeout)
            .await
            .unwrap_or_else(|e| panic!("raw read: {e}"))
    }

    /// The next packet; `None` on timeout or a closed socket; an error if
    /// what came is not MQTT (a TLS alert to a plain client, say).
    pub async fn try_recv(&mut self, timeout: Duration) -> Result<Option<rumqttc::Packet>, String> {
        use tokio::io::AsyncReadExt;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match rumqttc::Packet::read(&mut self.buf, MAX_PACKET) {
                Ok(p) => return Ok(Some(p)),
                Err(rumqttc::Error::InsufficientBytes(_)) => {}
                Err(e) => return Err(format!("not MQTT: {e}")),
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Ok(None),
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
