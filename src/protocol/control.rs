//! Device control messages: `confirm`, `pull`, `read`, `nack`, `status`
//! (docs/PROTOCOL.md, South), each a wire type a device writes and the
//! gateway reads ([`parse_control`] into one [`Control`]). [`Status`] is
//! also the gateway's own retained status north.

use serde::{Deserialize, Serialize};

use super::depth::{nested_deeper_than, MAX_DEPTH};
use crate::ids::Seq;

pub use super::inbox::inbox_batch;

/// A parsed control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Confirm {
        upto: Seq,
    },
    Read {
        upto: Seq,
    },
    Pull {
        after: Option<Seq>,
        limit: Option<usize>,
    },
    Nack {
        seq: Seq,
        reason: String,
    },
    Status {
        online: bool,
    },
}

/// `confirm {"upto": n}`: every inbox message with `seq ≤ n` is committed
/// on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirm {
    pub upto: Seq,
}

/// `read {"upto": n}`: the device's user has seen everything up to `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Read {
    pub upto: Seq,
}

/// `pull {"after", "limit"}`, both optional (an empty body is `{}`): send
/// the next batch after `after` (default: the stored cursor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pull {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Seq>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// `nack {"seq", "reason"}`: the device can never take message `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nack {
    pub seq: Seq,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `{"online": bool, "ts"}`: a device's on `{south}/{device}/status` (its
/// last will is `{"online": false}`, without `ts`), the gateway's retained
/// one on `{north}/status` (always with `ts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub online: bool,
    /// Sender's clock, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<i64>,
}

/// What the gateway reads of a device's [`Status`].
#[derive(Deserialize)]
struct Online {
    online: bool,
}

/// Any of the control messages, ready to publish.
pub fn to_bytes<T: Serialize>(message: &T) -> Vec<u8> {
    serde_json::to_vec(message).expect("a control message serializes")
}

/// Which control topic a message came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    Confirm,
    Read,
    Pull,
    Nack,
    Status,
}

