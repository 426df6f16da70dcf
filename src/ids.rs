//! Identifiers, validated at construction.
//!
//! A `DeviceId` or `MsgId` that exists has passed the protocol's rules
//! (docs/PROTOCOL.md, "Identifiers"), so code past the edges never checks
//! them again and never builds a topic out of an unchecked string.

use std::fmt;
use std::sync::Arc;

/// Why an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("empty")]
    Empty,
    #[error("longer than {max} characters")]
    TooLong { max: usize },
    #[error("character {0:?} is not allowed")]
    BadChar(char),
}

fn check(s: &str, max: usize, extra: &[char]) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::Empty);
    }
    if s.len() > max {
        return Err(IdError::TooLong { max });
    }
    match s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') || extra.contains(c)))
    {
        Some(c) => Err(IdError::BadChar(c)),
        None => Ok(()),
    }
}

/// An id is held as `Arc<str>`: each message's device and msg_id are
/// cloned into several places along its way (the scheduler's queues, the
/// north tag, every receipt), and a clone is a count, not an allocation
/// and a copy (issue 20's profile).
macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr, $extra:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(s: impl Into<String>) -> Result<Self, IdError> {
                let s = s.into();
                check(&s, $max, $extra)?;
                Ok(Self(Arc::from(s)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        /// Checked like [`Self::new`]; the error names the id and what is wrong.
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s.as_str()).map_err(|e| {
                    serde::de::Error::custom(format_args!("bad {} {s:?}: {e}", $what))
                })
            }
        }
    };
}

string_id!(
    /// A gateway id: `[A-Za-z0-9._-]{1,64}`.
    GatewayId, "gateway id", 64, &[]
);
string_id!(
    /// A field device; its MQTT client id: `[A-Za-z0-9._-]{1,64}`.
    DeviceId, "device id", 64, &[]
);
string_id!(
    /// A sender-chosen message id, the idempotency key: `[A-Za-z0-9._:-]{1,128}`.
    MsgId, "msg_id", 128, &[':']
);

/// A gateway-assigned sequence number, strictly increasing per device and
/// direction, starting at 1. On the wire, a plain number.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Seq(pub u64);

impl Seq {
    pub fn next(self) -> Seq {
        Seq(self.0 + 1)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids_follow_the_protocol_rules() {
        assert!(DeviceId::new("press-7.line_3").is_ok());
        assert_eq!(DeviceId::new(""), Err(IdError::Empty));
        assert_eq!(DeviceId::new("a/b"), Err(IdError::BadChar('/')));
        assert_eq!(DeviceId::new("a:b"), Err(IdError::BadChar(':')));
        assert_eq!(
            DeviceId::new("x".repeat(65)),
            Err(IdError::TooLong { max: 64 })
        );
        assert!(DeviceId::new("x".repeat(64)).is_ok());
    }

    #[test]
    fn msg_ids_allow_colons_and_128_characters() {
        assert!(MsgId::new("boot-9:000017").is_ok());
        assert!(MsgId::new("m".repeat(128)).is_ok());
        assert_eq!(
            MsgId::new("m".repeat(129)),
            Err(IdError::TooLong { max: 128 })
        );
        assert_eq!(MsgId::new("a b"), Err(IdError::BadChar(' ')));
        assert_eq!(MsgId::new("+"), Err(IdError::BadChar('+')));
    }

    #[test]
    fn ids_are_json_strings_checked_on_the_way_in() {
        let id: MsgId = serde_json::from_str(r#""boot-9:17""#).unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""boot-9:17""#);
        let err = serde_json::from_str::<DeviceId>(r#""a/b""#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(r#"bad device id "a/b": character '/'"#),
            "{err}"
        );
        assert_eq!(serde_json::to_string(&Seq(17)).unwrap(), "17");
        assert_eq!(serde_json::from_str::<Seq>("17").unwrap(), Seq(17));
    }
}
