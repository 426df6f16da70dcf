//! What ferry publishes north for an uplink, on
//! `{north}/up/{device}/{stream...}` (docs/PROTOCOL.md, North): the envelope's
//! fields with the gateway's own set, `seq` first, and `props` (the MQTT 5
//! publish's user properties) when there are any.
//!
//! [`NorthMessage`] is its shape, for the backend's side. The gateway builds
//! the bytes in two steps instead ([`north_body`] before the store,
//! [`with_seq`] in the writer), and a test holds the two to one another.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::envelope::{Envelope, WireEnvelope};
use super::user_props::UserProps;
use crate::ids::{DeviceId, GatewayId, Seq};

/// Fields the gateway sets on the north body; a device's value is replaced
/// (`props` is absent when the publish had no user properties).
const GATEWAY_FIELDS: [&str; 6] = ["gateway", "device", "seq", "stream", "stored_ts", "props"];

/// An uplink message as the backend receives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NorthMessage {
    pub seq: Seq,
    pub gateway: GatewayId,
    pub device: DeviceId,
    /// The uplink topic's stream levels (`line3/temp`).
    pub stream: String,
    /// When the gateway committed it, ms since the epoch.
    pub stored_ts: i64,
    /// The MQTT 5 publish's user properties; absent when it had none.
    #[serde(default, skip_serializing_if = "UserProps::is_empty")]
    pub props: UserProps,
    /// The device's envelope; its `ts` is the store time where it had none.
    #[serde(flatten)]
    pub envelope: WireEnvelope,
}

impl NorthMessage {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a north message serializes")
    }
}

/// Where a message stands for the north body (all but its `seq`).
pub struct Stamp<'a> {
    pub gateway: &'a str,
    pub device: &'a DeviceId,
    pub stream: &'a str,
    pub stored_ms: i64,
}

/// The body sent north without its `seq`: the envelope's fields with the
/// gateway's own set, and its user properties as `props` if it has any.
/// Built before the store, so the writer thread only splices the seq in
/// ([`with_seq`]).
pub fn north_body(envelope: &Envelope, stamp: &Stamp<'_>) -> Vec<u8> {
    // The device's fields are borrowed, not cloned: only the gateway's own
    // are new values. A map by key, as serde_json's `Map` is, so the bytes
    // are what serializing the merged `Map` gave.
    let mut body: BTreeMap<&str, Cow<'_, Value>> = envelope
        .fields
        .iter()
        .filter(|(k, _)| !GATEWAY_FIELDS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), Cow::Borrowed(v)))
        .collect();
    body.insert("gateway", Cow::Owned(stamp.gateway.into()));
    body.insert("device", Cow::Owned(stamp.device.as_str().into()));
    body.insert("stream", Cow::Owned(stamp.stream.into()));
    body.insert("stored_ts", Cow::Owned(stamp.stored_ms.into()));
    if !envelope.props.is_empty() {
        body.insert("props", Cow::Owned(envelope.props.to_value()));
    }
    if !matches!(body.get("ts").map(|v| v.as_ref()), Some(Value::Number(_))) {
        body.insert("ts", Cow::Owned(stamp.stored_ms.into()));
    }
    serde_json::to_vec(&body).expect("a JSON map serializes")
}