pub fn parse_control(kind: ControlKind, bytes: &[u8]) -> Result<Control, String> {
    if nested_deeper_than(bytes, MAX_DEPTH) {
        return Err(format!("bad {kind:?} body: nested deeper than {MAX_DEPTH}"));
    }
    let err = |e: serde_json::Error| format!("bad {kind:?} body: {e}");
    Ok(match kind {
        ControlKind::Confirm => Control::Confirm {
            upto: serde_json::from_slice::<Confirm>(bytes).map_err(err)?.upto,
        },
        ControlKind::Read => Control::Read {
            upto: serde_json::from_slice::<Read>(bytes).map_err(err)?.upto,
        },
        ControlKind::Pull => {
            // An empty body is a pull with defaults.
            let p = if bytes.iter().all(u8::is_ascii_whitespace) {
                Pull::default()
            } else {
                serde_json::from_slice::<Pull>(bytes).map_err(err)?
            };
            Control::Pull {
                after: p.after,
                limit: p.limit,
            }
        }
        ControlKind::Nack => {
            let n = serde_json::from_slice::<Nack>(bytes).map_err(err)?;
            Control::Nack {
                seq: n.seq,
                reason: n.reason.unwrap_or_else(|| "no reason given".into()),
            }
        }
        // Only `online` counts from a device: its clock is not the gateway's concern.
        ControlKind::Status => Control::Status {
            online: serde_json::from_slice::<Online>(bytes).map_err(err)?.online,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_nested_past_the_limit_is_refused_unparsed() {
        let deep = format!(r#"{{"upto":1,"x":{}}}"#, "[".repeat(100_000));
        for kind in [ControlKind::Confirm, ControlKind::Pull, ControlKind::Status] {
            let e = parse_control(kind, deep.as_bytes()).unwrap_err();
            assert!(e.ends_with("nested deeper than 32"), "{e}");
        }
    }

    #[test]
    fn control_bodies_parse() {
        assert_eq!(
            parse_control(ControlKind::Confirm, br#"{"upto":57}"#),
            Ok(Control::Confirm { upto: Seq(57) })
        );
        assert_eq!(
            parse_control(ControlKind::Pull, b""),
            Ok(Control::Pull {
                after: None,
                limit: None
            })
        );
        assert_eq!(
            parse_control(ControlKind::Pull, br#"{"after":40,"limit":200}"#),
            Ok(Control::Pull {
                after: Some(Seq(40)),
                limit: Some(200)
            })
        );
        assert_eq!(
            parse_control(
                ControlKind::Nack,
                br#"{"seq":58,"reason":"no such screen"}"#
            ),
            Ok(Control::Nack {
                seq: Seq(58),
                reason: "no such screen".into()
            })
        );
        assert_eq!(
            parse_control(ControlKind::Status, br#"{"online":false}"#),
            Ok(Control::Status { online: false })
        );
        assert_eq!(
            parse_control(ControlKind::Status, br#"{"online":true,"ts":"now"}"#),
            Ok(Control::Status { online: true }),
            "a device's clock is not judged"
        );
        assert!(parse_control(ControlKind::Confirm, b"{}").is_err());
        assert!(parse_control(ControlKind::Confirm, br#"{"upto":-1}"#).is_err());
    }

    #[test]
    fn a_seq_that_is_not_a_whole_number_from_0_to_2_pow_64_is_refused() {
        for body in [
            r#"{"after":-1}"#,
            r#"{"after":1.5}"#,
            r#"{"after":"5"}"#,
            r#"{"after":18446744073709551616}"#,
        ] {
            assert!(
                parse_control(ControlKind::Pull, body.as_bytes()).is_err(),
                "{body}"
            );
        }
        assert_eq!(
            parse_control(ControlKind::Pull, br#"{"after":18446744073709551615}"#),
            Ok(Control::Pull {
                after: Some(Seq(u64::MAX)),
                limit: None
            }),
            "the largest u64 is a seq on the wire; the store saturates it"
        );
        assert!(parse_control(ControlKind::Confirm, br#"{"upto":1e3}"#).is_err());
        assert!(parse_control(ControlKind::Nack, br#"{"seq":-3}"#).is_err());
    }

    #[test]
    fn the_protocol_examples_parse() {
        assert_eq!(
            serde_json::from_str::<Confirm>(r#"{"upto": 57}"#).unwrap(),
            Confirm { upto: Seq(57) }
        );
        assert_eq!(
            serde_json::from_str::<Pull>(r#"{"after": 40, "limit": 200}"#).unwrap(),
            Pull {
                after: Some(Seq(40)),
                limit: Some(200)
            }
        );
        assert_eq!(
            serde_json::from_str::<Read>(r#"{"upto": 52}"#).unwrap(),
            Read { upto: Seq(52) }
        );
        assert_eq!(
            serde_json::from_str::<Nack>(r#"{"seq": 58, "reason": "..."}"#).unwrap(),
            Nack {
                seq: Seq(58),
                reason: Some("...".into())
            }
        );
        assert_eq!(
            serde_json::from_str::<Status>(r#"{"online": true}"#).unwrap(),
            Status {
                online: true,
                ts: None
            }
        );
    }

    #[test]
    fn what_a_device_writes_the_gateway_reads() {
        let read = |kind, bytes: Vec<u8>| parse_control(kind, &bytes).unwrap();
        assert_eq!(
            read(ControlKind::Confirm, to_bytes(&Confirm { upto: Seq(9) })),
            Control::Confirm { upto: Seq(9) }
        );
        assert_eq!(
            read(ControlKind::Read, to_bytes(&Read { upto: Seq(8) })),
            Control::Read { upto: Seq(8) }
        );
        assert_eq!(to_bytes(&Pull::default()), b"{}");
        assert_eq!(
            read(ControlKind::Pull, to_bytes(&Pull::default())),
            Control::Pull {
                after: None,
                limit: None
            }
        );
        let nack = Nack {
            seq: Seq(3),
            reason: Some("no such screen".into()),
        };
        assert_eq!(
            read(ControlKind::Nack, to_bytes(&nack)),
            Control::Nack {
                seq: Seq(3),
                reason: "no such screen".into()
            }
        );
        let offline = Status {
            online: false,
            ts: Some(5),
        };
        assert_eq!(
            serde_json::from_slice::<Status>(&to_bytes(&offline)).unwrap(),
            offline
        );
        assert_eq!(
            read(ControlKind::Status, to_bytes(&offline)),
            Control::Status { online: false }
        );
    }
}
