//! Publishing and subscribing under isolation at every level: Paho's
//! `test_subscribe_failure` and `test_retained_messages` on the device's
//! own topics, a publish on another device's topic, the QoS 2 flow, and
//! an uplink over the payload limit.

use std::time::Duration;

use serde_json::json;

use super::runner::run;
use super::{code, packets, receipts, Gw};

const SECS_10: Duration = Duration::from_secs(10);

at_levels!(a_subscription_beyond_the_devices_own_topics_is_refused:
    v31 => "31", v311 => "311", v5 => "5");

/// test_subscribe_failure: another device's `ack` and `inbox`, and every
/// wildcard (even over the device's own topics), are refused: 0x87 in MQTT
/// 5, 0x80 in 3.1.x; a QoS 2 subscription to the own `ack` is granted QoS
/// 1; refusals count against no limit (the own `inbox` is granted after
/// them, and subscribing again is granted again); the connection goes on.
async fn a_subscription_beyond_the_devices_own_topics_is_refused(level: &str) {
    let gw = Gw::start("gw-conf-sub", |o| o).await;
    let r = run(
        "subscribe",
        gw.port(),
        &format!("sub-{level}"),
        level,
        &[("other", "sub-victim")],
    )
    .await;
    let refused = if level == "5" { 0x87 } else { 0x80 };
    assert_eq!(code(&r["connack"]), 0, "{r}");
    assert_eq!(r["own_ack_qos2"], json!([1]), "{r}");
    assert_eq!(r["foreign"], json!([refused, refused]), "{r}");
    assert_eq!(
        r["wildcards"],
        json!([refused, refused, refused, refused]),
        "{r}"
    );
    assert_eq!(r["inbox"], json!([1]), "{r}");
    assert_eq!(r["ack_again"], json!([1]), "{r}");
    assert_eq!(r["both_again"], json!([1, 1]), "{r}");
    assert_eq!(r["open"], true, "{r}");
}

at_levels!(a_publish_on_another_devices_topic_is_refused_and_answered_rejected:
    v31 => "31", v311 => "311", v5 => "5");

/// A publish (QoS 1 and QoS 2) on another device's `up`: MQTT 5's PUBACK
/// and PUBREC say 0x87, 3.1.x's cannot say anything; either way the device
/// gets `rejected`, reason unauthorized, on its own `ack`, the attempt is a
/// dead letter, and nothing is stored or sent north as the other device.
async fn a_publish_on_another_devices_topic_is_refused_and_answered_rejected(level: &str) {
    let mut gw = Gw::start("gw-conf-foreign", |o| o).await;
    let device = format!("fp-{level}");
    let boot = gw.boot.clone();
    let r = run(
        "foreign_publish",
        gw.port(),
        &device,
        level,
        &[("boot", &boot), ("other", "fp-victim")],
    )
    .await;
    let reason = if level == "5" { 0x87 } else { 0 };
    assert_eq!(packets(&r, "PUBACK")[0]["reason"], reason, "{r}");
    assert_eq!(packets(&r, "PUBREC")[0]["reason"], reason, "{r}");
    for id in ["forged", "forged2"] {
        let msg_id = format!("{boot}-{id}");
        let got = receipts(&r["messages"]);
        let receipt = got
            .iter()
            .find(|x| x["msg_id"] == msg_id.as_str())
            .unwrap_or_else(|| panic!("no receipt for {msg_id}: {r}"));
        assert_eq!(receipt["status"], "rejected", "{receipt}");
        assert!(
            receipt["reason"]
                .as_str()
                .unwrap()
                .starts_with("unauthorized"),
            "{receipt}"
        );
    }
    assert_eq!(
        gw.ferry.query_i64(
            "SELECT COUNT(*) FROM dead_letter WHERE device = ?1 AND reason LIKE 'unauthorized%'",
            [device.as_str()],
        ),
        2
    );
    assert_eq!(gw.ferry.query_i64("SELECT COUNT(*) FROM uplink", []), 0);
    let north = gw.backend.drain_for(Duration::from_millis(300)).await;
    assert!(north.is_empty(), "nothing north: {north:?}");
}

at_levels!(qos_2_is_answered_at_once_and_stored_once: v31 => "31", v311 => "311", v5 => "5");