/// `{"seq":N,` followed by `body` without its opening brace. `body` is a
/// non-empty JSON object from [`north_body`] (it always has `gateway`).
pub fn with_seq(body: &[u8], seq: Seq) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 24);
    super::push_with_seq(&mut out, seq, body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::envelope::{parse_uplink, with_publish};

    fn parse(s: &str) -> crate::protocol::envelope::Envelope {
        parse_uplink(s.as_bytes(), 1024).unwrap()
    }

    #[test]
    fn north_body_overrides_gateway_fields_and_keeps_the_rest() {
        let e = parse(
            r#"{"msg_id":"a-1","payload":{"t":1},"seq":999,"device":"spoof","extra":"kept"}"#,
        );
        let device = DeviceId::new("press-7").unwrap();
        let stamp = Stamp {
            gateway: "g1",
            device: &device,
            stream: "alarm",
            stored_ms: 77,
        };
        let body: Value =
            serde_json::from_slice(&with_seq(&north_body(&e, &stamp), Seq(4))).unwrap();
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

    /// What `north_body` built before it borrowed the fields: the envelope's
    /// map cloned, the gateway's fields set, serialized.
    fn merged_map(envelope: &Envelope, stamp: &Stamp<'_>) -> Vec<u8> {
        let mut body = envelope.fields.clone();
        for f in GATEWAY_FIELDS {
            body.remove(f);
        }
        body.insert("gateway".into(), stamp.gateway.into());
        body.insert("device".into(), stamp.device.as_str().into());
        body.insert("stream".into(), stamp.stream.into());
        body.insert("stored_ts".into(), stamp.stored_ms.into());
        if !envelope.props.is_empty() {
            body.insert("props".into(), envelope.props.to_value());
        }
        if !matches!(body.get("ts"), Some(Value::Number(_))) {
            body.insert("ts".into(), stamp.stored_ms.into());
        }
        serde_json::to_vec(&body).unwrap()
    }

    #[test]
    fn the_borrowed_body_is_byte_for_byte_the_merged_map() {
        let device = DeviceId::new("press-7").unwrap();
        let stamp = Stamp {
            gateway: "g1",
            device: &device,
            stream: "line3/temp",
            stored_ms: 77,
        };
        for raw in [
            r#"{"msg_id":"a-1","payload":{"t":1}}"#,
            r#"{"msg_id":"a-2","payload":[1,"x",null],"zz":true,"aa":1.5}"#,
            r#"{"msg_id":"a-3","ts":5,"seq":9,"gateway":"x","device":"y","stream":"s","stored_ts":1,"props":{},"payload":"\u00e9\"q"}"#,
        ] {
            let e = parse(raw);
            assert_eq!(
                String::from_utf8(north_body(&e, &stamp)).unwrap(),
                String::from_utf8(merged_map(&e, &stamp)).unwrap(),
                "{raw}"
            );
        }
    }

    #[test]
    fn what_the_gateway_sends_north_is_a_north_message() {
        let e = parse(r#"{"msg_id":"a-1","ts":5,"payload":{"t":1},"ttl_s":60,"unit":"C"}"#);
        let device = DeviceId::new("press-7").unwrap();
        let stamp = Stamp {
            gateway: "edge-01",
            device: &device,
            stream: "line3/temp",
            stored_ms: 77,
        };
        let bytes = with_seq(&north_body(&e, &stamp), Seq(4));
        let m: NorthMessage = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(m.seq, Seq(4));
        assert_eq!(m.gateway.as_str(), "edge-01");
        assert_eq!(m.device, device);
        assert_eq!((m.stream.as_str(), m.stored_ts), ("line3/temp", 77));
        assert_eq!(m.envelope.msg_id.as_str(), "a-1");
        assert_eq!((m.envelope.ts, m.envelope.ttl_s), (Some(5), Some(60)));
        assert_eq!(m.envelope.extra.len(), 1, "{:?}", m.envelope.extra);
        assert_eq!(m.envelope.extra["unit"], "C");
        assert!(m.props.is_empty());
        let again: NorthMessage = serde_json::from_slice(&m.to_bytes()).unwrap();
        assert_eq!(again, m);
        assert_eq!(
            serde_json::from_slice::<Value>(&m.to_bytes()).unwrap(),
            serde_json::from_slice::<Value>(&bytes).unwrap()
        );
    }

    #[test]
    fn props_go_north_only_when_the_publish_had_user_properties() {
        let device = DeviceId::new("press-7").unwrap();
        let stamp = Stamp {
            gateway: "edge-01",
            device: &device,
            stream: "t",
            stored_ms: 77,
        };
        let raw = r#"{"msg_id":"a-1","payload":1,"props":"the device's own"}"#;
        let body = |pairs: Vec<(String, String)>| -> Value {
            let e = with_publish(parse(raw), pairs, None).unwrap();
            serde_json::from_slice(&with_seq(&north_body(&e, &stamp), Seq(1))).unwrap()
        };
        assert_eq!(
            body(vec![]).get("props"),
            None,
            "the gateway's field: absent"
        );
        let pairs = vec![
            ("b".into(), "2".into()),
            ("a".into(), "1".into()),
            ("b".into(), "3".into()),
        ];
        let bytes = serde_json::to_vec(&body(pairs)).unwrap();
        let m: NorthMessage = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            m.props.to_value(),
            serde_json::json!({"a": "1", "b": ["2", "3"]})
        );
        assert!(m.envelope.extra.is_empty(), "{:?}", m.envelope.extra);
        assert_eq!(
            serde_json::from_slice::<Value>(&m.to_bytes()).unwrap(),
            serde_json::from_slice::<Value>(&bytes).unwrap()
        );
    }

    #[test]
    fn the_protocol_example_with_props_parses() {
        let text = r#"{"seq": 17, "gateway": "edge-01", "device": "press-7", "stream": "line3/temp",
   "msg_id": "a-000017", "ts": 1764470000123, "stored_ts": 1764470000200,
   "payload": {"temp": 81.5}, "ttl_s": 120, "props": {"site": "b2", "tag": ["x", "y"]}}"#;
        let m: NorthMessage = serde_json::from_str(text).unwrap();
        assert_eq!(m.props.get_all("tag").collect::<Vec<_>>(), ["x", "y"]);
        assert_eq!(m.props.get_all("site").collect::<Vec<_>>(), ["b2"]);
        assert_eq!((m.seq, m.envelope.ttl_s), (Seq(17), Some(120)));
        assert!(m.envelope.extra.is_empty(), "{:?}", m.envelope.extra);
    }
}
