//! Property tests for every parser of the protocol, and round trips for
//! every wire type (issue 8, fuzzing on stable Rust with proptest).
//!
//! - No parser panics, on raw bytes or on JSON of any shape: each input
//!   gets an answer (a value or a reason), never a crash.
//! - What one side writes, the other reads back equal.
//!
//! CI runs proptest's default 256 cases per property. The long run sets
//! `PROPTEST_CASES` (scripts/fuzz.sh runs 1,000,000 per property; its
//! figures are in docs/SECURITY.md).

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::ack::{encode_acks, parse_acks, BackendAck};
use super::control::{parse_control, Confirm, ControlKind, Nack, Pull, Read, Status};
use super::depth::{nested_deeper_than, MAX_DEPTH};
use super::envelope::{
    parse_downlink, parse_uplink, with_publish, Payload, RejectCode, WireDownlink, WireEnvelope,
};
use super::inbox::{InboxBatch, InboxEntry, InboxEnvelope, Tombstone, TombstoneStatus};
use super::north::NorthMessage;
use super::receipt::{NorthReceipt, NorthStatus, Receipt, ReceiptStatus};
use super::sniff::sniff_msg_id;
use super::topics::{check_stream, DeviceTopic, NorthTopics, Topics};
use super::user_props::UserProps;
use crate::ids::{DeviceId, GatewayId, MsgId, Seq};

const MAX_BYTES: usize = 64 << 10;
const KINDS: [ControlKind; 5] = [
    ControlKind::Confirm,
    ControlKind::Read,
    ControlKind::Pull,
    ControlKind::Nack,
    ControlKind::Status,
];

fn device_id() -> impl Strategy<Value = DeviceId> {
    "[A-Za-z0-9._-]{1,64}".prop_map(|s| DeviceId::new(s).expect("valid by construction"))
}

fn gateway_id() -> impl Strategy<Value = GatewayId> {
    "[A-Za-z0-9._-]{1,64}".prop_map(|s| GatewayId::new(s).expect("valid by construction"))
}

fn msg_id() -> impl Strategy<Value = MsgId> {
    "[A-Za-z0-9._:-]{1,128}".prop_map(|s| MsgId::new(s).expect("valid by construction"))
}

fn seq() -> impl Strategy<Value = Seq> {
    any::<u64>().prop_map(Seq)
}

/// Stream levels as the protocol allows them: 1..=8 levels of
/// `[A-Za-z0-9._-]{1,64}`.
fn stream() -> impl Strategy<Value = String> {
    prop::collection::vec("[A-Za-z0-9._-]{1,16}", 1..=8).prop_map(|levels| levels.join("/"))
}

/// JSON of any shape, a few levels deep, with the protocol's own field
/// names among the keys so parsers see near-misses, not only noise.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("msg_id".to_string()),
        Just("payload".to_string()),
        Just("payload_b64".to_string()),
        Just("ttl_s".to_string()),
        Just("retry".to_string()),
        Just("to".to_string()),
        Just("device".to_string()),
        Just("status".to_string()),
        Just("seq".to_string()),
        Just("upto".to_string()),
        Just("after".to_string()),
        Just("limit".to_string()),
        Just("online".to_string()),
        Just("reason".to_string()),
        ".{0,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
        "[A-Za-z0-9._:-]{1,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Raw bytes, or the bytes of some JSON value.
fn input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        json_value().prop_map(|v| serde_json::to_vec(&v).expect("json")),
    ]
}

/// A JSON value wrapped in `levels` arrays or single-key objects, to reach
/// either side of [`MAX_DEPTH`].
fn nested_json() -> impl Strategy<Value = Value> {
    (json_value(), prop::collection::vec(any::<bool>(), 0..40)).prop_map(|(mut v, levels)| {
        for as_array in levels {
            v = if as_array {
                Value::Array(vec![v])
            } else {
                json!({ "payload": v })
            };
        }
        v
    })
}

/// Levels of arrays and objects in `v`; a scalar is 0.
fn depth(v: &Value) -> usize {
    match v {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(fields) => 1 + fields.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn envelope() -> impl Strategy<Value = WireEnvelope> {
    let payload = prop_oneof![
        json_value().prop_map(Payload::Json),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| Payload::bytes(&b)),
    ];
    (
        msg_id(),
        prop::option::of(0..i64::MAX),
        payload,
        prop::option::of(1u64..315_360_000),
        any::<bool>(),
    )
        .prop_map(|(msg_id, ts, payload, ttl_s, retry)| WireEnvelope {
            msg_id,
            ts,
            payload,
            ttl_s,
            retry,
            extra: Map::new(),
        })
}

/// An MQTT 5 publish's user properties: a few keys, some repeated, any
/// text.
fn user_props() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(
        (prop_oneof![Just("k".to_string()), ".{0,8}"], ".{0,16}"),
        0..6,
    )
}

