//! The uplink envelope (docs/PROTOCOL.md, "Payload envelope").
//!
//! [`parse_uplink`] is the only place device bytes are judged. It accepts a
//! message or says exactly why not ([`Rejection`]); it never panics on any
//! input. Unknown fields are kept and passed north untouched; fields the
//! gateway sets are overwritten by [`north_body`].

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::ids::{DeviceId, MsgId, Seq};

/// The longest `ttl_s` accepted: ten years. Longer is refused, so every
/// expiry time fits the store's millisecond clock with room to spare.
pub const MAX_TTL_S: u64 = 10 * 366 * 86_400;

/// Fields the gateway sets on the north body; a device's value is replaced.
const GATEWAY_FIELDS: [&str; 5] = ["gateway", "device", "seq", "stream", "stored_ts"];

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
    /// Every field of the envelope, as sent.
    pub fields: Map<String, Value>,
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
    TooLarge,
    BadTopic,
}

impl RejectCode {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectCode::Malformed => "malformed",
            RejectCode::TooLarge => "too_large",
            RejectCode::BadTopic => "bad_topic",
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
    })
}

/// The top-level `msg_id` of a JSON object that may be cut short (an
/// oversized message of which only the head was kept), if it comes before
/// the cut and is a valid id. Reads at most `head`; never panics.
pub fn sniff_msg_id(head: &[u8]) -> Option<MsgId> {
    let mut s = Scanner { b: head, i: 0 };
    s.ws();
    s.eat(b'{')?;
    loop {
        s.ws();
        let key = s.string()?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        if key == b"msg_id" {
            let value = s.string()?;
            return std::str::from_utf8(value)
                .ok()
                .and_then(|v| MsgId::new(v).ok());
        }
        s.skip_value()?;
        s.ws();
        s.eat(b',')?;
    }
}

/// A forward-only reader over possibly truncated JSON; `None` means "cut
/// short or not JSON".
struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn ws(&mut self) {
        while self.b.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    /// A string's raw bytes between the quotes (escapes left as they are).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match *self.b.get(self.i)? {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    return Some(&self.b[start..self.i - 1]);
                }
                _ => self.i += 1,
            }
        }
    }

    /// Skips one value of any kind, nested ones included.
    fn skip_value(&mut self) -> Option<()> {
        let mut depth = 0usize;
        loop {
            match *self.b.get(self.i)? {
                b'"' => {
                    self.string()?;
                }
                b'{' | b'[' => {
                    depth += 1;
                    self.i += 1;
                }
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    self.i += 1;
                }
                b',' if depth == 0 => return Some(()),
                _ => self.i += 1,
            }
            if depth == 0 && matches!(self.b.get(self.i), Some(b',' | b'}')) {
                return Some(());
            }
        }
    }
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

/// Where a message stands for the north body (all but its `seq`).
pub struct Stamp<'a> {
    pub gateway: &'a str,
    pub device: &'a DeviceId,
    pub stream: &'a str,
    pub stored_ms: i64,
}

/// The body sent north without its `seq`: the envelope's fields with the
/// gateway's own set. Built before the store, so the writer thread only
/// splices the seq in ([`with_seq`]).
pub fn north_body(fields: &Map<String, Value>, stamp: &Stamp<'_>) -> Vec<u8> {
    let mut body = fields.clone();
    for f in GATEWAY_FIELDS {
        body.remove(f);
    }
    body.insert("gateway".into(), stamp.gateway.into());
    body.insert("device".into(), stamp.device.as_str().into());
    body.insert("stream".into(), stamp.stream.into());
    body.insert("stored_ts".into(), stamp.stored_ms.into());
    if !matches!(body.get("ts"), Some(Value::Number(_))) {
        body.insert("ts".into(), stamp.stored_ms.into());
    }
    serde_json::to_vec(&body).expect("a JSON map serializes")
}

