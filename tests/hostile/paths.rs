//! The other ways into the embedded broker's router, besides a publish and
//! a will, each held to the same rule (a device reaches only its own
//! topics):
//! - a retained publish: the broker keeps no retained message of a client
//!   (vendor/README.md, patch 9), so one published on another device's
//!   `ack` (quarantined and refused anyway) is never replayed to it;
//! - a shared subscription (`$share/{group}/{filter}`): refused (0x80)
//!   whatever the filter, a device's own topics included;
//! - a session's queued messages (patch 52 keeps a session for a device
//!   that asks): what is queued for a device while it is away is only what
//!   the gateway sent it; another device's publishes and wills on its
//!   topics are refused, and taking its id over needs its password or
//!   certificate in those modes, so the device resumes with its own
//!   messages and nothing else.

use std::time::Duration;

use ferry::client::backend::{BackendClient, BackendOptions};
use rumqttc::{ConnectReturnCode, LastWill, QoS, SubscribeReasonCode};
use serde_json::{json, Value};

use crate::support::access::{Access, AuthMode};
use crate::support::receipts::eventually;
use crate::support::{
    boot_id, device_topics, forgeries, logged, Backend, Ferry, FerryOpts, Mosquitto,
};

const SECS_30: Duration = Duration::from_secs(30);

each_auth_mode!(retained_messages_and_shared_subscriptions_reach_no_other_device);

async fn retained_messages_and_shared_subscriptions_reach_no_other_device(mode: AuthMode) {
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

    // B connects afterwards for the first time, asking for a session: there
    // is none to resume, and nothing retained reaches it.
    let mut connect = access.connect_packet("pa-b");
    connect.clean_session = false;
    let (mut b, ack) = access
        .try_connect(ferry.south_port, "pa-b", connect)
        .await
        .expect("B connects");
    assert_eq!(ack.code, rumqttc::ConnectReturnCode::Success);
    assert!(!ack.session_present, "B never had a session");
    b.subscribe(&[bt.ack(), bt.inbox()]).await;
    let got = b.read_publishes(Duration::from_millis(500), |_| true).await;
    assert!(!got, "B got a retained message");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'pa-b'", []),
        0
    );
}

each_auth_mode!(
    a_resumed_session_brings_only_what_the_gateway_queued_whatever_another_device_tried
);