proptest! {
    #[test]
    fn an_mqtt5_publish_is_taken_whole_or_refused(
        // Short text, and lengths at the bounds (128-byte names,
        // 1,024-byte values, 32 pairs, 8 KiB).
        pairs in prop::collection::vec(
            (prop_oneof![".{0,8}", "k{126,130}"], prop_oneof![".{0,16}", "v{1020,1030}"]),
            0..36,
        ),
        expiry in prop::option::of(any::<u32>()),
    ) {
        let env = parse_uplink(br#"{"msg_id":"m","payload":1}"#, MAX_BYTES).unwrap();
        match with_publish(env, pairs.clone(), expiry) {
            Ok(e) => {
                let mut sent = pairs;
                sent.sort();
                let mut kept = e.props.pairs().to_vec();
                kept.sort();
                prop_assert_eq!(kept, sent, "every pair, none dropped");
                prop_assert_eq!(e.ttl.map(|t| t.as_secs()), expiry.map(u64::from));
            }
            Err(r) => prop_assert_eq!(r.msg_id, Some(MsgId::new("m").unwrap())),
        }
    }

    #[test]
    fn no_parser_panics_on_any_input(bytes in input()) {
        let _ = parse_uplink(&bytes, MAX_BYTES);
        let _ = parse_downlink(&bytes, MAX_BYTES, 0);
        let _ = parse_acks(&bytes);
        for kind in KINDS {
            let _ = parse_control(kind, &bytes);
        }
        let _ = sniff_msg_id(&bytes);
        let _ = NorthReceipt::parse_many(&bytes);
        let _ = serde_json::from_slice::<InboxBatch>(&bytes);
        let _ = serde_json::from_slice::<Receipt>(&bytes);
        let _ = serde_json::from_slice::<NorthMessage>(&bytes);
    }

    #[test]
    fn the_depth_scan_agrees_with_what_serde_parses(bytes in input(), limit in 0usize..8) {
        if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
            prop_assert_eq!(nested_deeper_than(&bytes, limit), depth(&v) > limit);
        }
    }

    #[test]
    fn the_depth_scan_is_exact_on_either_side_of_the_limit(v in nested_json(), pretty in any::<bool>()) {
        let bytes = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.expect("json");
        prop_assert_eq!(nested_deeper_than(&bytes, MAX_DEPTH), depth(&v) > MAX_DEPTH);
        // An envelope is one level more than its payload.
        let env = serde_json::to_vec(&json!({"msg_id": "d-1", "payload": v})).expect("json");
        match parse_uplink(&env, usize::MAX) {
            Ok(_) => prop_assert!(depth(&v) < MAX_DEPTH),
            Err(r) => {
                prop_assert_eq!(r.code, RejectCode::NestedTooDeep, "{}", r.reason());
                prop_assert!(depth(&v) >= MAX_DEPTH);
                prop_assert_eq!(r.msg_id.map(|m| m.to_string()), Some("d-1".to_string()));
            }
        }
    }

    #[test]
    fn deep_nesting_is_refused_by_every_parser_without_recursing(
        n in (MAX_DEPTH + 1)..4_000,
        open in prop_oneof![Just("["), Just("{\"a\":")],
        closed in any::<bool>(),
    ) {
        let mut text = format!(r#"{{"msg_id":"deep","payload":{}"#, open.repeat(n));
        if closed {
            text.push('1');
            text.push_str(&(if open == "[" { "]" } else { "}" }).repeat(n));
            text.push('}');
        }
        let bytes = text.as_bytes();
        let up = parse_uplink(bytes, usize::MAX).unwrap_err();
        prop_assert_eq!(up.reason(), "malformed: nested deeper than 32");
        prop_assert_eq!(parse_downlink(bytes, usize::MAX, 0).unwrap_err().code, RejectCode::NestedTooDeep);
        for kind in KINDS {
            let e = parse_control(kind, bytes).unwrap_err();
            prop_assert!(e.ends_with("nested deeper than 32"), "{}", e);
        }
        prop_assert!(parse_acks(bytes)[0].is_err());
    }

    #[test]
    fn no_topic_parser_panics_on_any_topic(topic in ".{0,200}") {
        let topics = Topics::new("devices", "ferry/gw");
        let _ = topics.parse_device(&topic);
        let _ = topics.is_north_down(&topic);
        let _ = topics.parse_north_down(&topic);
        let _ = topics.north().parse(&topic);
        let _ = check_stream(&topic);
    }

    #[test]
    fn a_parsed_uplink_keeps_its_msg_id_and_a_sniffed_one_agrees(bytes in input()) {
        if let Ok(env) = parse_uplink(&bytes, MAX_BYTES) {
            prop_assert_eq!(sniff_msg_id(&bytes), Some(env.msg_id.clone()));
        }
    }

    #[test]
    fn every_downlink_the_backend_writes_is_accepted_for_its_recipients(
        to in prop::collection::vec(prop_oneof![
            device_id().prop_map(|d| d.to_string()),
            device_id().prop_map(|d| format!("@{d}")),
        ], 0..5),
        env in envelope(),
        stored_ms in 0i64..i64::MAX / 2,
    ) {
        let down = WireDownlink { to: to.clone(), envelope: env.clone() };
        let bytes = down.to_bytes();
        let back: WireDownlink = serde_json::from_slice(&bytes).expect("reads back");
        prop_assert_eq!(&back, &down);
        let parsed = parse_downlink(&bytes, usize::MAX, stored_ms).map_err(|r| r.reason());
        let parsed = match parsed {
            Ok(p) => p,
            Err(reason) => return Err(TestCaseError::fail(reason)),
        };
        prop_assert_eq!(&parsed.msg_id, &env.msg_id);
        prop_assert_eq!(&parsed.to, &to);
        // The inbox entry is the envelope (without `to`), `ts` filled in.
        let entry: Map<String, Value> = serde_json::from_slice(&parsed.entry).expect("an object");
        prop_assert!(!entry.contains_key("to"));
        prop_assert_eq!(&entry["msg_id"], &json!(env.msg_id.as_str()));
        prop_assert_eq!(&entry["ts"], &json!(env.ts.unwrap_or(stored_ms)));
    }

    #[test]
    fn every_envelope_a_device_writes_is_accepted_with_its_id(env in envelope()) {
        let bytes = env.to_bytes();
        let parsed = parse_uplink(&bytes, usize::MAX).map_err(|r| r.reason());
        prop_assert_eq!(parsed.map(|e| e.msg_id), Ok(env.msg_id.clone()));
        let back: WireEnvelope = serde_json::from_slice(&bytes).expect("reads back");
        prop_assert_eq!(back, env);
    }

    #[test]
    fn device_topics_parse_back_to_their_device_and_kind(device in device_id(), stream in stream()) {
        let topics = Topics::new("devices", "ferry/gw");
        let t = topics.device(&device);
        prop_assert_eq!(
            topics.parse_device(&t.up(&stream)),
            Ok((device.clone(), DeviceTopic::Up { stream: stream.clone() }))
        );
        prop_assert_eq!(topics.parse_device(&t.confirm()), Ok((device.clone(), DeviceTopic::Confirm)));
        prop_assert_eq!(topics.parse_device(&t.status()), Ok((device, DeviceTopic::Status)));
        prop_assert!(check_stream(&stream).is_ok());
    }

    #[test]
    fn acks_round_trip_one_or_many(
        acks in prop::collection::vec(
            (device_id(), msg_id(), prop::option::of((".{0,40}", any::<bool>()))),
            1..20,
        )
    ) {
        let acks: Vec<BackendAck> = acks
            .into_iter()
            .map(|(d, m, nack)| match nack {
                None => BackendAck::ok(d, m),
                Some((reason, retry)) => BackendAck::nack(d, m, reason, retry),
            })
            .collect();
        let back: Vec<BackendAck> = parse_acks(&encode_acks(&acks))
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(TestCaseError::fail)?;
        prop_assert_eq!(back, acks);
    }

    #[test]
    fn controls_round_trip(s in seq(), after in prop::option::of(seq()), limit in prop::option::of(0usize..100_000), reason in prop::option::of(".{0,40}"), online in any::<bool>(), ts in prop::option::of(any::<i64>())) {
        fn round<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(v: T) -> Result<(), TestCaseError> {
            let back: T = serde_json::from_slice(&super::control::to_bytes(&v)).expect("reads back");
            prop_assert_eq!(back, v);
            Ok(())
        }
        round(Confirm { upto: s })?;
        round(Read { upto: s })?;
        round(Pull { after, limit })?;
        round(Nack { seq: s, reason })?;
        round(Status { online, ts })?;
    }

    #[test]
    fn receipts_round_trip_both_ways(
        id in prop::option::of(msg_id()),
        s in prop::option::of(seq()),
        reason in prop::option::of(".{0,40}"),
        status in prop_oneof![
            Just(ReceiptStatus::Stored),
            Just(ReceiptStatus::Delivered),
            Just(ReceiptStatus::Failed),
            Just(ReceiptStatus::Rejected),
        ],
        device in prop::option::of(device_id()),
        north_status in prop_oneof![
            Just(NorthStatus::Stored),
            Just(NorthStatus::Delivered),
            Just(NorthStatus::Read),
            Just(NorthStatus::Expired),
            Just(NorthStatus::Failed),
            Just(NorthStatus::Rejected),
        ],
        ts in any::<i64>(),
    ) {
        let r = Receipt { msg_id: id.clone(), status, seq: s, reason: reason.clone(), dead_letter: None };
        let back: Receipt = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).expect("reads back");
        prop_assert_eq!(back, r);
        let n = NorthReceipt {
            msg_id: id.map(|m| m.to_string()),
            device: device.map(|d| d.to_string()),
            status: north_status.as_str(),
            seq: s.map(|s| s.0),
            ts,
            reason,
        };
        let many = serde_json::to_vec(&[&n, &n]).unwrap();
        prop_assert_eq!(NorthReceipt::parse_many(&many).expect("reads back"), vec![n.clone(), n.clone()]);
        prop_assert_eq!(NorthReceipt::parse_many(&serde_json::to_vec(&n).unwrap()).expect("reads back"), vec![n]);
    }

    #[test]
    fn inbox_batches_and_north_messages_round_trip(
        entries in prop::collection::vec((seq(), envelope(), prop::option::of(any::<bool>())), 0..10),
        more in any::<bool>(),
        gateway in gateway_id(),
        device in device_id(),
        stream in stream(),
        stored_ts in any::<i64>(),
        env in envelope(),
        props in user_props(),
    ) {
        let messages = entries
            .into_iter()
            .map(|(seq, envelope, tomb)| match tomb {
                Some(expired) => InboxEntry::Tombstone(Tombstone {
                    seq,
                    msg_id: envelope.msg_id,
                    status: if expired { TombstoneStatus::Expired } else { TombstoneStatus::Failed },
                }),
                None => InboxEntry::Message(InboxEnvelope { seq, envelope }),
            })
            .collect();
        let batch = InboxBatch { messages, more };
        let back: InboxBatch = serde_json::from_slice(&serde_json::to_vec(&batch).unwrap()).expect("reads back");
        prop_assert_eq!(back, batch);

        let props = UserProps::new(props).expect("within the bounds by construction");
        let north = NorthMessage { seq: Seq(1), gateway: gateway.clone(), device: device.clone(), stream: stream.clone(), stored_ts, props, envelope: env };
        let back: NorthMessage = serde_json::from_slice(&north.to_bytes()).expect("reads back");
        prop_assert_eq!(back, north);
        let topics = NorthTopics::new("ferry", &gateway);
        prop_assert!(topics.parse(&topics.up(&device, &stream)).is_some());
    }
}

