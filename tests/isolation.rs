//! Per-device isolation in the embedded broker: a device publishes and
//! subscribes only on its own topics. What it sends elsewhere is routed
//! nowhere, answered `rejected` (reason `unauthorized`) and kept as a dead
//! letter; what it subscribes to elsewhere is refused with 0x80; the other
//! device's traffic is undisturbed throughout. Each test runs with
//! anonymous devices (who a device is, is its client id) and with
//! password-authenticated ones.

use std::time::Duration;

use ferry::client::backend::{BackendClient, BackendOptions};
use rumqttc::SubscribeReasonCode;
use serde_json::{json, Value};

use crate::support::forgeries;
use crate::support::receipts::status;
use crate::support::{
    boot_id, device_topics, Backend, BareClient, Device, Ferry, FerryOpts, Mosquitto, RawMqtt,
};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

/// How the test's devices prove who they are.
#[derive(Clone, Copy, Debug)]
enum Login {
    Anonymous,
    Password,
}

impl Login {
    /// `opts` with every device in `devices` given a password, or not.
    fn apply(self, opts: FerryOpts, devices: &[&str]) -> FerryOpts {
        match self {
            Login::Anonymous => opts,
            Login::Password => {
                let logins: Vec<(&str, String)> =
                    devices.iter().map(|d| (*d, format!("pw-{d}"))).collect();
                let logins: Vec<(&str, &str)> =
                    logins.iter().map(|(d, p)| (*d, p.as_str())).collect();
                opts.with_passwords(&logins)
            }
        }
    }
}

/// Runs `$name(login)` as `$name::anonymous` and `$name::with_passwords`.
macro_rules! each_login {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn anonymous() {
                super::$name(super::Login::Anonymous).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn with_passwords() {
                super::$name(super::Login::Password).await
            }
        }
    };
}

each_login!(a_device_publishing_on_another_devices_topics_is_rejected_and_reaches_nobody);
each_login!(a_device_may_subscribe_only_to_its_own_ack_and_inbox);

async fn a_device_publishing_on_another_devices_topics_is_rejected_and_reaches_nobody(
    login: Login,
) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(login.apply(FerryOpts::new("gw-iso", mq.port), &["iso-a", "iso-b"]));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-iso").await;
    let mut opts = BackendOptions::new("127.0.0.1", mq.port, "gw-iso");
    opts.client_id = "iso-downlinks".into();
    let downlinks = BackendClient::connect(opts);
    let boot = boot_id();

    // B reads its ack and inbox, confirms nothing yet, and has two
    // downlinks waiting.
    let bt = device_topics("iso-b");
    let mut b = BareClient::connect(ferry.south_port, "iso-b", vec![bt.ack(), bt.inbox()]).await;
    b.publish(&bt.status(), r#"{"online":true}"#).await;
    for i in 0..2 {
        downlinks.send_down(
            &["iso-b"],
            json!({"msg_id": format!("{boot}-down-{i}"), "payload": i}),
        );
    }
    let first = b.next_json(SECS_30).await.expect("B's first batch");
    let b_seqs = first["messages"].as_array().map_or(0, Vec::len);
    assert!(b_seqs >= 1, "{first}");

    // A, as itself, tries B's every topic.
    let mut a_receipts = Device::connect(ferry.south_port, "iso-a").await;
    let forged = json!({"msg_id": format!("{boot}-forged"), "payload": 1}).to_string();
    let attempts = forgeries(&bt, forged.clone(), &format!("{boot}-x"));
    for (topic, body) in &attempts {
        a_receipts
            .publish_raw(topic, body.as_bytes().to_vec())
            .await;
    }
    let got = a_receipts
        .receipts_until(SECS_10, |r| r.len() >= attempts.len())
        .await;
    assert_eq!(got.len(), attempts.len(), "one answer per attempt: {got:?}");
    for r in &got {
        assert_eq!(status(r), "rejected", "{r}");
        assert!(
            r["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("unauthorized"),
            "{r}"
        );
        assert!(r["dead_letter"].as_i64().is_some(), "{r}");
    }
    assert_eq!(
        got[0]["msg_id"],
        json!(format!("{boot}-forged")),
        "the forged uplink's own id is named"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM dead_letter WHERE device = 'iso-a' AND reason LIKE 'unauthorized%'",
            []
        ),
        attempts.len() as i64
    );

    // Nothing of it reached B or the store as B.
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'iso-b'", []),
        0,
        "nothing stored as B"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = 'iso-b'",
            []
        ),
        0,
        "A's confirm did not move B's cursor"
    );
    if let Some(seen) = b.next_json(Duration::from_millis(300)).await {
        panic!("B got a forged receipt or an extra batch: {seen}");
    }

    // B's own traffic goes on: its uplink is delivered, its confirm counts.
    let id = format!("{boot}-b-own");
    b.publish(&bt.up("t"), json!({"msg_id": id, "payload": 1}).to_string())
        .await;
    let mut own = Vec::new();
    while !own.iter().any(|r: &Value| status(r) == "delivered") {
        match b.next_json(SECS_30).await {
            Some(r) => own.push(r),
            None => panic!("B's own uplink was not delivered: {own:?}"),
        }
    }
    assert!(own.iter().all(|r| r["msg_id"] == json!(id)), "{own:?}");
    let north = backend.drain_for(Duration::from_millis(300)).await;
    assert!(
        north
            .iter()
            .all(|m| m.device() != "iso-b" || m.msg_id() == id),
        "the backend saw nothing as B but B's own: {north:?}"
    );
    b.publish(&bt.confirm(), json!({ "upto": b_seqs }).to_string())
        .await;
    let deadline = tokio::time::Instant::now() + SECS_10;
    while ferry.query_i64(
        "SELECT delivered_upto FROM devices WHERE device = 'iso-b'",
        [],
    ) != b_seqs as i64
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "B's own confirm counts"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_device_may_subscribe_only_to_its_own_ack_and_inbox(login: Login) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(login.apply(FerryOpts::new("gw-iso-sub", mq.port), &["iso-spy"]));
    let mut raw = RawMqtt::connect(ferry.south_port, "iso-spy", 30).await;
    let own = device_topics("iso-spy");
    let other = device_topics("iso-other");
    let filters = vec![
        own.ack(),
        own.inbox(),
        other.ack(),
        other.inbox(),
        "devices/#".to_string(),
        "devices/+/ack".to_string(),
        "#".to_string(),
        other.up("t"),
    ];
    let codes = raw.subscribe(&filters).await;
    assert_eq!(codes.len(), filters.len(), "{codes:?}");
    for (filter, code) in filters.iter().zip(&codes) {
        let granted = !matches!(code, SubscribeReasonCode::Failure);
        let own_topic = *filter == own.ack() || *filter == own.inbox();
        assert_eq!(granted, own_topic, "{filter}: {code:?}");
    }
}