async fn a_resumed_session_brings_only_what_the_gateway_queued_whatever_another_device_tried(
    mode: AuthMode,
) {
    let access = Access::new(mode);
    let mq = Mosquitto::start();
    let gw = "gw-resume";
    let ferry = Ferry::start(access.opts(FerryOpts::new(gw, mq.port), &["rs-w", "rs-b"]));
    // Acks by hand, so that B's `delivered` receipt is made while B is
    // away.
    let mut backend = Backend::connect(mq.port, gw).await;
    let mut opts = BackendOptions::new("127.0.0.1", mq.port, gw);
    opts.client_id = "resume-downlinks".into();
    let downlinks = BackendClient::connect(opts);
    let boot = boot_id();
    let bt = device_topics("rs-b");
    let wt = device_topics("rs-w");

    // B asks for a session, subscribes to its ack and inbox, has one uplink
    // stored and goes away without DISCONNECT.
    let mut b = access
        .connect(ferry.south_port, "rs-b", kept_session(&access, "rs-b"))
        .await;
    b.subscribe(&[bt.ack(), bt.inbox()]).await;
    let up_id = format!("{boot}-b-up");
    let up = b.publish(
        &bt.up("t"),
        json!({"msg_id": up_id, "payload": 1}).to_string(),
    );
    b.send(up).await;
    let stored = b
        .read_publishes(SECS_30, |p| {
            receipt(p)["msg_id"] == json!(up_id) && receipt(p)["status"] == "stored"
        })
        .await;
    assert!(stored, "B's uplink stored\n{}", ferry.log_tail());
    drop(b);
    eventually(SECS_30, "the broker saw B go", || {
        logged(&ferry.log(), "device_disconnected", "rs-b") == 1
    })
    .await;

    // While B is away: its uplink is acked (a `delivered` receipt queued in
    // its session) and a downlink for it is stored.
    let north = backend
        .messages_until(SECS_30, |m| m.iter().any(|m| m.msg_id() == up_id))
        .await;
    assert!(north.iter().any(|m| m.msg_id() == up_id), "{north:?}");
    backend.ack_ok("rs-b", &up_id).await;
    let down_id = format!("{boot}-down");
    downlinks.send_down(&["rs-b"], json!({"msg_id": down_id, "payload": 1}));
    eventually(
        SECS_30,
        "B's uplink delivered and its downlink stored",
        || {
            ferry.query_i64(
                "SELECT COUNT(*) FROM uplink WHERE device = 'rs-b' AND state = 'delivered'",
                [],
            ) == 1
                && ferry.query_i64(
                    "SELECT COUNT(*) FROM down_delivery WHERE device = 'rs-b'",
                    [],
                ) == 1
        },
    )
    .await;

    // Meanwhile W publishes on each of B's topics, subscribes to them,
    // tries each as a will, and (where devices have credentials) tries to
    // take B's id over with a clean session, which would end B's.
    let forged = forgeries(
        &bt,
        json!({"msg_id": format!("{boot}-forged"), "payload": 1}).to_string(),
        "forged-by-w",
    );
    let mut w = access
        .connect(ferry.south_port, "rs-w", access.connect_packet("rs-w"))
        .await;
    w.subscribe(&[wt.ack()]).await;
    let codes = w.subscribe(&[bt.ack(), bt.inbox()]).await;
    assert!(
        codes
            .iter()
            .all(|c| matches!(c, SubscribeReasonCode::Failure)),
        "W may not subscribe to B's topics: {codes:?}"
    );
    let publishes: Vec<_> = forged
        .iter()
        .map(|(t, body)| w.publish(t, body.clone()))
        .collect();
    w.send_many(publishes).await;
    let mut rejected = 0;
    w.read_publishes(SECS_30, |p| {
        rejected += usize::from(receipt(p)["status"] == "rejected");
        rejected == forged.len()
    })
    .await;
    assert_eq!(rejected, forged.len(), "each forged publish refused");
    for (topic, body) in &forged {
        let mut connect = access.connect_packet("rs-w");
        connect.last_will = Some(LastWill::new(topic, body.clone(), QoS::AtLeastOnce, false));
        let code = access
            .try_connect(ferry.south_port, "rs-w", connect)
            .await
            .map(|(_, ack)| ack.code);
        assert_eq!(
            code,
            Ok(ConnectReturnCode::NotAuthorized),
            "a will on {topic}"
        );
    }
    for (what, connect) in impersonations(&access) {
        // W's own socket: its certificate in certificate mode.
        let code = access
            .try_connect(ferry.south_port, "rs-w", connect)
            .await
            .map(|(_, ack)| ack.code);
        assert!(
            matches!(
                code,
                Ok(ConnectReturnCode::NotAuthorized | ConnectReturnCode::BadUserNamePassword)
            ),
            "W as B with {what}: {code:?}"
        );
    }
    drop(w);
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = 'rs-b'",
            []
        ),
        0,
        "nothing W did moved B's cursor"
    );

    // B resumes: its session is there, and it brings exactly the
    // `delivered` receipt and the downlink batch, each once.
    let (mut b, ack) = access
        .try_connect(ferry.south_port, "rs-b", kept_session(&access, "rs-b"))
        .await
        .unwrap_or_else(|e| panic!("B resumes: {e}\n{}", ferry.log_tail()));
    assert_eq!(ack.code, ConnectReturnCode::Success);
    assert!(ack.session_present, "B's session outlived W's tries");
    let mut got: Vec<(String, Value)> = Vec::new();
    let mut confirm = None;
    b.read_publishes(SECS_30, |p| {
        let body = receipt(p);
        if p.topic == bt.inbox() {
            confirm = body["messages"][0]["seq"].as_u64();
        }
        got.push((p.topic.clone(), body));
        confirm.is_some() && got.len() >= 2
    })
    .await;
    // Confirmed at once, so that no resend after the confirm timeout
    // counts as a second copy; then anything else queued would have come.
    if let Some(upto) = confirm {
        let c = b.publish(&bt.confirm(), json!({"upto": upto}).to_string());
        b.send(c).await;
    }
    b.read_publishes(Duration::from_secs(1), |p| {
        got.push((p.topic.clone(), receipt(p)));
        false
    })
    .await;
    let delivered = json!({"topic": bt.ack(), "msg_id": up_id, "status": "delivered"});
    let batch = json!({"topic": bt.inbox(), "msg_ids": [down_id]});
    let seen: Vec<Value> = got
        .iter()
        .map(|(topic, body)| {
            if *topic == bt.inbox() {
                let ids: Vec<&Value> = body["messages"]
                    .as_array()
                    .map(|m| m.iter().map(|m| &m["msg_id"]).collect())
                    .unwrap_or_default();
                json!({"topic": topic, "msg_ids": ids})
            } else {
                json!({"topic": topic, "msg_id": body["msg_id"], "status": body["status"]})
            }
        })
        .collect();
    assert_eq!(
        seen,
        vec![delivered.clone(), batch.clone()],
        "B got its own queued messages, once each, nothing forged\n{}",
        ferry.log_tail()
    );
    eventually(SECS_30, "B's confirm moved its cursor", || {
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = 'rs-b'",
            [],
        ) == confirm.map_or(0, |c| c as i64)
    })
    .await;
    let north = backend.drain_for(Duration::from_millis(300)).await;
    assert!(
        north.iter().all(|m| m.device() != "rs-b"),
        "the backend saw nothing more as B: {north:?}"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'rs-b'", []),
        1
    );
}

/// A CONNECT for `device` that asks to keep its session.
fn kept_session(access: &Access, device: &str) -> rumqttc::Connect {
    let mut connect = access.connect_packet(device);
    connect.clean_session = false;
    connect
}

/// How W tries to connect as B, by mode: with its own login or B's name
/// and W's password, or B's id under W's certificate; each with a clean
/// session. Without credentials a client id is who a device is, so there
/// is nothing to refuse.
fn impersonations(access: &Access) -> Vec<(&'static str, rumqttc::Connect)> {
    let as_b = |login: Option<(&str, String)>| {
        let mut connect = rumqttc::Connect::new("rs-b");
        connect.keep_alive = 30;
        connect.clean_session = true;
        if let Some((user, password)) = login {
            connect.set_login(user, password);
        }
        connect
    };
    match access.mode {
        AuthMode::Anonymous => Vec::new(),
        AuthMode::Password => vec![
            ("W's login", as_b(Some(("rs-w", Access::password("rs-w"))))),
            (
                "W's password",
                as_b(Some(("rs-b", Access::password("rs-w")))),
            ),
            ("no login", as_b(None)),
        ],
        AuthMode::Certificate => vec![("W's certificate", as_b(None))],
    }
}

/// A publish's body as JSON (`Null` if it is not).
fn receipt(p: &rumqttc::Publish) -> Value {
    serde_json::from_slice(&p.payload).unwrap_or(Value::Null)
}
