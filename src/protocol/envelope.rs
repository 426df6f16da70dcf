//! The payload envelope (docs/PROTOCOL.md, "Payload envelope"), both ways.
//!
//! Two views of the same JSON. [`WireEnvelope`] and [`WireDownlink`] are its
//! plain shape, what a device or backend writes and what a client reads.
//! [`parse_uplink`] and [`parse_downlink`] are the gateway's intake: the only
//! place device and backend bytes are judged, accepting a message or saying
//! exactly why not ([`Rejection`]), never panicking on any input;
//! [`with_publish`] adds what an MQTT 5 publish carried beside the
//! envelope (user properties, message expiry). Unknown
//! fields are kept and passed on untouched; fields the gateway sets are
//! overwritten by [`super::north::north_body`].

use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::depth::{nested_deeper_than, MAX_DEPTH};
use super::user_props::{is_internal, UserProps, INTERNAL_PREFIX};
use crate::ids::MsgId;

pub use super::sniff::sniff_msg_id;

/// An envelope as written: `{"msg_id", "ts", "payload" | "payload_b64",
/// "ttl_s", "retry", ...}`. Deserializing checks the shape and the id only;
/// the gateway's rules (base64 that decodes, `ttl_s` bounds) are
/// [`parse_uplink`]'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireEnvelope {
    pub msg_id: MsgId,
    /// Sender's clock, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ts: Option<i64>,
    #[serde(flatten)]
    pub payload: Payload,
    /// Expires this many seconds after it was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// `false`: never retried; a first failure dead-letters it. Absent is `true`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub retry: bool,
    /// Every other field, passed on untouched.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Exactly one of `payload` (any JSON) or `payload_b64` (bytes, base64).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Payload {
    #[serde(rename = "payload")]
    Json(Value),
    #[serde(rename = "payload_b64")]
    Base64(String),
}

impl Payload {
    /// Bytes, carried as `payload_b64`.
    pub fn bytes(bytes: &[u8]) -> Payload {
        Payload::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
    }
}

impl WireEnvelope {
    /// An envelope with just an id and a payload.
    pub fn new(msg_id: MsgId, payload: Payload) -> WireEnvelope {
        WireEnvelope {
            msg_id,
            ts: None,
            payload,
            ttl_s: None,
            retry: true,
            extra: Map::new(),
        }
    }

    /// `{"msg_id", "payload"}` with an application's JSON.
    pub fn json(msg_id: MsgId, payload: Value) -> WireEnvelope {
        WireEnvelope::new(msg_id, Payload::Json(payload))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope serializes")
    }
}

/// A downlink envelope from the backend: an envelope with `to` (device ids
/// and `@group` names) on `{north}/down`, or without it on `{north}/down/{device}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireDownlink {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<String>,
    #[serde(flatten)]
    pub envelope: WireEnvelope,
}

impl WireDownlink {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a downlink serializes")
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// The longest `ttl_s` accepted: ten years. Longer is refused, so every
/// expiry time fits the store's millisecond clock with room to spare.
pub const MAX_TTL_S: u64 = 10 * 366 * 86_400;

/// An accepted uplink envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub msg_id: MsgId,
    /// Sender's clock, ms since the epoch.
    pub ts: Option<i64>,
    /// Expires this long after it was stored.
    pub ttl: Option<Duration>,
    /// `retry: false`: dead-letter on the first failure.
    pub retry: bool,
    /// Every field of the envelope, as sent (with `ttl_s` from the
    /// message expiry, [`with_publish`]).
    pub fields: Map<String, Value>,
    /// The MQTT 5 publish's user properties ([`with_publish`]);
    /// none from [`parse_uplink`].
    pub props: UserProps,
}

/// Why a message was not accepted, with the receipt's reason code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: RejectCode,
    pub detail: String,
    /// The message's id where it could be read, so the device can match the receipt.
    pub msg_id: Option<MsgId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectCode {
    Malformed,
    /// JSON nested past [`MAX_DEPTH`]: `malformed` on the wire, a variant
    /// of its own so that intake can count it.
    NestedTooDeep,
    TooLarge,
    BadTopic,
    /// Published on a topic that is not the sender's own.
    Unauthorized,
    /// The sender is over its rate or has too many uplinks in flight.
    /// Retryable (as is `DiskBudget`): nothing was stored, and the device keeps
    /// the message and resends it later.
    Rate,
    /// The store is at `store.max_db_bytes`. Retryable like `Rate`:
    /// nothing was stored, and the device resends later.
    DiskBudget,
}

impl RejectCode {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectCode::Malformed | RejectCode::NestedTooDeep => "malformed",
            RejectCode::TooLarge => "too_large",
            RejectCode::BadTopic => "bad_topic",
            RejectCode::Unauthorized => "unauthorized",
            RejectCode::Rate => "rate",
            RejectCode::DiskBudget => "disk_budget",
        }
    }
}

impl Rejection {
    pub fn new(code: RejectCode, detail: impl Into<String>) -> Self {
        Rejection {
            code,
            detail: detail.into(),
            msg_id: None,
        }
    }

    /// `code: detail`, as written to receipts and the dead-letter table.
    pub fn reason(&self) -> String {
        format!("{}: {}", self.code.as_str(), self.detail)
    }
}