/// QoS 2 from a device: PUBREC at once (before any PUBREL); the same
/// PUBLISH sent again with DUP before its PUBREL is PUBRECed again and
/// answered with the same receipt (stored once, the same seq); its PUBREL
/// gets PUBCOMP, and so does a PUBREL for a packet id the broker never saw.
async fn qos_2_is_answered_at_once_and_stored_once(level: &str) {
    let gw = Gw::start("gw-conf-qos2", |o| o).await;
    let device = format!("q2-{level}");
    let boot = gw.boot.clone();
    let r = run("qos2", gw.port(), &device, level, &[("boot", &boot)]).await;
    let mid = r["mid"].as_u64().unwrap();
    let recs = packets(&r, "PUBREC");
    assert_eq!(
        recs.len(),
        2,
        "a PUBREC for the PUBLISH and one for its DUP: {r}"
    );
    assert!(
        recs.iter().all(|p| p["mid"] == mid && p["reason"] == 0),
        "{r}"
    );
    let comps = packets(&r, "PUBCOMP");
    assert_eq!(comps.len(), 2, "{r}");
    assert_eq!(comps[0]["mid"], mid, "{r}");
    assert_eq!(
        comps[1]["mid"], 4321,
        "a PUBREL it never saw is answered too: {r}"
    );
    let msg_id = r["msg_id"].as_str().unwrap();
    let got = receipts(&r["messages"]);
    assert_eq!(got.len(), 2, "one receipt per PUBLISH: {r}");
    for receipt in &got {
        assert_eq!(
            **receipt,
            json!({"msg_id": msg_id, "status": "stored", "seq": 1}),
            "{r}"
        );
    }
    assert_eq!(gw.stored(&device, msg_id), 1, "stored once");
    let qos: Vec<_> = r["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["qos"])
        .collect();
    assert!(qos.iter().all(|q| **q == 1), "receipts at QoS 1: {r}");
}

at_levels!(a_retained_publish_on_its_own_topic_is_taken_and_kept_for_nobody:
    v31 => "31", v311 => "311", v5 => "5");

/// test_retained_messages, for a gateway that keeps no retained messages:
/// retained publishes at QoS 0, 1 and 2 on the device's own `up` (and its
/// `status`) are taken as any others: stored, answered `stored`, sent north
/// not retained; a fresh subscription to its own topics gets nothing
/// retained, and neither does a backend subscribing after them.
async fn a_retained_publish_on_its_own_topic_is_taken_and_kept_for_nobody(level: &str) {
    let mut gw = Gw::start("gw-conf-retain", |o| o).await;
    let device = format!("rt-{level}");
    let boot = gw.boot.clone();
    let r = run("retained", gw.port(), &device, level, &[("boot", &boot)]).await;
    assert_eq!(code(&r["connack"]), 0, "{r}");
    if level == "5" {
        assert_eq!(super::prop(&r["connack"], "RetainAvailable"), 0, "{r}");
    }
    for q in 0..3 {
        let id = format!("{boot}-r{q}");
        assert!(
            receipts(&r["messages"])
                .iter()
                .any(|x| x["msg_id"] == id.as_str() && x["status"] == "stored"),
            "{id}: {r}"
        );
        assert_eq!(gw.stored(&device, &id), 1);
    }
    assert_eq!(
        r["later_messages"],
        json!([]),
        "nothing retained for it: {r}"
    );
    let north = gw.north_ids(&device, SECS_10, |ids| ids.len() >= 3).await;
    assert_eq!(north.len(), 3, "{north:?}");
    let mut late = crate::support::Backend::connect(gw.mq.port, "gw-conf-retain").await;
    let kept = late.drain_for(Duration::from_millis(300)).await;
    assert!(
        kept.iter().all(|m| m.device() != device),
        "no retained uplink north: {kept:?}"
    );
}

at_levels!(an_uplink_over_the_payload_limit_is_answered_rejected:
    v31 => "31", v311 => "311", v5 => "5");

/// An uplink over `south.max_payload_bytes` is answered `rejected` (too
/// large) at every level, and the connection goes on.
async fn an_uplink_over_the_payload_limit_is_answered_rejected(level: &str) {
    let gw = Gw::start("gw-conf-large", |o| {
        o.with(|c| c.south.max_payload_bytes = 2048)
    })
    .await;
    let device = format!("big-{level}");
    let boot = gw.boot.clone();
    let r = run(
        "too_large",
        gw.port(),
        &device,
        level,
        &[("boot", &boot), ("max_payload", "2048")],
    )
    .await;
    assert_eq!(r["big"]["status"], "rejected", "{r}");
    assert!(
        r["big"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("too_large"),
        "{r}"
    );
    assert_eq!(r["small"]["status"], "stored", "{r}");
    assert_eq!(r["open"], true, "{r}");
    assert_eq!(gw.stored(&device, &format!("{boot}-big")), 0);
}

/// `south.max_subscriptions` bounds what a device subscribes to; the
/// gateway's own link must still read every device topic kind and the
/// quarantine, so a publish on another device's topic is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_subscription_limit_leaves_the_gateways_own_link_whole() {
    let gw = Gw::start("gw-conf-sublimit", |o| {
        o.with(|c| c.south.max_subscriptions = 2)
    })
    .await;
    let boot = gw.boot.clone();
    let r = run(
        "foreign_publish",
        gw.port(),
        "lim-a",
        "5",
        &[("boot", &boot), ("other", "lim-victim")],
    )
    .await;
    let got = receipts(&r["messages"]);
    assert!(
        got.iter().any(|x| x["status"] == "rejected"),
        "the forged publish is answered: {r}"
    );
}
