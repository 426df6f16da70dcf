//! Backend acks on `{north_prefix}/ack`: one object or an array of them.

use serde::Deserialize;

use crate::ids::{DeviceId, MsgId};

/// The backend's verdict on one uplink message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Nack { reason: String, retry: bool },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendAck {
    pub device: DeviceId,
    pub msg_id: MsgId,
    pub verdict: Verdict,
}

#[derive(Deserialize)]
struct WireAck {
    device: String,
    msg_id: String,
    status: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    retry: Option<bool>,
}

/// Parses one ack message. Each element stands alone: a bad element is an
/// `Err` naming what is wrong and does not spoil its neighbours.
pub fn parse_acks(bytes: &[u8]) -> Vec<Result<BackendAck, String>> {
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
    let wire: WireAck = serde_json::from_value(value).map_err(|e| format!("bad ack: {e}"))?;
    let device = DeviceId::new(wire.device.as_str())
        .map_err(|e| format!("bad device {:?}: {e}", wire.device))?;
    let msg_id = MsgId::new(wire.msg_id.as_str())
        .map_err(|e| format!("bad msg_id {:?}: {e}", wire.msg_id))?;
    let verdict = match wire.status.as_str() {
        "ok" => Verdict::Ok,
        "nack" => Verdict::Nack {
            reason: wire.reason.unwrap_or_else(|| "no reason given".into()),
            retry: wire.retry.unwrap_or(true),
        },
        other => return Err(format!("unknown status {other:?}")),
    };
    Ok(BackendAck {
        device,
        msg_id,
        verdict,
    })
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
    fn a_bad_element_does_not_spoil_the_others() {
        let acks = parse_acks(br#"[{"device":"d","msg_id":"m1","status":"ok"},{"device":"d/x","msg_id":"m","status":"ok"},{"status":"ok"},{"device":"d","msg_id":"m","status":"maybe"}]"#);
        assert!(acks[0].is_ok());
        assert!(acks[1].as_ref().unwrap_err().contains("bad device"));
        assert!(acks[2].is_err());
        assert!(acks[3].as_ref().unwrap_err().contains("unknown status"));
        assert!(parse_acks(b"nope")[0].is_err());
    }
}
