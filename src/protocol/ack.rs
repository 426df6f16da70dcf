//! Backend acks on `{north_prefix}/ack`: one object or an array of them,
//! `{"device", "msg_id", "status": "ok"}` or `{..., "status": "nack",
//! "reason", "retry"}` (`retry` defaults to `true`).

use serde::{Deserialize, Serialize};

use super::depth::{nested_deeper_than, MAX_DEPTH};
use crate::ids::{DeviceId, MsgId};

/// The backend's verdict on one uplink message: its `status` and what
/// goes with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Nack {
        /// Absent or `null`: "no reason given".
        #[serde(default = "no_reason", deserialize_with = "reason")]
        reason: String,
        /// `false`: dead-letter it now rather than resend. Absent or `null`: `true`.
        #[serde(default = "yes", deserialize_with = "retry")]
        retry: bool,
    },
}

/// One ack, as the backend writes it and the gateway reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendAck {
    pub device: DeviceId,
    pub msg_id: MsgId,
    #[serde(flatten)]
    pub verdict: Verdict,
}

impl BackendAck {
    pub fn ok(device: DeviceId, msg_id: MsgId) -> BackendAck {
        BackendAck {
            device,
            msg_id,
            verdict: Verdict::Ok,
        }
    }

    pub fn nack(
        device: DeviceId,
        msg_id: MsgId,
        reason: impl Into<String>,
        retry: bool,
    ) -> BackendAck {
        BackendAck {
            device,
            msg_id,
            verdict: Verdict::Nack {
                reason: reason.into(),
                retry,
            },
        }
    }
}

/// One ack message: a single ack as an object, more as an array.
pub fn encode_acks(acks: &[BackendAck]) -> Vec<u8> {
    match acks {
        [one] => serde_json::to_vec(one),
        many => serde_json::to_vec(many),
    }
    .expect("acks serialize")
}

fn no_reason() -> String {
    "no reason given".into()
}

fn yes() -> bool {
    true
}

fn reason<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_else(no_reason))
}

fn retry<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(true))
}

/// Parses one ack message. Each element stands alone: a bad element is an
/// `Err` naming what is wrong and does not spoil its neighbours.
pub fn parse_acks(bytes: &[u8]) -> Vec<Result<BackendAck, String>> {
    if nested_deeper_than(bytes, MAX_DEPTH) {
        return vec![Err(format!("nested deeper than {MAX_DEPTH}"))];
    }
    let value: serde_json::Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return vec![Err(format!("invalid JSON: {e}"))],
    };
    let items = match value {
        serde_json::Value::Array(items) => items,
        other => vec![other],
    };
    items.into_iter().map(one).collect()
}

fn one(value: serde_json::Value) -> Result<BackendAck, String> {
    BackendAck::deserialize(value).map_err(|e| format!("bad ack: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_and_array_acks_parse() {
        let one = parse_acks(br#"{"device":"d","msg_id":"m","status":"ok"}"#);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].as_ref().unwrap().verdict, Verdict::Ok);
        let many = parse_acks(
            br#"[{"device":"d","msg_id":"m1","status":"ok"},
                 {"device":"d","msg_id":"m2","status":"nack","reason":"unknown sensor","retry":false},
                 {"device":"d","msg_id":"m3","status":"nack"}]"#,
        );
        assert_eq!(
            many[1].as_ref().unwrap().verdict,
            Verdict::Nack {
                reason: "unknown sensor".into(),
                retry: false
            }
        );
        assert_eq!(
            many[2].as_ref().unwrap().verdict,
            Verdict::Nack {
                reason: "no reason given".into(),
                retry: true
            },
            "retry defaults to true"
        );
    }

    #[test]
    fn fields_an_ack_does_not_know_are_ignored() {
        let acks = parse_acks(
            br#"[{"device":"d","msg_id":"m1","status":"ok","note":"x"},
                 {"device":"d","msg_id":"m2","status":"nack","retry":false,"note":"x"},
                 {"device":"d","msg_id":"m3","status":"nack","reason":null,"retry":null}]"#,
        );
        assert_eq!(
            acks[2].as_ref().unwrap().verdict,
            Verdict::Nack {
                reason: "no reason given".into(),
                retry: true
            },
            "null is absent"
        );
        assert_eq!(acks[0].as_ref().unwrap().verdict, Verdict::Ok);
        assert_eq!(
            acks[1].as_ref().unwrap().verdict,
            Verdict::Nack {
                reason: "no reason given".into(),
                retry: false
            }
        );
    }

    #[test]
    fn a_bad_element_does_not_spoil_the_others() {
        let acks = parse_acks(br#"[{"device":"d","msg_id":"m1","status":"ok"},{"device":"d/x","msg_id":"m","status":"ok"},{"status":"ok"},{"device":"d","msg_id":"m","status":"maybe"}]"#);
        assert!(acks[0].is_ok());
        assert!(acks[1].as_ref().unwrap_err().contains("bad device"));
        assert!(acks[2].is_err());
        assert!(acks[3]
            .as_ref()
            .unwrap_err()
            .contains("unknown variant `maybe`"));
        assert!(parse_acks(b"nope")[0].is_err());
    }

    #[test]
    fn an_ack_message_nested_past_the_limit_is_one_error() {
        let deep = format!("[{}", "[".repeat(100_000));
        assert_eq!(
            parse_acks(deep.as_bytes()),
            vec![Err("nested deeper than 32".to_string())]
        );
    }

    #[test]
    fn the_protocol_examples_parse() {
        let ok: BackendAck =
            serde_json::from_str(r#"{"device": "press-7", "msg_id": "a-000017", "status": "ok"}"#)
                .unwrap();
        let id = |s: &str| MsgId::new(s).unwrap();
        let press = DeviceId::new("press-7").unwrap();
        assert_eq!(ok, BackendAck::ok(press.clone(), id("a-000017")));
        let nack: BackendAck = serde_json::from_str(
            r#"{"device": "press-7", "msg_id": "a-000017", "status": "nack", "reason": "...", "retry": false}"#,
        )
        .unwrap();
        assert_eq!(nack, BackendAck::nack(press, id("a-000017"), "...", false));
    }

    #[test]
    fn acks_written_are_acks_read() {
        let d = DeviceId::new("d").unwrap();
        let acks = vec![
            BackendAck::ok(d.clone(), MsgId::new("m1").unwrap()),
            BackendAck::nack(d, MsgId::new("m2").unwrap(), "busy", true),
        ];
        let read: Vec<_> = parse_acks(&encode_acks(&acks))
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(read, acks);
        assert_eq!(
            String::from_utf8(encode_acks(&acks[..1])).unwrap(),
            r#"{"device":"d","msg_id":"m1","status":"ok"}"#
        );
        assert_eq!(
            String::from_utf8(encode_acks(&acks[1..])).unwrap(),
            r#"{"device":"d","msg_id":"m2","status":"nack","reason":"busy","retry":true}"#
        );
    }
}