/// `{"seq":N,` followed by `body` without its opening brace. `body` is a
/// non-empty JSON object from [`north_body`] (it always has `gateway`).
pub fn with_seq(body: &[u8], seq: Seq) -> Vec<u8> {
    debug_assert!(body.len() > 2 && body[0] == b'{');
    let mut out = Vec::with_capacity(body.len() + 24);
    out.extend_from_slice(b"{\"seq\":");
    out.extend_from_slice(seq.0.to_string().as_bytes());
    out.push(b',');
    out.extend_from_slice(&body[1..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Envelope, Rejection> {
        parse_uplink(s.as_bytes(), 1024)
    }

    fn reason(s: &str) -> String {
        parse(s).unwrap_err().reason()
    }

    #[test]
    fn a_full_envelope_is_accepted() {
        let e =
            parse(r#"{"msg_id":"a-1","ts":5,"payload":{"t":1},"ttl_s":60,"retry":false,"x":1}"#)
                .unwrap();
        assert_eq!(e.msg_id.as_str(), "a-1");
        assert_eq!(e.ts, Some(5));
        assert_eq!(e.ttl, Some(Duration::from_secs(60)));
        assert!(!e.retry);
        assert_eq!(e.fields["x"], 1);
    }

    #[test]
    fn defaults_are_retry_and_no_ttl() {
        let e = parse(r#"{"msg_id":"a-1","payload_b64":"aGk="}"#).unwrap();
        assert!(e.retry);
        assert_eq!(e.ttl, None);
        assert_eq!(e.ts, None);
    }

    #[test]
    fn malformed_inputs_say_why() {
        assert!(reason("not json").starts_with("malformed: invalid JSON"));
        assert_eq!(reason("[1,2]"), "malformed: expected JSON object");
        assert_eq!(reason(r#"{"payload":1}"#), "malformed: missing msg_id");
        assert!(reason(r#"{"msg_id":"a b","payload":1}"#).starts_with("malformed: invalid msg_id"));
        assert!(reason(r#"{"msg_id":7,"payload":1}"#).starts_with("malformed: invalid msg_id"));
        assert!(reason(r#"{"msg_id":"a"}"#).contains("missing payload"));
        assert!(reason(r#"{"msg_id":"a","payload":1,"payload_b64":"aGk="}"#).contains("both"));
        assert!(reason(r#"{"msg_id":"a","payload_b64":"!!"}"#).contains("not base64"));
        assert!(reason(r#"{"msg_id":"a","payload":1,"ttl_s":0}"#).contains("ttl_s"));
        assert!(reason(r#"{"msg_id":"a","payload":1,"retry":"no"}"#).contains("retry"));
        assert!(reason(r#"{"msg_id":"a","payload":1,"ts":"now"}"#).contains("ts"));
    }

    #[test]
    fn rejections_after_the_id_carry_it() {
        let r = parse(r#"{"msg_id":"a-9","payload":1,"ttl_s":-1}"#).unwrap_err();
        assert_eq!(r.msg_id.unwrap().as_str(), "a-9");
        assert_eq!(parse("{}").unwrap_err().msg_id, None);
    }

    #[test]
    fn oversize_is_rejected_before_parsing_but_keeps_a_readable_id() {
        let big = format!(r#"{{"msg_id":"big-1","payload":"{}"}}"#, "x".repeat(2000));
        let r = parse_uplink(big.as_bytes(), 1024).unwrap_err();
        assert_eq!(r.code, RejectCode::TooLarge);
        assert_eq!(r.msg_id.as_ref().unwrap().as_str(), "big-1");
        assert!(r.reason().starts_with("too_large: "));
        assert!(parse_uplink(&vec![b' '; 1025], 1024)
            .unwrap_err()
            .msg_id
            .is_none());
    }

    #[test]
    fn ttl_is_bounded_and_names_its_limit() {
        for ttl in [
            "0",
            "-1",
            "18446744073709551615",
            "9223372036854775807",
            "1.5",
        ] {
            let r = parse(&format!(r#"{{"msg_id":"t-1","payload":1,"ttl_s":{ttl}}}"#)).unwrap_err();
            assert!(
                r.reason().contains("ttl_s must be an integer from 1 to"),
                "{ttl}: {}",
                r.reason()
            );
            assert_eq!(r.msg_id.unwrap().as_str(), "t-1");
        }
        let e = parse(&format!(
            r#"{{"msg_id":"t-1","payload":1,"ttl_s":{MAX_TTL_S}}}"#
        ))
        .unwrap();
        assert_eq!(e.ttl, Some(Duration::from_secs(MAX_TTL_S)));
    }

    #[test]
    fn a_msg_id_is_sniffed_from_a_cut_head_at_the_top_level_only() {
        let id = |s: &str| sniff_msg_id(s.as_bytes()).map(|m| m.as_str().to_string());
        assert_eq!(
            id(r#"{"msg_id":"a-1","payload":"xxxx"#).as_deref(),
            Some("a-1")
        );
        assert_eq!(
            id(r#" { "ts" : 5, "payload": {"msg_id":"inner","x":[1,{"y":"}"}]}, "msg_id" : "outer", "p"#)
                .as_deref(),
            Some("outer")
        );
        assert_eq!(id(r#"{"payload":"xxxxxxxxxxxx"#), None, "cut before the id");
        assert_eq!(id(r#"{"msg_id":"a b"}"#), None, "not a valid id");
        assert_eq!(id(r#"{"msg_id":"a-"#), None, "the id itself is cut");
        assert_eq!(id("[1,2]"), None);
        assert_eq!(id(""), None);
        assert_eq!(id(r#"{"a":"\"","msg_id":"q-1"}"#).as_deref(), Some("q-1"));
        for n in 0..40 {
            sniff_msg_id(&br#"{"a":[{"b":"\\"}],"msg_id":"z"}"#[..n.min(30)]);
        }
    }

    #[test]
    fn downlink_entries_drop_to_and_gain_ts() {
        let d = parse_downlink(
            br#"{"msg_id":"n-9","to":["a","@line3"],"payload":"shift B","seq":5}"#,
            1024,
            42,
        )
        .unwrap();
        assert_eq!(d.to, vec!["a".to_string(), "@line3".to_string()]);
        let entry: Value = serde_json::from_slice(&d.entry).unwrap();
        assert_eq!(
            entry,
            serde_json::json!({"msg_id": "n-9", "payload": "shift B", "ts": 42})
        );
        let r = parse_downlink(br#"{"msg_id":"n-9","to":"a","payload":1}"#, 1024, 0).unwrap_err();
        assert!(r.reason().contains("to must be"));
        assert!(parse_downlink(br#"{"payload":1}"#, 1024, 0)
            .unwrap_err()
            .reason()
            .contains("missing msg_id"));
    }

    #[test]
    fn north_body_overrides_gateway_fields_and_keeps_the_rest() {
        let e = parse(
            r#"{"msg_id":"a-1","payload":{"t":1},"seq":999,"device":"spoof","extra":"kept"}"#,
        )
        .unwrap();
        let device = DeviceId::new("press-7").unwrap();
        let stamp = Stamp {
            gateway: "g1",
            device: &device,
            stream: "alarm",
            stored_ms: 77,
        };
        let body: Value =
            serde_json::from_slice(&with_seq(&north_body(&e.fields, &stamp), Seq(4))).unwrap();
        assert_eq!(body["seq"], 4);
        assert_eq!(body["device"], "press-7");
        assert_eq!(body["gateway"], "g1");
        assert_eq!(body["stream"], "alarm");
        assert_eq!(body["stored_ts"], 77);
        assert_eq!(body["ts"], 77, "ts defaults to the store time");
        assert_eq!(body["extra"], "kept");
        assert_eq!(body["payload"]["t"], 1);
        assert_eq!(body["msg_id"], "a-1");
    }
}
