//! What an MQTT 5 publish carries beside its envelope (docs/PROTOCOL.md,
//! "Payload envelope"): user properties reach the backend as `props`, on
//! every send and after a restart; the message expiry is the `ttl_s` an
//! envelope without one gets; past the bounds a publish is rejected and
//! dead-lettered, and a duplicate with other properties is still a
//! duplicate. Embedded mode (the broker devices speak MQTT 5 to).

use serde_json::json;

use super::*;
use crate::support::raw_v5::RawV5;

/// A device on MQTT 5, subscribed to its receipts.
async fn v5_device(port: u16, id: &str) -> RawV5 {
    let mut d = RawV5::connect(port, id).await;
    d.subscribe(&format!("devices/{id}/ack")).await;
    d
}

fn envelope(msg_id: &str, extra: Value) -> Vec<u8> {
    let mut e = json!({"msg_id": msg_id, "payload": {"t": 1}});
    if let Value::Object(more) = extra {
        e.as_object_mut().unwrap().extend(more);
    }
    serde_json::to_vec(&e).unwrap()
}

/// The receipt for `msg_id` with one of `wanted` statuses.
async fn receipt(d: &mut RawV5, msg_id: &str, wanted: &[&str]) -> Value {
    let got = d
        .json_until(SECS_10, |all| {
            all.iter()
                .any(|r| r["msg_id"] == msg_id && wanted.contains(&status(r)))
        })
        .await;
    got.into_iter()
        .find(|r| r["msg_id"] == msg_id && wanted.contains(&status(r)))
        .unwrap_or_else(|| panic!("{msg_id}: no {wanted:?} receipt"))
}

/// The first north message for `msg_id`.
async fn north(backend: &mut Backend, msg_id: &str) -> Value {
    let got = backend
        .messages_until(SECS_10, |all| all.iter().any(|m| m.msg_id() == msg_id))
        .await;
    got.into_iter()
        .find(|m| m.msg_id() == msg_id)
        .unwrap_or_else(|| panic!("{msg_id}: never north"))
        .body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_properties_go_north_as_props_and_the_message_expiry_as_ttl_s() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-props", mq.port));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-props").await;
    let mut d = v5_device(ferry.south_port, "v5-a").await;
    let up = "devices/v5-a/up/line3/temp";

    let user = [
        ("site", "b2"),
        ("tag", "x"),
        ("ferry-publisher", "forged"),
        ("tag", "y"),
    ];
    d.publish(up, envelope("p-1", json!({})), &user, Some(120))
        .await;
    assert_eq!(receipt(&mut d, "p-1", &["stored"]).await["seq"], 1);
    let b = north(&mut backend, "p-1").await;
    assert_eq!(b["props"], json!({"site": "b2", "tag": ["x", "y"]}), "{b}");
    assert_eq!(b["ttl_s"], 120, "the expiry stands in for ttl_s: {b}");

    // The envelope's own ttl_s wins; no user properties, no props (the
    // device's own `props` field is the gateway's to set).
    let own = json!({"ttl_s": 60, "props": "mine"});
    d.publish(up, envelope("p-2", own), &[], Some(120)).await;
    receipt(&mut d, "p-2", &["stored"]).await;
    let b = north(&mut backend, "p-2").await;
    assert_eq!(
        (b["ttl_s"].as_u64(), b.get("props")),
        (Some(60), None),
        "{b}"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM uplink WHERE expires_ms IS NOT NULL",
            []
        ),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_properties_past_a_bound_are_rejected_and_dead_lettered() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-props-big", mq.port));
    let mut d = v5_device(ferry.south_port, "v5-b").await;
    let up = "devices/v5-b/up/t";

    let keys: Vec<String> = (0..33).map(|i| format!("k{i}")).collect();
    let many: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    d.publish(up, envelope("big-1", json!({})), &many, None)
        .await;
    let r = receipt(&mut d, "big-1", &["rejected", "stored"]).await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(r["reason"], "too_large: 33 user properties > 32");
    let row = r["dead_letter"].as_i64().expect("a dead letter");
    let reason: String = ferry
        .db()
        .query_row("SELECT reason FROM dead_letter WHERE id = ?1", [row], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(reason, "too_large: 33 user properties > 32");

    let long = "v".repeat(1025);
    d.publish(up, envelope("big-2", json!({})), &[("k", &long)], None)
        .await;
    let r = receipt(&mut d, "big-2", &["rejected", "stored"]).await;
    assert_eq!(
        r["reason"], "too_large: user property \"k\" has a value of 1025 bytes > 1024",
        "{r}"
    );
    assert_eq!(ferry.query_i64("SELECT count(*) FROM uplink", []), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_expiry_that_cannot_be_a_ttl_is_rejected_not_lost() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-props-exp", mq.port));
    let mut d = v5_device(ferry.south_port, "v5-c").await;
    d.publish(
        "devices/v5-c/up/t",
        envelope("exp-0", json!({})),
        &[],
        Some(0),
    )
    .await;
    let r = receipt(&mut d, "exp-0", &["rejected", "stored"]).await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap()
            .starts_with("malformed: message expiry interval 0 s"),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn props_are_sent_again_after_a_restart_and_a_duplicate_keeps_the_first() {
    let mq = Mosquitto::start();
    // No resend before the restart: what the backend gets after it, the
    // restarted gateway read from its store.
    let opts = FerryOpts::new("gw-props-rs", mq.port).with(|c| c.north.ack_timeout_ms = 60_000);
    let mut ferry = Ferry::start(opts);
    // A backend that acks nothing: the message stays `stored`.
    let mut backend = Backend::connect(mq.port, "gw-props-rs").await;
    let mut d = v5_device(ferry.south_port, "v5-d").await;
    let up = "devices/v5-d/up/t";
    d.publish(up, envelope("rs-1", json!({})), &[("k", "first")], None)
        .await;
    let first = receipt(&mut d, "rs-1", &["stored"]).await;
    assert_eq!(
        north(&mut backend, "rs-1").await["props"],
        json!({"k": "first"})
    );

    // The same msg_id with other properties: answered with the original
    // seq, stored once, the first properties kept.
    d.publish(up, envelope("rs-1", json!({})), &[("k", "second")], Some(5))
        .await;
    let again = receipt(&mut d, "rs-1", &["stored"]).await;
    assert_eq!(again["seq"], first["seq"]);
    assert_eq!(ferry.query_i64("SELECT count(*) FROM uplink", []), 1);

    drop(d);
    ferry.restart();
    let resent = backend
        .messages_until(SECS_30, |all| all.iter().any(|m| m.msg_id() == "rs-1"))
        .await;
    let resent: Vec<_> = resent.iter().filter(|m| m.msg_id() == "rs-1").collect();
    assert!(!resent.is_empty(), "resent after the restart");
    for m in resent {
        assert_eq!(m.body["props"], json!({"k": "first"}), "{}", m.body);
        assert_eq!(m.body.get("ttl_s"), None, "{}", m.body);
    }
}
