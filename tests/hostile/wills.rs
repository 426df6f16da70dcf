//! A last will obeys the rules a publish does. A CONNECT whose will is on
//! a topic the client may not publish on (another device's `up`, `ack`,
//! `inbox`, `confirm`, `read`, `nack`, `pull` or `status`, or anything
//! outside the device topics) is refused with CONNACK 5 and a log line
//! naming the client and the topic; nothing of it reaches the backend or
//! the victim, or moves any state, in every auth mode. A will on the
//! device's own topics is accepted and published when it drops.

use std::time::Duration;

use ferry::client::backend::{BackendClient, BackendOptions};
use rumqttc::{ConnectReturnCode, LastWill, QoS};
use serde_json::json;

use crate::support::access::{Access, AuthMode};
use crate::support::{boot_id, device_topics, logged, Backend, Ferry, FerryOpts, Mosquitto};

const SECS_30: Duration = Duration::from_secs(30);

each_auth_mode!(a_will_on_a_topic_the_device_may_not_publish_on_refuses_the_connect);

async fn a_will_on_a_topic_the_device_may_not_publish_on_refuses_the_connect(mode: AuthMode) {
    let access = Access::new(mode);
    let mq = Mosquitto::start();
    let gw = "gw-wills";
    let ferry = Ferry::start(access.opts(FerryOpts::new(gw, mq.port), &["will-w", "will-b"]));
    let mut backend = Backend::connect_auto_ack(mq.port, gw).await;
    let mut opts = BackendOptions::new("127.0.0.1", mq.port, gw);
    opts.client_id = "wills-downlinks".into();
    let downlinks = BackendClient::connect(opts);
    let boot = boot_id();

    // B is connected, reads its ack and inbox, and has a downlink in flight
    // that it has not confirmed.
    let bt = device_topics("will-b");
    let mut b = access
        .connect(ferry.south_port, "will-b", access.connect_packet("will-b"))
        .await;
    b.subscribe(&[bt.ack(), bt.inbox()]).await;
    downlinks.send_down(
        &["will-b"],
        json!({"msg_id": format!("{boot}-down"), "payload": 1}),
    );
    let batch = b.read_publishes(SECS_30, |p| p.topic == bt.inbox()).await;
    assert!(batch, "B got its downlink batch\n{}", ferry.log_tail());

    // W tries a will on each of B's topics, and on topics outside the
    // device topics, and drops its socket without DISCONNECT each time.
    let forged_up = json!({"msg_id": format!("{boot}-forged"), "payload": 1}).to_string();
    let mut wills: Vec<(String, String)> = crate::support::forgeries(&bt, forged_up, "forged-by-w");
    wills.push((format!("ferry/{gw}/ack"), "{}".into()));
    wills.push(("elsewhere/anything".into(), "{}".into()));
    // Refusals are logged one by one up to the address's budget a minute
    // (these are the test's only ones from 127.0.0.1), then summarised;
    // every one is counted.
    let budget = rumqttd::refusals::PER_WINDOW as usize;
    for (i, (topic, body)) in wills.iter().enumerate() {
        let mut connect = access.connect_packet("will-w");
        connect.last_will = Some(LastWill::new(topic, body.clone(), QoS::AtLeastOnce, false));
        let got = access
            .try_connect(ferry.south_port, "will-w", connect)
            .await;
        match got {
            Ok((raw, ack)) => {
                assert_eq!(
                    ack.code,
                    ConnectReturnCode::NotAuthorized,
                    "a will on {topic} ({mode:?})"
                );
                drop(raw);
            }
            Err(e) => panic!("a will on {topic} ({mode:?}): {e}"),
        }
        if i < budget {
            assert!(
                ferry.log().lines().any(|l| l.contains("will_refused")
                    && l.contains("will-w")
                    && l.contains(topic.as_str())),
                "the refusal of a will on {topic} is logged with the client and the topic\n{}",
                ferry.log_tail()
            );
        }
    }

    // Nothing of it reached anyone or moved anything.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let north = backend.drain_for(Duration::from_millis(300)).await;
    assert!(
        north.iter().all(|m| m.device() != "will-b"),
        "the backend saw nothing as B: {north:?}"
    );
    let forged = b.read_publishes(Duration::from_millis(300), |_| true).await;
    assert!(!forged, "B got nothing forged");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'will-b'", []),
        0
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = 'will-b'",
            []
        ),
        0,
        "no will moved B's cursor"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        0,
        "no will dead-lettered B's downlink or anything else"
    );
    assert_eq!(
        logged(&ferry.log(), "will_refused", "will-w"),
        wills.len().min(budget),
        "one line per refused will, within the address's budget\n{}",
        ferry.log_tail()
    );
    assert_eq!(
        ferry.metrics().value("ferry_broker_wills_refused_total"),
        wills.len() as f64,
        "every refused will counted"
    );

    // W's own wills work: `online: false` on its own status is accepted
    // and published, and a will on its own `up` is stored and delivered as
    // W's.
    let wt = device_topics("will-w");
    let mut connect = access.connect_packet("will-w");
    connect.last_will = Some(LastWill::new(
        wt.status(),
        r#"{"online":false}"#,
        QoS::AtLeastOnce,
        false,
    ));
    drop(access.connect(ferry.south_port, "will-w", connect).await);
    // Published when W drops, it reaches the downlink as W's own status.
    // `online: false` there forgets W, as the broker's own word that W's
    // connection is gone already did, so nothing tells the two apart; a
    // status the downlink cannot read is logged with the device it came
    // from, which shows the will published and taken as W's.
    let mut connect = access.connect_packet("will-w");
    connect.last_will = Some(LastWill::new(
        wt.status(),
        r#"{"online":"unreadable-will"}"#,
        QoS::AtLeastOnce,
        false,
    ));
    drop(access.connect(ferry.south_port, "will-w", connect).await);
    crate::support::receipts::eventually(SECS_30, "W's own status will read as W's", || {
        logged(&ferry.log(), "device_control_malformed", "device=will-w") == 1
    })
    .await;
    let own = format!("{boot}-own-will");
    let mut connect = access.connect_packet("will-w");
    connect.last_will = Some(LastWill::new(
        wt.up("t"),
        json!({"msg_id": own, "payload": 1}).to_string(),
        QoS::AtLeastOnce,
        false,
    ));
    drop(access.connect(ferry.south_port, "will-w", connect).await);
    let got = backend
        .messages_until(SECS_30, |m| m.iter().any(|m| m.msg_id() == own))
        .await;
    let will = got.iter().find(|m| m.msg_id() == own);
    assert!(
        will.is_some_and(|m| m.device() == "will-w"),
        "W's own will reached the backend as W: {got:?}\n{}",
        ferry.log_tail()
    );
}
