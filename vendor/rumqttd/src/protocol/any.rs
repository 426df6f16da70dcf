//! ferry: one listener for MQTT 3.1, 3.1.1 and 5. A connection's codec is
//! chosen by the protocol level of its CONNECT (3 `MQIsdp` and 4 `MQTT`:
//! [`V4`]'s, 5: [`V5`]'s) and kept for the connection's life. Everything
//! above the codec (the router, the link, isolation, auth) sees the same
//! [`Packet`]s whichever version a client speaks.
//!
//! Until the CONNECT is read, nothing is written: the first packet of a
//! connection decides. A first packet that is no CONNECT, or a CONNECT of
//! a level none of the codecs speaks, is read by [`V4`], which refuses it
//! (`InvalidProtocolLevel` is answered CONNACK 1 by the server).

use bytes::BytesMut;

use super::v4::V4;
use super::v5::V5;
use super::{Error, Packet, Protocol};

/// The codec of one connection, chosen by its CONNECT.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AnyVersion {
    /// No CONNECT read yet.
    #[default]
    Undecided,
    /// MQTT 3.1 (level 3) or 3.1.1 (level 4).
    V4 { level: u8 },
    /// MQTT 5.
    V5,
}

impl AnyVersion {
    /// The protocol level the client asked for, once its CONNECT is read.
    pub fn level(&self) -> Option<u8> {
        match self {
            AnyVersion::Undecided => None,
            AnyVersion::V4 { level } => Some(*level),
            AnyVersion::V5 => Some(5),
        }
    }
}

/// The protocol level of the CONNECT at the start of `stream`: `Ok(None)`
/// when the stream starts with another packet (or a level no codec
/// speaks), `Err(InsufficientBytes)` while too little is buffered to say.
fn connect_level(stream: &[u8]) -> Result<Option<u8>, Error> {
    let need = |n: usize| Error::InsufficientBytes(n.saturating_sub(stream.len()).max(1));
    let Some(&byte1) = stream.first() else {
        return Err(need(1));
    };
    if byte1 >> 4 != 1 {
        return Ok(None);
    }
    // The remaining length: 1 to 4 bytes.
    let mut at = 1;
    loop {
        let Some(&b) = stream.get(at) else {
            return Err(need(at + 1));
        };
        at += 1;
        if b & 0x80 == 0 {
            break;
        }
        if at > 4 {
            return Ok(None);
        }
    }
    // The protocol name (length-prefixed), then the level.
    let (Some(&n0), Some(&n1)) = (stream.get(at), stream.get(at + 1)) else {
        return Err(need(at + 2));
    };
    let name_len = u16::from_be_bytes([n0, n1]) as usize;
    let level_at = at + 2 + name_len;
    let Some(&level) = stream.get(level_at) else {
        return Err(need(level_at + 1));
    };
    let name = &stream[at + 2..level_at];
    Ok(match (name, level) {
        (b"MQIsdp", 3) | (b"MQTT", 4) | (b"MQTT", 5) => Some(level),
        _ => None,
    })
}

impl Protocol for AnyVersion {
    fn read_mut(&mut self, stream: &mut BytesMut, max_size: usize) -> Result<Packet, Error> {
        if *self == AnyVersion::Undecided {
            *self = match connect_level(stream)? {
                Some(5) => AnyVersion::V5,
                Some(level) => AnyVersion::V4 { level },
                // V4 reads it and says what is wrong with it.
                None => return V4.read_mut(stream, max_size),
            };
        }
        match self {
            AnyVersion::V5 => V5.read_mut(stream, max_size),
            _ => V4.read_mut(stream, max_size),
        }
    }

    fn write(&self, mut packet: Packet, write: &mut BytesMut) -> Result<usize, Error> {
        // ferry: in MQTT 3.1 and 3.1.1 only a client sends DISCONNECT; a
        // server closes the connection, so its DISCONNECT (a reason the
        // router gives, such as a takeover) is not written.
        if *self != AnyVersion::V5 && matches!(packet, Packet::Disconnect(..)) {
            return Ok(0);
        }
        match self {
            AnyVersion::V5 => V5.write(packet, write),
            AnyVersion::V4 { level: 3 } => {
                // MQTT 3.1's CONNACK has no session present flag (the
                // byte is reserved, 0), whatever the session is.
                if let Packet::ConnAck(ack, _) = &mut packet {
                    ack.session_present = false;
                }
                V4.write(packet, write)
            }
            _ => V4.write(packet, write),
        }
    }

    fn properties_follow_packet_id(&self) -> bool {
        *self == AnyVersion::V5
    }

    fn level(&self) -> u8 {
        AnyVersion::level(self).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect(name: &str, level: u8) -> Vec<u8> {
        let mut v = vec![0x10, 0];
        v.extend_from_slice(&(name.len() as u16).to_be_bytes());
        v.extend_from_slice(name.as_bytes());
        v.push(level);
        v
    }

    #[test]
    fn the_connects_level_chooses_the_codec() {
        assert_eq!(connect_level(&connect("MQIsdp", 3)).unwrap(), Some(3));
        assert_eq!(connect_level(&connect("MQTT", 4)).unwrap(), Some(4));
        assert_eq!(connect_level(&connect("MQTT", 5)).unwrap(), Some(5));
        assert_eq!(connect_level(&connect("MQTT", 6)).unwrap(), None);
        assert_eq!(connect_level(&connect("MQTT", 3)).unwrap(), None);
        assert_eq!(connect_level(&[0x30, 0]).unwrap(), None);
    }

    #[test]
    fn a_disconnect_with_a_reason_is_read_back_whole() {
        use crate::protocol::{Disconnect, DisconnectReasonCode};
        let mut out = BytesMut::new();
        let reason = DisconnectReasonCode::TopicAliasInvalid;
        let packet = Packet::Disconnect(
            Disconnect {
                reason_code: reason,
            },
            None,
        );
        AnyVersion::V5.write(packet, &mut out).unwrap();
        assert_eq!(&out[..], &[0xe0, 0x02, 0x94, 0x00]);
        let mut normal = BytesMut::new();
        let packet = Packet::Disconnect(
            Disconnect {
                reason_code: DisconnectReasonCode::NormalDisconnection,
            },
            None,
        );
        AnyVersion::V5.write(packet, &mut normal).unwrap();
        assert_eq!(&normal[..], &[0xe0, 0x00]);
    }

    #[test]
    fn a_3_1_1_connection_is_written_no_disconnect() {
        use crate::protocol::{Disconnect, DisconnectReasonCode};
        for v4 in [AnyVersion::V4 { level: 3 }, AnyVersion::V4 { level: 4 }] {
            let mut out = BytesMut::new();
            let packet = Packet::Disconnect(
                Disconnect {
                    reason_code: DisconnectReasonCode::SessionTakenOver,
                },
                None,
            );
            v4.write(packet, &mut out).unwrap();
            assert!(out.is_empty(), "{v4:?}");
        }
        let mut out = BytesMut::new();
        let packet = Packet::Disconnect(
            Disconnect {
                reason_code: DisconnectReasonCode::SessionTakenOver,
            },
            None,
        );
        AnyVersion::V5.write(packet, &mut out).unwrap();
        assert_eq!(&out[..], &[0xe0, 0x02, 0x8e, 0x00]);
    }

    #[test]
    fn a_connect_cut_short_asks_for_more_bytes() {
        let full = connect("MQTT", 5);
        for cut in 0..full.len() {
            assert!(
                matches!(connect_level(&full[..cut]), Err(Error::InsufficientBytes(n)) if n > 0),
                "{cut}"
            );
        }
    }
}
