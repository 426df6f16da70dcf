use super::*;

fn t() -> Topics {
    Topics::new("devices", "ferry/edge-01")
}

#[test]
fn uplink_topics_carry_a_multi_level_stream() {
    let (d, k) = t().parse_device("devices/press-7/up/line3/temp").unwrap();
    assert_eq!(d.as_str(), "press-7");
    assert_eq!(
        k,
        DeviceTopic::Up {
            stream: "line3/temp".into()
        }
    );
}

#[test]
fn uplink_without_stream_is_refused() {
    let d = DeviceId::new("d").unwrap();
    assert_eq!(
        t().parse_device("devices/d/up"),
        Err(TopicError::NoStream(d.clone()))
    );
    assert_eq!(
        t().parse_device("devices/d/up/"),
        Err(TopicError::NoStream(d.clone()))
    );
    assert_eq!(
        t().parse_device("devices/d/up/a//b"),
        Err(TopicError::NoStream(d))
    );
}

#[test]
fn stream_levels_follow_the_protocol_rules() {
    let bad = |topic: &str| matches!(t().parse_device(topic), Err(TopicError::BadStream(..)));
    assert!(bad("devices/evil/up/a\0b"), "a NUL byte");
    assert!(bad("devices/d/up/a b"));
    assert!(bad("devices/d/up/temp+"));
    assert!(bad("devices/d/up/#"));
    assert!(bad(&format!("devices/d/up/{}", "x".repeat(65))));
    assert!(bad(&format!("devices/d/up/{}", "a/".repeat(8) + "b")));
    assert!(bad(&format!("devices/d/up/{}", "x".repeat(65_000))));
    assert!(t()
        .parse_device(&format!(
            "devices/d/up/{}",
            vec!["x".repeat(64); 8].join("/")
        ))
        .is_ok());
    assert!(t().parse_device("devices/d/up/line_3/temp.c-1").is_ok());
}

#[test]
fn control_topics_parse() {
    assert_eq!(
        t().parse_device("devices/d/confirm").unwrap().1,
        DeviceTopic::Confirm
    );
    assert_eq!(
        t().parse_device("devices/d/status").unwrap().1,
        DeviceTopic::Status
    );
    assert!(
        matches!(t().parse_device("devices/d/ack"), Err(TopicError::UnknownKind(k)) if k == "ack")
    );
}

#[test]
fn bad_device_ids_and_foreign_prefixes_are_refused() {
    assert!(matches!(
        t().parse_device("devices/bad:id/up/x"),
        Err(TopicError::BadDevice(..))
    ));
    assert_eq!(
        t().parse_device("devicesX/d/up/x"),
        Err(TopicError::NotDevice)
    );
    assert_eq!(t().parse_device("other/d/up/x"), Err(TopicError::NotDevice));
}

#[test]
fn north_topics_include_the_gateway_prefix() {
    let d = DeviceId::new("press-7").unwrap();
    assert_eq!(
        t().north_up(&d, "line3/temp"),
        "ferry/edge-01/up/press-7/line3/temp"
    );
    assert_eq!(t().north_ack(), "ferry/edge-01/ack");
    assert_eq!(t().device_ack(&d), "devices/press-7/ack");
    assert_eq!(t().device_inbox(&d), "devices/press-7/inbox");
}

#[test]
fn north_down_topics_parse() {
    assert_eq!(t().parse_north_down("ferry/edge-01/down"), Some(None));
    assert_eq!(
        t().parse_north_down("ferry/edge-01/down/p-1"),
        Some(Some("p-1"))
    );
    assert_eq!(t().parse_north_down("ferry/edge-01/down/"), None);
    assert_eq!(t().parse_north_down("ferry/edge-01/down/a/b"), None);
    assert_eq!(t().parse_north_down("ferry/edge-01/downx"), None);
    assert_eq!(t().parse_north_down("ferry/edge-02/down"), None);
}

#[test]
fn a_device_and_the_gateway_name_the_same_topics() {
    let d = DeviceId::new("press-7").unwrap();
    let mine = DeviceTopics::new("devices", &d);
    assert_eq!(mine.up("line3/temp"), "devices/press-7/up/line3/temp");
    assert_eq!(mine.ack(), t().device_ack(&d));
    assert_eq!(mine.inbox(), t().device_inbox(&d));
    assert_eq!(t().device(&d), mine);
    for (topic, kind) in [
        (mine.confirm(), DeviceTopic::Confirm),
        (mine.pull(), DeviceTopic::Pull),
        (mine.read(), DeviceTopic::Read),
        (mine.nack(), DeviceTopic::Nack),
        (mine.status(), DeviceTopic::Status),
        (
            mine.up("line3/temp"),
            DeviceTopic::Up {
                stream: "line3/temp".into(),
            },
        ),
    ] {
        assert_eq!(t().parse_device(&topic), Ok((d.clone(), kind)), "{topic}");
    }
    assert_eq!(
        t().device_filters(),
        [
            "devices/+/up/#",
            "devices/+/confirm",
            "devices/+/pull",
            "devices/+/read",
            "devices/+/nack",
            "devices/+/status"
        ]
    );
}

#[test]
fn a_backend_and_the_gateway_name_the_same_topics() {
    let g = GatewayId::new("edge-01").unwrap();
    let d = DeviceId::new("press-7").unwrap();
    let n = NorthTopics::new("ferry", &g);
    assert_eq!(n.base(), "ferry/edge-01");
    assert_eq!(n.up_filter(), "ferry/edge-01/up/#");
    assert_eq!(n.up(&d, "alarm"), t().north_up(&d, "alarm"));
    assert_eq!(n.ack(), t().north_ack());
    assert_eq!(n.down(), t().north_down());
    assert_eq!(n.down_filter(), t().north_down_filter());
    assert_eq!(n.down_to(&d), "ferry/edge-01/down/press-7");
    assert_eq!(n.receipts(), "ferry/edge-01/receipts");
    assert_eq!(n.status(), t().north_status());
    assert_eq!(t().north(), &n);
    assert_eq!(
        n.parse(&n.up(&d, "line3/temp")),
        Some(NorthTopic::Up {
            device: "press-7",
            stream: "line3/temp"
        })
    );
    assert_eq!(n.parse(&n.ack()), Some(NorthTopic::Ack));
    assert_eq!(n.parse(&n.up_batch()), Some(NorthTopic::UpBatch));
    assert_eq!(n.up_batch(), format!("{}/up", n.base()));
    assert_eq!(n.parse(&n.down()), Some(NorthTopic::Down(None)));
    assert_eq!(
        n.parse(&n.down_to(&d)),
        Some(NorthTopic::Down(Some("press-7")))
    );
    assert_eq!(n.parse(&n.receipts()), Some(NorthTopic::Receipts));
    assert_eq!(n.parse(&n.status()), Some(NorthTopic::Status));
    for other in [
        "ferry/edge-01/up/press-7",
        "ferry/edge-01/up//x",
        "ferry/edge-01/statusx",
        "ferry/edge-02/ack",
        "ferry/edge-01",
    ] {
        assert_eq!(n.parse(other), None, "{other}");
    }
}

#[test]
fn the_north_uplink_topics_length_is_known_without_making_it() {
    let d = DeviceId::new("press-7").unwrap();
    for stream in ["t", "line3/temp", "a/b/c/dé"] {
        assert_eq!(
            t().north_up_len(&d, stream),
            t().north_up(&d, stream).len(),
            "{stream}"
        );
    }
}
