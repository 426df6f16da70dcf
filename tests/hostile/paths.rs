//! The other ways into the embedded broker's router, besides a publish and
//! a will, each held to the same rule (a device reaches only its own
//! topics):
//! - a retained publish: the broker keeps no retained message of a client
//!   (vendor/README.md, patch 9), so one published on another device's
//!   `ack` (quarantined and refused anyway) is never replayed to it;
//! - a shared subscription (`$share/{group}/{filter}`): refused (0x80)
//!   whatever the filter, a device's own topics included;
//! - a session's queued messages: no session is kept (patch 8), so a
//!   connection under a device's id inherits nothing; taking a device's id
//!   needs its password or certificate in those modes.

use std::time::Duration;

use rumqttc::{QoS, SubscribeReasonCode};

use crate::support::access::{Access, AuthMode};
use crate::support::{device_topics, Ferry, FerryOpts, Mosquitto};

each_auth_mode!(retained_messages_shared_subscriptions_and_sessions_reach_no_other_device);

async fn retained_messages_shared_subscriptions_and_sessions_reach_no_other_device(mode: AuthMode) {
    let access = Access::new(mode);
    let mq = Mosquitto::start();
    let ferry = Ferry::start(access.opts(FerryOpts::new("gw-paths", mq.port), &["pa-w", "pa-b"]));
    let bt = device_topics("pa-b");
    let wt = device_topics("pa-w");

    // W publishes retained messages on B's ack and inbox, and on its own
    // status.
    let mut w = access
        .connect(ferry.south_port, "pa-w", access.connect_packet("pa-w"))
        .await;
    w.subscribe(&[wt.ack()]).await;
    let mut retained = Vec::new();
    for (topic, body) in [
        (bt.ack(), r#"{"msg_id":"forged","status":"stored","seq":1}"#),
        (bt.inbox(), r#"{"messages":[],"more":false}"#),
        (wt.status(), r#"{"online":true}"#),
    ] {
        let mut p = rumqttc::Publish::new(topic, QoS::AtLeastOnce, body);
        p.retain = true;
        p.pkid = w.next_pkid();
        retained.push(rumqttc::Packet::Publish(p));
    }
    w.send_many(retained).await;
    // The two foreign ones are answered `rejected` on W's own ack.
    let mut rejected = 0;
    w.read_publishes(Duration::from_secs(10), |p| {
        let r: serde_json::Value = serde_json::from_slice(&p.payload).unwrap_or_default();
        rejected += usize::from(r["status"] == "rejected");
        rejected == 2
    })
    .await;
    assert_eq!(rejected, 2, "both foreign retained publishes refused");

    // Shared subscriptions are refused, whatever they name.
    let shared = vec![
        format!("$share/g/{}", bt.ack()),
        format!("$share/g/{}", bt.inbox()),
        "$share/g/devices/+/up/#".to_string(),
        format!("$share/g/{}", wt.ack()),
    ];
    let codes = w.subscribe(&shared).await;
    assert_eq!(codes.len(), shared.len());
    for (filter, code) in shared.iter().zip(&codes) {
        assert!(
            matches!(code, SubscribeReasonCode::Failure),
            "{filter}: {code:?}"
        );
    }

    // B subscribes afterwards, with a session it asks to keep: no session
    // is present and nothing retained or queued reaches it.
    let mut connect = access.connect_packet("pa-b");
    connect.clean_session = false;
    let (mut b, ack) = access
        .try_connect(ferry.south_port, "pa-b", connect)
        .await
        .expect("B connects");
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
    assert!(!ack.session_present, "no session kept");
    b.subscribe(&[bt.ack(), bt.inbox()]).await;
    let got = b.read_publishes(Duration::from_millis(500), |_| true).await;
    assert!(!got, "B got a retained or queued message");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'pa-b'", []),
        0
    );
}
