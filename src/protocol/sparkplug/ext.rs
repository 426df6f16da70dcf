//! Proto2 extension fields, kept as they came.
//!
//! `sparkplug_b.proto` reserves extension ranges (`extensions 6 to max`
//! and the like) for third parties, and its `*ValueExtension` messages are
//! nothing but such a range. prost's derived messages skip every field
//! they do not declare, so a payload re-encoded through them would lose
//! whatever a third party put there. [`Extensions`] keeps those fields as
//! their wire bytes, and [`Extensible`] adds it to a derived message for
//! the tags from its range on, so decode then encode loses nothing.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};
use std::ops::{Deref, DerefMut};

/// Extension fields of one message, each as its key and value were on the
/// wire (a varint re-encoded in its shortest form), in the order they came.
/// As a message of its own it keeps every field it is given: that is
/// what a `*ValueExtension` message (`extensions 1 to max`) is.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Extensions {
    raw: Vec<u8>,
}

impl Extensions {
    /// The fields' wire bytes, ready to append to their message's.
    pub fn as_bytes(&self) -> &[u8] {
        &self.raw
    }

    /// Whether there are no extension fields.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }
}

impl std::fmt::Debug for Extensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Extensions({} bytes)", self.raw.len())
    }
}

impl Message for Extensions {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.raw);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Each arm reads the whole value with prost's own checks (lengths,
        // groups' end tags, the recursion limit) before writing anything.
        let out = &mut self.raw;
        match wire_type {
            WireType::Varint => {
                let value = encoding::decode_varint(buf)?;
                encoding::encode_key(tag, wire_type, out);
                encoding::encode_varint(value, out);
            }
            WireType::ThirtyTwoBit => {
                let mut value = 0u32;
                encoding::fixed32::merge(wire_type, &mut value, buf, ctx)?;
                encoding::fixed32::encode(tag, &value, out);
            }
            WireType::SixtyFourBit => {
                let mut value = 0u64;
                encoding::fixed64::merge(wire_type, &mut value, buf, ctx)?;
                encoding::fixed64::encode(tag, &value, out);
            }
            WireType::LengthDelimited => {
                let mut value = Vec::new();
                encoding::bytes::merge(wire_type, &mut value, buf, ctx)?;
                encoding::bytes::encode(tag, &value, out);
            }
            WireType::StartGroup => {
                let mut inner = Extensions::default();
                encoding::group::merge(tag, wire_type, &mut inner, buf, ctx)?;
                encoding::group::encode(tag, &inner, out);
            }
            // A group's end with no start: prost's own error.
            WireType::EndGroup => encoding::skip_field(wire_type, tag, buf, ctx)?,
        }
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.raw.len()
    }

    fn clear(&mut self) {
        self.raw.clear();
    }
}

/// A derived message `T` whose tags from `FIRST` on are its proto2
/// extension range, kept in `extensions`. It reads and writes as `T` does
/// otherwise, and derefs to `T`, so `payload.metrics` works as on `T`.
#[derive(Clone, Default, PartialEq, Debug)]
pub struct Extensible<T, const FIRST: u32> {
    /// The fields the .proto declares.
    pub fields: T,
    /// Whatever arrived in the extension range.
    pub extensions: Extensions,
}

impl<T, const FIRST: u32> Extensible<T, FIRST> {
    /// The message with these fields and no extensions.
    pub fn new(fields: T) -> Self {
        Extensible {
            fields,
            extensions: Extensions::default(),
        }
    }
}

impl<T, const FIRST: u32> From<T> for Extensible<T, FIRST> {
    fn from(fields: T) -> Self {
        Extensible::new(fields)
    }
}

impl<T, const FIRST: u32> Deref for Extensible<T, FIRST> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.fields
    }
}

impl<T, const FIRST: u32> DerefMut for Extensible<T, FIRST> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.fields
    }
}

impl<T: Message, const FIRST: u32> Message for Extensible<T, FIRST> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.fields.encode_raw(buf);
        self.extensions.encode_raw(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag >= FIRST {
            self.extensions.merge_field(tag, wire_type, buf, ctx)
        } else {
            self.fields.merge_field(tag, wire_type, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        self.fields.encoded_len() + self.extensions.encoded_len()
    }

    fn clear(&mut self) {
        self.fields.clear();
        self.extensions.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One field of each wire type, and a group holding two more.
    const EVERY_WIRE_TYPE: &[u8] = &[
        0x08, 0x96, 0x01, // tag 1, varint: 150
        0x15, 1, 2, 3, 4, // tag 2, fixed32
        0x19, 1, 2, 3, 4, 5, 6, 7, 8, // tag 3, fixed64
        0x22, 0x02, b'h', b'i', // tag 4, length-delimited: "hi"
        0x2b, // tag 5, start group
        0x08, 0x01, // tag 1 inside, varint 1
        0x12, 0x00, // tag 2 inside, empty bytes
        0x2c, // tag 5, end group
    ];

    #[test]
    fn extensions_keep_every_wire_type_byte_for_byte() {
        let ext = Extensions::decode(EVERY_WIRE_TYPE).unwrap();
        assert_eq!(ext.as_bytes(), EVERY_WIRE_TYPE);
        assert_eq!(ext.encode_to_vec(), EVERY_WIRE_TYPE);
    }

    #[test]
    fn extensions_refuse_what_prost_refuses() {
        // Truncated fixed64, a length past the end, an unmatched end group,
        // a group closed by another tag.
        for bad in [
            &[0x19, 1, 2][..],
            &[0x22, 0x05, b'h'],
            &[0x2c],
            &[0x2b, 0x08, 0x01, 0x34],
        ] {
            assert!(Extensions::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn extensible_splits_declared_fields_from_the_range() {
        #[derive(Clone, PartialEq, prost::Message)]
        struct Two {
            #[prost(uint64, optional, tag = "1")]
            a: Option<u64>,
            #[prost(string, optional, tag = "2")]
            b: Option<String>,
        }
        // tag 3 (extension), tag 1, tag 7 (extension), tag 2
        let wire = [0x18, 0x05, 0x08, 0x01, 0x3a, 0x01, b'x', 0x12, 0x01, b'y'];
        let msg = Extensible::<Two, 3>::decode(&wire[..]).unwrap();
        assert_eq!(msg.a, Some(1));
        assert_eq!(msg.b.as_deref(), Some("y"));
        assert_eq!(msg.extensions.as_bytes(), [0x18, 0x05, 0x3a, 0x01, b'x']);
        // Declared fields first, then the extensions as they came.
        let again = msg.encode_to_vec();
        assert_eq!(
            again,
            [0x08, 0x01, 0x12, 0x01, b'y', 0x18, 0x05, 0x3a, 0x01, b'x']
        );
        assert_eq!(Extensible::<Two, 3>::decode(&again[..]).unwrap(), msg);
        assert_eq!(msg.encoded_len(), again.len());
    }
}