/// Judges one uplink message of `bytes`, at most `max_bytes` long.
pub fn parse_uplink(bytes: &[u8], max_bytes: usize) -> Result<Envelope, Rejection> {
    if bytes.len() > max_bytes {
        let mut r = Rejection::new(
            RejectCode::TooLarge,
            format!(
                "{} bytes > south.max_payload_bytes {}",
                bytes.len(),
                max_bytes
            ),
        );
        r.msg_id = sniff_msg_id(bytes);
        return Err(r);
    }
    if nested_deeper_than(bytes, MAX_DEPTH) {
        let mut r = Rejection::new(
            RejectCode::NestedTooDeep,
            format!("nested deeper than {MAX_DEPTH}"),
        );
        r.msg_id = sniff_msg_id(bytes);
        return Err(r);
    }
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| Rejection::new(RejectCode::Malformed, format!("invalid JSON: {e}")))?;
    let Value::Object(fields) = value else {
        return Err(Rejection::new(
            RejectCode::Malformed,
            "expected JSON object",
        ));
    };
    let msg_id = match fields.get("msg_id") {
        None | Some(Value::Null) => {
            return Err(Rejection::new(RejectCode::Malformed, "missing msg_id"))
        }
        Some(Value::String(s)) => MsgId::new(s.as_str())
            .map_err(|e| Rejection::new(RejectCode::Malformed, format!("invalid msg_id: {e}")))?,
        Some(_) => {
            return Err(Rejection::new(
                RejectCode::Malformed,
                "invalid msg_id: not a string",
            ))
        }
    };
    let with_id = |detail: String| Rejection {
        code: RejectCode::Malformed,
        detail,
        msg_id: Some(msg_id.clone()),
    };
    match (fields.get("payload"), fields.get("payload_b64")) {
        (Some(_), Some(_)) => return Err(with_id("both payload and payload_b64".into())),
        (None, None) => return Err(with_id("missing payload (or payload_b64)".into())),
        (None, Some(Value::String(b64))) => {
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| with_id(format!("payload_b64 is not base64: {e}")))?;
        }
        (None, Some(_)) => return Err(with_id("payload_b64 must be a string".into())),
        (Some(_), None) => {}
    }
    let ts = match fields.get("ts") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .ok_or_else(|| with_id("ts must be an integer (ms since the epoch)".into()))?,
        ),
    };
    let ttl = match fields.get("ttl_s") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(s) if (1..=MAX_TTL_S).contains(&s) => Some(Duration::from_secs(s)),
            _ => {
                return Err(with_id(format!(
                    "ttl_s must be an integer from 1 to {MAX_TTL_S} (ten years)"
                )))
            }
        },
    };
    let retry = match fields.get("retry") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(with_id("retry must be true or false".into())),
    };
    Ok(Envelope {
        msg_id,
        ts,
        ttl,
        retry,
        fields,
        props: UserProps::default(),
    })
}

/// `envelope` with what its MQTT 5 publish added: the device's user
/// properties (`pairs`, in order) and,
/// where the envelope has no `ttl_s`, its message expiry interval
/// (`expiry_s`) as `ttl_s`. Refused `too_large` past a bound of the
/// properties, `malformed` for an expiry that could not be a `ttl_s`.
pub fn with_publish(
    mut envelope: Envelope,
    pairs: Vec<(String, String)>,
    expiry_s: Option<u32>,
) -> Result<Envelope, Rejection> {
    let refuse = |code, detail| Rejection {
        code,
        detail,
        msg_id: Some(envelope.msg_id.clone()),
    };
    // The broker strips these from what devices send; should one come
    // through anyway, it is refused, neither passed on nor dropped unsaid.
    if let Some((key, _)) = pairs.iter().find(|(k, _)| is_internal(k)) {
        return Err(refuse(
            RejectCode::Malformed,
            format!(
                "user property \"{}\": names starting {INTERNAL_PREFIX} are the gateway's own",
                crate::clip::Clip(key)
            ),
        ));
    }
    let props = UserProps::new(pairs).map_err(|detail| refuse(RejectCode::TooLarge, detail))?;
    if let (None, Some(s)) = (envelope.ttl, expiry_s) {
        if !(1..=MAX_TTL_S).contains(&u64::from(s)) {
            return Err(refuse(
                RejectCode::Malformed,
                format!("message expiry interval {s} s: as ttl_s it must be from 1 to {MAX_TTL_S} (ten years)"),
            ));
        }
        envelope.ttl = Some(Duration::from_secs(s.into()));
        envelope.fields.insert("ttl_s".into(), s.into());
    }
    envelope.props = props;
    Ok(envelope)
}

/// A downlink envelope: the inbox entry to store, and who it is for.
#[derive(Debug, Clone, PartialEq)]
pub struct DownEnvelope {
    pub msg_id: MsgId,
    pub ttl: Option<Duration>,
    /// `to` as written: device ids and `@group` names; empty if absent.
    pub to: Vec<String>,
    /// The inbox entry without `seq`: every field but `to`, with `ts` set.
    pub entry: Vec<u8>,
}

/// Fields an inbox entry gets from the gateway.
const INBOX_FIELDS: [&str; 3] = ["seq", "status", "to"];

/// Judges one downlink envelope from the backend.
pub fn parse_downlink(
    bytes: &[u8],
    max_bytes: usize,
    stored_ms: i64,
) -> Result<DownEnvelope, Rejection> {
    let env = parse_uplink(bytes, max_bytes)?;
    let reject = |detail: &str| Rejection {
        code: RejectCode::Malformed,
        detail: detail.into(),
        msg_id: Some(env.msg_id.clone()),
    };
    let to = match env.fields.get("to") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| reject("to must be an array of device ids"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(reject("to must be an array of device ids")),
    };
    let mut fields = env.fields;
    for f in INBOX_FIELDS {
        fields.remove(f);
    }
    if env.ts.is_none() {
        fields.insert("ts".into(), stored_ms.into());
    }
    let entry = serde_json::to_vec(&fields).expect("a JSON map serializes");
    Ok(DownEnvelope {
        msg_id: env.msg_id,
        ttl: env.ttl,
        to,
        entry,
    })
}

#[cfg(test)]
mod tests;
