use bytes::{Buf, BytesMut};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    time::timeout,
};

use std::{
    collections::VecDeque,
    io::{self, ErrorKind},
};
use tokio::time::{error::Elapsed, Duration};

/// ferry: initial buffer sizes per connection, and the size past which an
/// emptied buffer is given back.
const READ_BUFFER: usize = 4 * 1024;
const WRITE_BUFFER: usize = 1024;
const SHRINK_ABOVE: usize = 64 * 1024;

use crate::protocol::{self, Packet, Protocol};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O = {0}")]
    Io(#[from] io::Error),
    #[error("Invalid data = {0}")]
    Protocol(#[from] protocol::Error),
    #[error["Keep alive timeout"]]
    KeepAlive(#[from] Elapsed),
    /// ferry: a CONNECT over the size limit, read off the wire and
    /// discarded; its client id was this long.
    #[error("CONNECT of {size} bytes over the limit (client id of {client_id_len} bytes)")]
    ConnectTooLarge { size: usize, client_id_len: usize },
}

/// Network transforms packets <-> frames efficiently. It takes
/// advantage of pre-allocation, buffering and vectorization when
/// appropriate to achieve performance
pub struct Network<P> {
    /// Socket for IO
    socket: Box<dyn N>,
    /// Buffered reads
    read: BytesMut,
    /// Buffered writes
    write: BytesMut,
    /// Maximum packet size
    max_incoming_size: usize,
    /// Maximum connection buffer count. TODO: Change this to use bytes for deterministicness
    max_connection_buffer_len: usize,
    /// Keep alive timeout
    keepalive: Duration,
    /// Protocol
    protocol: P,
    /// ferry: payload bytes kept of a PUBLISH over `max_incoming_size`
    /// (0: such a packet fails the connection, as upstream).
    oversize_head: usize,
    /// ferry: bytes of a skipped oversized packet still to discard.
    skip: usize,
    /// ferry: the oversized CONNECT being skipped, reported once it is.
    skipped_connect: Option<Error>,
}

impl<P: Protocol> Network<P> {
    pub fn new(
        socket: Box<dyn N>,
        max_incoming_size: usize,
        max_connection_buffer_len: usize,
        protocol: P,
    ) -> Network<P> {
        Network {
            socket,
            // ferry: 20 KiB per idle connection was most of what one cost;
            // buffers grow for bursts and shrink back after them.
            read: BytesMut::with_capacity(READ_BUFFER),
            write: BytesMut::with_capacity(WRITE_BUFFER),
            max_incoming_size,
            max_connection_buffer_len,
            // Overwritten by keepalive value in connect packet, otherwise we
            // would wait indefinitely until we get a packet / network error
            // when we call read.
            keepalive: Duration::MAX,
            protocol,
            oversize_head: 0,
            skip: 0,
            skipped_connect: None,
        }
    }

    /// ferry: skip a PUBLISH over the size limit on the wire, passing on its
    /// topic, packet id and the first `head` bytes of its payload, marked
    /// with a [`crate::OVERSIZE_PROPERTY`] user property giving its real
    /// size (the whole packet's), instead of failing the connection. MQTT 3.1.1 and 5
    /// framing (5's properties are skipped).
    pub fn set_oversize_head(&mut self, head: usize) {
        self.oversize_head = head;
    }

    /// ferry: drops buffered bytes of a packet being skipped.
    fn discard(&mut self) {
        let n = self.skip.min(self.read.len());
        self.read.advance(n);
        self.skip -= n;
    }

    /// ferry: the buffered oversized packet (its fixed header is buffered)
    /// as a marked, cut-short PUBLISH once its head is buffered: `Ok(None)`
    /// with the bytes still needed until then.
    fn oversized(&mut self) -> Result<Result<Packet, usize>, Error> {
        let too_large = |len| Error::Protocol(protocol::Error::PayloadSizeLimitExceeded(len));
        let byte1 = self.read[0];
        let mut remaining = 0usize;
        let mut fixed = 1;
        loop {
            let Some(&b) = self.read.get(fixed) else {
                return Ok(Err(1));
            };
            remaining |= ((b & 0x7f) as usize) << (7 * (fixed - 1));
            fixed += 1;
            if b & 0x80 == 0 {
                break;
            }
            if fixed > 4 {
                return Err(Error::Protocol(protocol::Error::MalformedRemainingLength));
            }
        }
        if byte1 >> 4 != 3 {
            return Err(too_large(remaining));
        }
        let qos = (byte1 >> 1) & 0b11;
        if self.read.len() < fixed + 2 {
            return Ok(Err(fixed + 2 - self.read.len()));
        }
        let topic_len = u16::from_be_bytes([self.read[fixed], self.read[fixed + 1]]) as usize;
        let mut header = 2 + topic_len + if qos > 0 { 2 } else { 0 };
        // MQTT 5: the properties follow, and are skipped with the rest
        // (the message is answered `rejected`; what it carried is moot).
        let mut properties = 0;
        if self.protocol.properties_follow_packet_id() {
            let mut shift = 0;
            loop {
                let Some(&b) = self.read.get(fixed + header) else {
                    return Ok(Err(fixed + header + 1 - self.read.len()));
                };
                header += 1;
                properties |= ((b & 0x7f) as usize) << shift;
                shift += 7;
                if b & 0x80 == 0 {
                    break;
                }
                if shift > 21 {
                    return Err(Error::Protocol(protocol::Error::MalformedRemainingLength));
                }
            }
        }
        let packet_id_end = 2 + topic_len + if qos > 0 { 2 } else { 0 };
        header += properties;
        if header > remaining {
            return Err(Error::Protocol(protocol::Error::MalformedPacket));
        }
        let want = fixed + remaining.min(header + self.oversize_head);
        if self.read.len() < want {
            return Ok(Err(want - self.read.len()));
        }
        let mut packet = self.read.split_to(want).freeze();
        packet.advance(fixed + 2);
        let topic = packet.split_to(topic_len);
        let pkid = if qos > 0 { packet.get_u16() } else { 0 };
        packet.advance((header - packet_id_end).min(packet.len()));
        // The whole packet's size: what is over the limit, MQTT 5's
        // properties included.
        let size = fixed + remaining;
        self.skip = fixed + remaining - want;
        self.discard();
        tracing::info!(
            event = "oversize_publish_skipped",
            bytes = size,
            limit = self.max_incoming_size,
            "oversized publish skipped; its head is passed on"
        );
        let publish = protocol::Publish {
            dup: byte1 & 0b1000 != 0,
            qos: protocol::qos(qos).ok_or(Error::Protocol(protocol::Error::InvalidQoS(qos)))?,
            retain: false,
            topic,
            pkid,
            payload: packet,
        };
        let properties = protocol::PublishProperties {
            user_properties: vec![(crate::OVERSIZE_PROPERTY.to_owned(), size.to_string())],
            ..Default::default()
        };
        Ok(Ok(Packet::Publish(publish, Some(properties))))
    }

    /// ferry: the protocol level the client speaks (see [`Protocol::level`]).
    pub fn protocol_level(&self) -> u8 {
        self.protocol.level()
    }

    /// ferry: whether the client speaks MQTT 5 (its CONNECT said so).
    pub fn speaks_v5(&self) -> bool {
        self.protocol.properties_follow_packet_id()
    }

    /// ferry: tells an MQTT 5 client why the broker closes the connection
    /// (a 3.1.1 connection is just closed); a write that fails is moot.
    pub async fn disconnect(&mut self, reason: protocol::DisconnectReasonCode) {
        if self.speaks_v5() {
            let packet = Packet::Disconnect(
                protocol::Disconnect {
                    reason_code: reason,
                },
                None,
            );
            let _ = self.write(packet).await;
        }
    }

    pub fn set_keepalive(&mut self, keepalive: u16) {
        let keepalive = Duration::from_secs(keepalive as u64);
        self.keepalive = keepalive + keepalive.mul_f32(0.5);
    }

    /// Reads more than 'required' bytes to frame a packet into self.read buffer
    async fn read_bytes(&mut self, required: usize) -> io::Result<usize> {
        // TODO: Fix this cancellation bug and write unit test
        let mut total_read = 0;
        loop {
            let read = self.socket.read_buf(&mut self.read).await?;
            if 0 == read {
                let error = if self.read.is_empty() {
                    io::Error::new(ErrorKind::ConnectionAborted, "connection closed by peer")
                } else {
                    io::Error::new(ErrorKind::ConnectionReset, "connection reset by peer")
                };

                return Err(error);
            }

            total_read += read;
            if total_read >= required {
                return Ok(total_read);
            }
        }
    }

    /// ferry: a CONNECT over the size limit (its fixed header is
    /// buffered): skipped on the wire, so that the client, which is still
    /// writing it, can read the refusal instead of a reset; `Ok(n)` while
    /// `n` more bytes are needed to read its client id's length.
    fn oversized_connect(&mut self) -> Result<usize, Error> {
        let mut remaining = 0usize;
        let mut fixed = 1;
        loop {
            let Some(&b) = self.read.get(fixed) else {
                return Ok(1);
            };
            remaining |= ((b & 0x7f) as usize) << (7 * (fixed - 1));
            fixed += 1;
            if b & 0x80 == 0 {
                break;
            }
            if fixed > 4 {
                return Err(Error::Protocol(protocol::Error::MalformedRemainingLength));
            }
        }
        // Protocol name (length-prefixed), level, flags, keep-alive, then
        // the client id's length.
        let at = |i: usize| self.read.get(fixed + i).copied();
        let (Some(n0), Some(n1)) = (at(0), at(1)) else {
            return Ok(fixed + 2 - self.read.len());
        };
        let id_at = 2 + u16::from_be_bytes([n0, n1]) as usize + 4;
        if id_at + 2 > remaining {
            return Err(Error::Protocol(protocol::Error::MalformedPacket));
        }
        let (Some(c0), Some(c1)) = (at(id_at), at(id_at + 1)) else {
            return Ok(fixed + id_at + 2 - self.read.len());
        };
        self.skip = fixed + remaining;
        self.skipped_connect = Some(Error::ConnectTooLarge {
            size: remaining,
            client_id_len: u16::from_be_bytes([c0, c1]) as usize,
        });
        self.discard();
        Ok(0)
    }

    /// Waits on network for 1 packet
    pub async fn read(&mut self) -> Result<Packet, Error> {
        loop {
            self.discard();
            if self.skip == 0 {
                if let Some(refused) = self.skipped_connect.take() {
                    return Err(refused);
                }
            }
            let required = if self.skip > 0 {
                1
            } else {
                match Protocol::read_mut(&mut self.protocol, &mut self.read, self.max_incoming_size)
                {
                    Ok(mut packet) => {
                        crate::link::properties::strip_reserved(&mut packet);
                        return Ok(packet);
                    }
                    Err(protocol::Error::InsufficientBytes(required)) => required,
                    Err(protocol::Error::PayloadSizeLimitExceeded(_))
                        if self.read.first().is_some_and(|b| b >> 4 == 1) =>
                    {
                        match self.oversized_connect()? {
                            0 => continue,
                            required => required,
                        }
                    }
                    Err(protocol::Error::PayloadSizeLimitExceeded(_)) if self.oversize_head > 0 => {
                        match self.oversized()? {
                            Ok(packet) => return Ok(packet),
                            Err(required) => required,
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            };

            // read more packets until a frame can be created. This function
            // blocks until a frame can be created. Use this in a select! branch
            timeout(self.keepalive, self.read_bytes(required)).await??;
        }
    }

    /// Read packets in bulk. This allow replies to be in bulk. This method is used
    /// after the connection is established to read a bunch of incoming packets
    pub fn readv(&mut self, packets: &mut VecDeque<Packet>) -> Result<usize, Error> {
        loop {
            self.discard();
            if self.skip > 0 {
                return Ok(packets.len());
            }
            let read = match self
                .protocol
                .read_mut(&mut self.read, self.max_incoming_size)
            {
                Err(protocol::Error::PayloadSizeLimitExceeded(_)) if self.oversize_head > 0 => {
                    match self.oversized()? {
                        Ok(packet) => Ok(packet),
                        Err(_) => return Ok(packets.len()),
                    }
                }
                // ferry: a client's own `ferry-` marks go (an oversized
                // publish, above, carries only the broker's).
                Ok(mut packet) => {
                    crate::link::properties::strip_reserved(&mut packet);
                    Ok(packet)
                }
                other => other,
            };
            match read {
                Ok(packet) => {
                    packets.push_back(packet);
                    let connection_buffer_length = packets.len();
                    if connection_buffer_length >= self.max_connection_buffer_len {
                        return Ok(connection_buffer_length);
                    }
                }
                Err(protocol::Error::InsufficientBytes(_)) => return Ok(packets.len()),
                Err(e) => return Err(io::Error::new(ErrorKind::InvalidData, e.to_string()).into()),
            }
        }
    }

    pub async fn write(&mut self, packet: Packet) -> Result<(), Error> {
        Protocol::write(&self.protocol, packet, &mut self.write)?;
        self.socket.write_all(&self.write).await?;
        self.reset_write();
        Ok(())
    }

    /// ferry: takes any packets in order (patch 60), not a `VecDeque`.
    pub async fn writev(&mut self, packets: impl IntoIterator<Item = Packet>) -> Result<(), Error> {
        for packet in packets {
            Protocol::write(&self.protocol, packet, &mut self.write)?;
        }
        self.socket.write_all(&self.write).await?;
        self.reset_write();
        Ok(())
    }

    /// ferry: empties the write buffer, giving back what a burst grew it to.
    fn reset_write(&mut self) {
        if self.write.capacity() > SHRINK_ABOVE {
            self.write = BytesMut::with_capacity(WRITE_BUFFER);
        } else {
            self.write.clear();
        }
    }
}

pub trait N: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T> N for T where T: AsyncRead + AsyncWrite + Unpin + Send {}
