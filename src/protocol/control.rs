//! Device control messages: `confirm`, `pull`, `read`, `nack`, `status`
//! (docs/PROTOCOL.md, South), and the inbox batches the gateway sends.

use bytes::Bytes;
use serde::Deserialize;

use crate::downlink::record::BatchEntry;
use crate::ids::Seq;
use crate::state::DeliveryState;

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

#[derive(Deserialize)]
struct Upto {
    upto: u64,
}

#[derive(Deserialize, Default)]
struct Pull {
    after: Option<u64>,
    limit: Option<usize>,
}

#[derive(Deserialize)]
struct Nack {
    seq: u64,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
struct Status {
    online: bool,
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
    let err = |e: serde_json::Error| format!("bad {kind:?} body: {e}");
    Ok(match kind {
        ControlKind::Confirm => Control::Confirm {
            upto: Seq(serde_json::from_slice::<Upto>(bytes).map_err(err)?.upto),
        },
        ControlKind::Read => Control::Read {
            upto: Seq(serde_json::from_slice::<Upto>(bytes).map_err(err)?.upto),
        },
        ControlKind::Pull => {
            // An empty body is a pull with defaults.
            let p = if bytes.iter().all(u8::is_ascii_whitespace) {
                Pull::default()
            } else {
                serde_json::from_slice::<Pull>(bytes).map_err(err)?
            };
            Control::Pull {
                after: p.after.map(Seq),
                limit: p.limit,
            }
        }
        ControlKind::Nack => {
            let n = serde_json::from_slice::<Nack>(bytes).map_err(err)?;
            Control::Nack {
                seq: Seq(n.seq),
                reason: n.reason.unwrap_or_else(|| "no reason given".into()),
            }
        }
        ControlKind::Status => Control::Status {
            online: serde_json::from_slice::<Status>(bytes).map_err(err)?.online,
        },
    })
}

/// An inbox batch: `{"messages": [...], "more": bool}`. Stored entries are
/// spliced, not re-parsed: `{"seq":N,` + the stored object minus its `{`.
pub fn inbox_batch(entries: &[BatchEntry], more: bool) -> Bytes {
    let mut out = Vec::with_capacity(
        32 + entries
            .iter()
            .map(|e| e.body.as_ref().map_or(64, |b| b.len() + 24))
            .sum::<usize>(),
    );
    out.extend_from_slice(b"{\"messages\":[");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match &e.body {
            Some(body) if body.len() > 2 && body[0] == b'{' => {
                out.extend_from_slice(format!("{{\"seq\":{},", e.seq.0).as_bytes());
                out.extend_from_slice(&body[1..]);
            }
            _ => {
                let status = match e.state {
                    DeliveryState::Dead => "failed",
                    _ => "expired",
                };
                let tomb = serde_json::json!({"seq": e.seq.0, "msg_id": e.msg_id.as_str(), "status": status});
                out.extend_from_slice(tomb.to_string().as_bytes());
            }
        }
    }
    out.extend_from_slice(format!("],\"more\":{more}}}").as_bytes());
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MsgId;

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
        assert!(parse_control(ControlKind::Confirm, b"{}").is_err());
        assert!(parse_control(ControlKind::Confirm, br#"{"upto":-1}"#).is_err());
    }

    #[test]
    fn batches_splice_entries_and_tombstones() {
        let entries = vec![
            BatchEntry {
                seq: Seq(41),
                msg_id: MsgId::new("n-9").unwrap(),
                state: DeliveryState::Stored,
                body: Some(Bytes::from_static(
                    br#"{"msg_id":"n-9","payload":"shift B"}"#,
                )),
            },
            BatchEntry {
                seq: Seq(44),
                msg_id: MsgId::new("n-12").unwrap(),
                state: DeliveryState::Expired,
                body: None,
            },
        ];
        let v: serde_json::Value = serde_json::from_slice(&inbox_batch(&entries, true)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"messages": [
                {"seq": 41, "msg_id": "n-9", "payload": "shift B"},
                {"seq": 44, "msg_id": "n-12", "status": "expired"}
            ], "more": true})
        );
        let empty: serde_json::Value = serde_json::from_slice(&inbox_batch(&[], false)).unwrap();
        assert_eq!(empty, serde_json::json!({"messages": [], "more": false}));
    }
}