/// Found by the round-trip properties: without serde_json's
/// `float_roundtrip`, a number in a payload could come out of the gateway
/// one unit in the last place off, because envelopes are parsed and
/// written again on their way through (north body, inbox entry).
#[test]
fn payload_numbers_go_through_the_gateway_unchanged() {
    let tricky = [
        3.753_318_737_314_215_6e94,
        -9.021_894_255_568_605e-160,
        0.1,
        1e308,
    ];
    for x in tricky {
        let sent = json!({"msg_id": "m-1", "payload": {"v": x}, "to": ["a"]});
        let bytes = serde_json::to_vec(&sent).unwrap();
        let up = parse_uplink(&bytes, MAX_BYTES).expect("valid uplink");
        let device = DeviceId::new("a").unwrap();
        let stamp = super::north::Stamp {
            gateway: "gw",
            device: &device,
            stream: "t",
            stored_ms: 1,
        };
        let north: Value = serde_json::from_slice(&super::north::north_body(&up, &stamp)).unwrap();
        assert_eq!(north["payload"]["v"].as_f64(), Some(x), "north body");
        let down = parse_downlink(&bytes, MAX_BYTES, 1).expect("valid downlink");
        let entry: Value = serde_json::from_slice(&down.entry).unwrap();
        assert_eq!(entry["payload"]["v"].as_f64(), Some(x), "inbox entry");
    }
}

/// The deep end of `deep_nesting_is_refused_by_every_parser_without_recursing`,
/// once each (the property keeps its inputs small for the million-case run).
#[test]
fn a_hundred_thousand_open_brackets_are_refused_without_recursing() {
    for open in ["[", "{\"a\":"] {
        let text = format!(r#"{{"msg_id":"deep","payload":{}"#, open.repeat(100_000));
        let up = parse_uplink(text.as_bytes(), usize::MAX).unwrap_err();
        assert_eq!(up.reason(), "malformed: nested deeper than 32");
        assert_eq!(up.msg_id.map(|m| m.to_string()).as_deref(), Some("deep"));
        assert!(parse_downlink(text.as_bytes(), usize::MAX, 0).is_err());
        for kind in KINDS {
            assert!(parse_control(kind, text.as_bytes()).is_err());
        }
        assert!(parse_acks(text.as_bytes())[0].is_err());
    }
}
