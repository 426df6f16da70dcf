use super::*;

fn parse(s: &str) -> Result<Envelope, Rejection> {
    parse_uplink(s.as_bytes(), 1024)
}

fn reason(s: &str) -> String {
    parse(s).unwrap_err().reason()
}

#[test]
fn a_full_envelope_is_accepted() {
    let e = parse(r#"{"msg_id":"a-1","ts":5,"payload":{"t":1},"ttl_s":60,"retry":false,"x":1}"#)
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
fn nesting_past_the_limit_is_malformed_and_keeps_a_readable_id() {
    let nest = |n: usize| {
        format!(
            r#"{{"msg_id":"deep-1","payload":{}1{}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    // The envelope is level 1.
    assert!(parse(&nest(MAX_DEPTH - 1)).is_ok());
    let r = parse(&nest(MAX_DEPTH)).unwrap_err();
    assert_eq!(r.code, RejectCode::NestedTooDeep);
    assert_eq!(r.reason(), "malformed: nested deeper than 32");
    assert_eq!(r.msg_id.unwrap().as_str(), "deep-1");
    let unclosed = format!(r#"{{"msg_id":"deep-2","payload":{}"#, "[".repeat(100_000));
    let r = parse_uplink(unclosed.as_bytes(), usize::MAX).unwrap_err();
    assert_eq!(r.reason(), "malformed: nested deeper than 32");
    let r = parse_downlink(unclosed.as_bytes(), usize::MAX, 0).unwrap_err();
    assert_eq!(r.code, RejectCode::NestedTooDeep);
    assert_eq!(r.msg_id.unwrap().as_str(), "deep-2");
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
fn the_protocol_example_is_a_wire_envelope() {
    let text = r#"{"msg_id": "a-000017", "ts": 1764470000123, "payload": {"temp": 81.5}}"#;
    let e: WireEnvelope = serde_json::from_str(text).unwrap();
    assert_eq!(e.msg_id.as_str(), "a-000017");
    assert_eq!(e.ts, Some(1764470000123));
    assert_eq!(e.payload, Payload::Json(serde_json::json!({"temp": 81.5})));
    assert!(e.retry && e.ttl_s.is_none() && e.extra.is_empty());
    let v: Value = serde_json::from_slice(&e.to_bytes()).unwrap();
    assert_eq!(v, serde_json::from_str::<Value>(text).unwrap());
}

#[test]
fn wire_envelopes_round_trip_with_their_unknown_fields() {
    let mut e = WireEnvelope::new(MsgId::new("b-1").unwrap(), Payload::bytes(b"hi"));
    e.ttl_s = Some(60);
    e.retry = false;
    e.extra.insert("unit".into(), "C".into());
    let bytes = e.to_bytes();
    assert_eq!(
        serde_json::from_slice::<Value>(&bytes).unwrap(),
        serde_json::json!({"msg_id": "b-1", "payload_b64": "aGk=", "ttl_s": 60, "retry": false, "unit": "C"})
    );
    assert_eq!(serde_json::from_slice::<WireEnvelope>(&bytes).unwrap(), e);
    let accepted = parse_uplink(&bytes, 1024).unwrap();
    assert_eq!(accepted.msg_id, e.msg_id);
    assert_eq!(
        (accepted.ttl, accepted.retry),
        (Some(Duration::from_secs(60)), false)
    );
    assert!(serde_json::from_str::<WireEnvelope>(r#"{"msg_id":"a"}"#).is_err());
    assert!(serde_json::from_str::<WireEnvelope>(r#"{"msg_id":"a b","payload":1}"#).is_err());
}

#[test]
fn wire_downlinks_carry_to_only_when_set() {
    let d: WireDownlink = serde_json::from_str(
        r#"{"msg_id": "n-9", "to": ["d1", "@line3"], "payload": "shift B starts 14:00"}"#,
    )
    .unwrap();
    assert_eq!(d.to, ["d1", "@line3"]);
    assert!(d.envelope.extra.is_empty(), "to is not an unknown field");
    assert_eq!(
        serde_json::from_slice::<WireDownlink>(&d.to_bytes()).unwrap(),
        d
    );
    let parsed = parse_downlink(&d.to_bytes(), 1024, 0).unwrap();
    assert_eq!(parsed.to, d.to);
    let one = WireDownlink {
        to: Vec::new(),
        envelope: d.envelope,
    };
    assert_eq!(
        String::from_utf8(one.to_bytes()).unwrap(),
        r#"{"msg_id":"n-9","payload":"shift B starts 14:00"}"#
    );
}

fn with(s: &str, pairs: &[(&str, &str)], expiry: Option<u32>) -> Result<Envelope, Rejection> {
    let pairs = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    with_publish(parse(s).unwrap(), pairs, expiry)
}

#[test]
fn the_message_expiry_is_the_ttl_when_the_envelope_has_none() {
    let e = with(r#"{"msg_id":"a-1","payload":1}"#, &[], Some(90)).unwrap();
    assert_eq!(e.ttl, Some(Duration::from_secs(90)));
    assert_eq!(e.fields["ttl_s"], 90, "the backend sees the ttl_s it got");
    let e = with(
        r#"{"msg_id":"a-1","payload":1,"ttl_s":null}"#,
        &[],
        Some(90),
    )
    .unwrap();
    assert_eq!(e.ttl, Some(Duration::from_secs(90)), "null is none");
}

#[test]
fn the_envelopes_own_ttl_wins_over_the_message_expiry() {
    let e = with(r#"{"msg_id":"a-1","payload":1,"ttl_s":60}"#, &[], Some(90)).unwrap();
    assert_eq!(e.ttl, Some(Duration::from_secs(60)));
    assert_eq!(e.fields["ttl_s"], 60);
    // Even one that could not be a ttl_s is never looked at then.
    assert!(with(r#"{"msg_id":"a-1","payload":1,"ttl_s":60}"#, &[], Some(0)).is_ok());
    let e = with(r#"{"msg_id":"a-1","payload":1}"#, &[], None).unwrap();
    assert_eq!((e.ttl, e.fields.get("ttl_s")), (None, None));
}

#[test]
fn a_message_expiry_outside_the_ttl_bounds_is_malformed_with_the_id() {
    for s in [0, u32::MAX] {
        let r = with(r#"{"msg_id":"a-7","payload":1}"#, &[], Some(s)).unwrap_err();
        assert_eq!(r.code, RejectCode::Malformed);
        assert_eq!(r.msg_id.unwrap().as_str(), "a-7");
        assert!(r.detail.contains("message expiry interval"), "{}", r.detail);
    }
    let most = u32::try_from(MAX_TTL_S).unwrap();
    assert!(with(r#"{"msg_id":"a-7","payload":1}"#, &[], Some(most)).is_ok());
}

#[test]
fn user_properties_past_a_bound_are_too_large_with_the_id() {
    let many: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    let r = with_publish(
        parse(r#"{"msg_id":"a-8","payload":1}"#).unwrap(),
        many,
        Some(5),
    )
    .unwrap_err();
    assert_eq!(r.reason(), "too_large: 33 user properties > 32");
    assert_eq!(r.msg_id.unwrap().as_str(), "a-8");
    let e = with(
        r#"{"msg_id":"a-8","payload":1}"#,
        &[("k", "v"), ("k", "w")],
        None,
    )
    .unwrap();
    assert_eq!(e.props.get_all("k").collect::<Vec<_>>(), ["v", "w"]);
}

#[test]
fn a_user_property_named_like_the_gateways_own_is_refused_not_passed_on() {
    let r = with(
        r#"{"msg_id":"a-9","payload":1}"#,
        &[("ferry-publisher", "b")],
        None,
    )
    .unwrap_err();
    assert_eq!(r.code, RejectCode::Malformed);
    assert!(r.detail.contains("ferry-publisher"), "{}", r.detail);
}
