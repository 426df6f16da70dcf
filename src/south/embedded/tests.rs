use rumqttd::{own_publish_topic, own_subscribe_filter};

#[test]
fn a_device_publishes_on_its_own_device_topics_only() {
    for ok in [
        "devices/a/up",
        "devices/a/up/t",
        "devices/a/up/line3/temp",
        "devices/a/confirm",
        "devices/a/pull",
        "devices/a/read",
        "devices/a/nack",
        "devices/a/status",
    ] {
        assert!(own_publish_topic("devices", "a", ok), "{ok}");
    }
    for refused in [
        "devices/b/up/t",
        "devices/ab/up/t",
        "devices/a/ack",
        "devices/a/inbox",
        "devices/a/upx",
        "devices/a",
        "devices/a/",
        "devicesx/a/up/t",
        "ferry-quarantine",
        "other/a/up/t",
    ] {
        assert!(!own_publish_topic("devices", "a", refused), "{refused}");
    }
}

#[test]
fn a_certificate_cn_is_a_client_id_exactly_when_it_is_a_device_id() {
    let long = "x".repeat(64);
    let too_long = "x".repeat(65);
    for cn in [
        "press-7", "a", "A.b_c-9", &long, &too_long, "", "a b", "a/b", "+", "#", "é", "a:b", "a\0",
    ] {
        assert_eq!(
            rumqttd::valid_cert_client_id(cn),
            crate::ids::DeviceId::new(cn).is_ok(),
            "{cn:?}"
        );
    }
}

#[test]
fn a_device_subscribes_to_its_own_ack_and_inbox_only() {
    assert!(own_subscribe_filter("devices", "a", "devices/a/ack"));
    assert!(own_subscribe_filter("devices", "a", "devices/a/inbox"));
    for refused in [
        "devices/b/ack",
        "devices/+/ack",
        "devices/#",
        "#",
        "devices/a/#",
        "devices/a/up/t",
        "ferry-quarantine",
        "devices/ab/inbox",
    ] {
        assert!(!own_subscribe_filter("devices", "a", refused), "{refused}");
    }
    // And to its own plain command topic, exactly, when there is one.
    let down = Some("plant/cmd/{device}");
    assert!(rumqttd::may_subscribe("devices", down, "a", "plant/cmd/a"));
    assert!(rumqttd::may_subscribe(
        "devices",
        down,
        "a",
        "devices/a/inbox"
    ));
    for refused in [
        "plant/cmd/b",
        "plant/cmd/+",
        "plant/cmd/#",
        "plant/cmd/ab",
        "plant/cmd/a/x",
    ] {
        assert!(
            !rumqttd::may_subscribe("devices", down, "a", refused),
            "{refused}"
        );
    }
    assert!(!rumqttd::may_subscribe("devices", None, "a", "plant/cmd/a"));
}
