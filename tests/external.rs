//! External mode only: ferry as a client of a site Mosquitto set up as
//! docs/EXTERNAL.md says (persistence, a password file for ferry, the
//! `pattern` ACL on client ids). What the site broker adds to the story:
//! it restarts under ferry, it holds what devices send while ferry is
//! stopped, and it keeps devices apart.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
use ferry::protocol::receipt::ReceiptStatus;
use serde_json::{json, Value};

use ferry::client::backend::{BackendClient, BackendOptions};

use crate::support::forgeries;
use crate::support::receipts::{eventually, status};
use crate::support::{
    boot_id, device_topics, Backend, BareClient, Device, Ferry, FerryOpts, Mode, Mosquitto, RawMqtt,
};

const SECS_30: Duration = Duration::from_secs(30);
const SECS_60: Duration = Duration::from_secs(60);

fn external(gateway: &str, north_port: u16) -> Ferry {
    Ferry::start(FerryOpts::new(gateway, north_port).in_mode(Mode::External))
}

/// Final receipts (`delivered`) a device client saw, by msg_id, until
/// `want` of them or the deadline.
async fn delivered(device: &mut DeviceClient, want: usize, timeout: Duration) -> HashSet<String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut done = HashSet::new();
    while done.len() < want {
        match tokio::time::timeout_at(deadline, device.events.recv()).await {
            Ok(Some(DeviceEvent::Receipt(r))) if r.status == ReceiptStatus::Delivered => {
                done.extend(r.msg_id.map(|m| m.to_string()));
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_site_broker_restarted_mid_traffic_loses_nothing_and_stores_nothing_twice() {
    let mq = Mosquitto::start();
    let mut ferry = external("gw-ext-bounce", mq.port);
    let _backend = Backend::connect_auto_ack(mq.port, "gw-ext-bounce").await;
    let boot = boot_id();
    let per_device = 150;

    let mut devices = Vec::new();
    for d in 0..3 {
        let mut opts = DeviceOptions::new("127.0.0.1", ferry.south_port, format!("bounce-{d}"));
        opts.resend_after = Duration::from_millis(500);
        let mut device = DeviceClient::connect(opts);
        match tokio::time::timeout(SECS_30, device.events.recv()).await {
            Ok(Some(DeviceEvent::Connected)) => {}
            other => panic!("device bounce-{d} did not connect: {other:?}"),
        }
        devices.push(device);
    }
    // Half of each device's messages, then the site broker goes down
    // (persistence on, as docs/EXTERNAL.md asks) while the rest are sent.
    for (d, device) in devices.iter().enumerate() {
        for i in 0..per_device / 2 {
            device
                .send("t", &format!("{boot}-{d}-{i:04}"), json!(i))
                .expect("valid id");
        }
    }
    let site = ferry
        .site
        .as_mut()
        .expect("external mode has a site broker");
    site.stop();
    for (d, device) in devices.iter().enumerate() {
        for i in per_device / 2..per_device {
            device
                .send("t", &format!("{boot}-{d}-{i:04}"), json!(i))
                .expect("valid id");
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    site.restart();

    for (d, device) in devices.iter_mut().enumerate() {
        let got = delivered(device, per_device, SECS_60).await;
        assert_eq!(
            got.len(),
            per_device,
            "device bounce-{d}: {} of {per_device} delivered\n{}",
            got.len(),
            ferry.log_tail()
        );
    }
    for d in 0..3 {
        let device = format!("bounce-{d}");
        assert_eq!(
            ferry.query_i64(
                "SELECT COUNT(*) FROM uplink WHERE device = ?1",
                [device.as_str()]
            ),
            per_device as i64,
            "{device}: every message stored once"
        );
        assert_eq!(
            ferry.query_i64(
                "SELECT COUNT(DISTINCT seq) FROM uplink WHERE device = ?1 AND seq BETWEEN 1 AND ?2",
                rusqlite::params![device, per_device as i64]
            ),
            per_device as i64,
            "{device}: seqs 1..={per_device}, no gap"
        );
    }
    let ups = ferry.log().matches("south link up").count();
    assert!(ups >= 2, "ferry reconnected to the site broker ({ups} ups)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_devices_publish_while_ferry_is_stopped_are_stored_and_delivered_after_it_starts()
{
    let mq = Mosquitto::start();
    let mut ferry = external("gw-ext-away", mq.port);
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-ext-away").await;
    let mut device = Device::connect(ferry.south_port, "away-1").await;
    let boot = boot_id();

    // ferry is gone (SIGKILL: nothing on its way out); the site broker
    // PUBACKs the device and keeps the messages for ferry's session.
    ferry.kill();
    let ids = device.publish_many("t", &boot, "a", 40).await;
    assert!(
        device
            .receipts_until(Duration::from_millis(500), |r| !r.is_empty())
            .await
            .is_empty(),
        "nobody answers while ferry is stopped"
    );
    assert_eq!(device.subacks(), 1, "the device never noticed ferry leave");

    ferry.restart();
    let got = device
        .receipts_until(SECS_30, |all| {
            all.iter().filter(|r| status(r) == "delivered").count() >= ids.len()
        })
        .await;
    let stored: HashMap<&str, u64> = got
        .iter()
        .filter(|r| status(r) == "stored")
        .map(|r| (r["msg_id"].as_str().unwrap(), r["seq"].as_u64().unwrap()))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            stored.get(id.as_str()),
            Some(&(i as u64 + 1)),
            "{id} stored with seq {} in publish order",
            i + 1
        );
    }
    let north = backend
        .messages_until(SECS_30, |m| m.len() >= ids.len())
        .await;
    let seqs: Vec<u64> = north.iter().filter_map(|m| m.seq()).collect();
    assert_eq!(
        seqs,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "the backend got each once, in order"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE state = 'delivered'", []),
        ids.len() as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_site_brokers_acl_keeps_a_device_out_of_another_devices_topics() {
    // The site as docs/EXTERNAL.md sets it up in full: devices log in, the
    // username is the client id, and the ACL holds each to its topics.
    let mq = Mosquitto::start();
    let ferry = Ferry::start(
        FerryOpts::new("gw-ext-acl", mq.port)
            .in_mode(Mode::External)
            .with_passwords(&[("victim", "pw-victim"), ("intruder", "pw-intruder")]),
    );
    let _backend = Backend::connect_auto_ack(mq.port, "gw-ext-acl").await;
    let mut opts = BackendOptions::new("127.0.0.1", mq.port, "gw-ext-acl");
    opts.client_id = "ext-acl-downlinks".into();
    let downlinks = BackendClient::connect(opts);
    let boot = boot_id();

    // A stranger and a wrong password are refused by the site broker.
    for login in [None, Some(("intruder", "wrong"))] {
        let code = match RawMqtt::try_connect_login(ferry.south_port, "intruder", 30, login).await {
            Ok((_, ack)) => ack.code,
            Err(_) => rumqttc::ConnectReturnCode::NotAuthorized,
        };
        assert_ne!(code, rumqttc::ConnectReturnCode::Success, "{login:?}");
    }

    // The victim has a downlink batch outstanding, unconfirmed.
    let vt = device_topics("victim");
    let mut victim =
        BareClient::connect(ferry.south_port, "victim", vec![vt.ack(), vt.inbox()]).await;
    victim.publish(&vt.status(), r#"{"online":true}"#).await;
    downlinks.send_down(
        &["victim"],
        json!({"msg_id": format!("{boot}-down"), "payload": 1}),
    );
    let batch = victim.next_json(SECS_30).await.expect("the victim's batch");
    assert_eq!(
        batch["messages"].as_array().map_or(0, Vec::len),
        1,
        "{batch}"
    );

    // The intruder, logged in as itself, tries every one of the victim's
    // topics, and to read them.
    let attempts = forgeries(
        &vt,
        json!({"msg_id": format!("{boot}-forged"), "payload": 1}).to_string(),
        &format!("{boot}-real"),
    );
    // Each on a connection of its own: Mosquitto may close the one that
    // tried a denied topic.
    for (topic, body) in &attempts {
        let mut forger = RawMqtt::connect(ferry.site.as_ref().unwrap().port, "intruder", 30).await;
        let packet = forger.publish(topic, body.to_string());
        forger.send(packet).await;
        let _ = forger.recv(Duration::from_millis(200)).await;
    }

    // And as its last will on each, its socket then dropped without a
    // DISCONNECT: the site ACL holds wills to the same topics.
    for (topic, body) in &attempts {
        let mut connect = rumqttc::Connect::new("intruder");
        connect.keep_alive = 30;
        connect.set_login("intruder", "pw-intruder");
        connect.last_will = Some(rumqttc::LastWill::new(
            topic,
            body.clone(),
            rumqttc::QoS::AtLeastOnce,
            false,
        ));
        let site = ferry.site.as_ref().unwrap().port;
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", site))
            .await
            .expect("tcp to the site broker");
        drop(RawMqtt::try_connect_packet(Box::new(stream), connect).await);
    }

    // Then it subscribes to them (after the forgeries: the site broker
    // takes a second connection of one client id over).
    let mut intruder = RawMqtt::connect(ferry.south_port, "intruder", 30).await;
    let codes = intruder
        .subscribe(&[
            vt.ack(),
            vt.inbox(),
            "devices/#".into(),
            "devices/+/ack".into(),
        ])
        .await;

    // The victim's own message flows, and nothing forged reached it.
    let real = format!("{boot}-real");
    victim
        .publish(
            &vt.up("t"),
            json!({"msg_id": real, "payload": 1}).to_string(),
        )
        .await;
    let mut seen = Vec::new();
    while !seen.iter().any(|r: &Value| status(r) == "delivered") {
        match victim.next_json(SECS_30).await {
            Some(r) => seen.push(r),
            None => panic!("the victim's own uplink was not delivered: {seen:?}"),
        }
    }
    assert!(
        seen.iter().all(|r| r["msg_id"] == json!(real)),
        "only its own receipts: {seen:?}"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink", []),
        1,
        "nothing forged stored"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = 'victim'",
            []
        ),
        0,
        "the forged confirm did not move the victim's cursor"
    );

    // Mosquitto grants a SUBSCRIBE its ACL denies (its default ACL checks
    // `read` when delivering, not when subscribing: docs/SECURITY.md), so
    // what counts is that nothing was delivered on it.
    assert_eq!(codes.len(), 4, "{codes:?}");
    let mut leaked = Vec::new();
    intruder
        .read_publishes(Duration::from_millis(500), |p| {
            leaked.push(p.topic.clone());
            false
        })
        .await;
    assert!(leaked.is_empty(), "the intruder read {leaked:?}");
    assert!(
        !intruder.closed_within(Duration::from_millis(100)).await,
        "the intruder was still connected, so it could have read"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_mid_stream_acknowledges_only_what_was_committed_and_the_rest_comes_after_restart(
) {
    let mq = Mosquitto::start();
    let mut ferry = external("gw-ext-term", mq.port);
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-ext-term").await;
    let mut device = Device::connect(ferry.south_port, "term-1").await;
    let boot = boot_id();
    let n = 5000;
    let publisher = {
        let (client, topic, boot) = (device.client(), device.up_topic("t"), boot.clone());
        tokio::spawn(async move {
            for i in 0..n {
                let body = json!({"msg_id": format!("{boot}-{i:04}"), "payload": i});
                assert!(
                    client
                        .publish(topic.as_str(), serde_json::to_vec(&body).unwrap())
                        .await
                );
            }
        })
    };
    // Mid-stream: some stored, more on their way through the site broker.
    let early = device
        .receipts_until(SECS_30, |r| {
            r.iter().filter(|r| status(r) == "stored").count() >= 50
        })
        .await;
    assert!(
        early.len() >= 50,
        "receipts before SIGTERM: {}",
        early.len()
    );
    let exit = ferry.terminate_status(Duration::from_secs(15));
    assert!(
        exit.is_some_and(|s| s.success()),
        "exit 0 on SIGTERM ({exit:?})\n{}",
        ferry.log_tail()
    );
    publisher.await.unwrap();
    let committed_at_exit = ferry.query_i64("SELECT COUNT(*) FROM uplink", []);
    assert!(
        committed_at_exit < n as i64,
        "the test stops ferry mid-stream ({committed_at_exit} of {n} stored)"
    );

    // What ferry did not acknowledge, the site broker kept for it.
    ferry.restart();
    let north = backend
        .messages_until(SECS_60, |m| {
            m.iter()
                .map(|m| m.msg_id().to_string())
                .collect::<HashSet<_>>()
                .len()
                >= n
        })
        .await;
    let ids: HashSet<&str> = north.iter().map(|m| m.msg_id()).collect();
    assert_eq!(ids.len(), n, "every message reached the backend");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink", []),
        n as i64,
        "each stored once"
    );
    assert_eq!(
        ferry.query_i64("SELECT MAX(seq) FROM uplink", []),
        n as i64,
        "seqs 1..={n} in publish order, none skipped"
    );
}

/// `n` QoS 1 uplinks `{boot}-{tag}{i:04}` from `raw`'s device, in one
/// write; returns once the site broker has PUBACKed every one (it holds
/// them, for ferry's session), with the receipts that came meanwhile (a
/// running ferry answers the first before the broker has acked the last;
/// dropping those made the live flood miss answers at random).
async fn publish_held(
    raw: &mut RawMqtt,
    device: &str,
    boot: &str,
    tag: &str,
    n: usize,
) -> Vec<Value> {
    let up = device_topics(device).up("t");
    let publishes: Vec<_> = (0..n)
        .map(|i| {
            let body = json!({"msg_id": format!("{boot}-{tag}{i:04}"), "payload": i});
            raw.publish(&up, serde_json::to_vec(&body).unwrap())
        })
        .collect();
    raw.send_many(publishes).await;
    let mut acked = 0;
    let mut receipts = Vec::new();
    while acked < n {
        match raw.recv(SECS_30).await {
            Some(rumqttc::Packet::PubAck(_)) => acked += 1,
            Some(rumqttc::Packet::Publish(p)) => {
                raw.send(rumqttc::Packet::PubAck(rumqttc::PubAck::new(p.pkid)))
                    .await;
                receipts.push(serde_json::from_slice(&p.payload).expect("a JSON receipt"));
            }
            Some(_) => {}
            None => panic!("the site broker PUBACKed {acked} of {n}"),
        }
    }
    receipts
}

/// Receipts on `raw`'s subscription, after those already `got`, until `n`
/// distinct msg_ids are answered.
async fn answers(raw: &mut RawMqtt, n: usize, mut got: Vec<Value>) -> Vec<Value> {
    let mut ids: HashSet<String> = got
        .iter()
        .filter_map(|r| r["msg_id"].as_str().map(str::to_string))
        .collect();
    raw.read_publishes(SECS_60, |p| {
        let r: Value = serde_json::from_slice(&p.payload).expect("a JSON receipt");
        ids.extend(r["msg_id"].as_str().map(str::to_string));
        got.push(r);
        ids.len() >= n
    })
    .await;
    let mut by_status: std::collections::BTreeMap<String, usize> = Default::default();
    for r in &got {
        *by_status.entry(r["status"].to_string()).or_default() += 1;
    }
    assert_eq!(
        ids.len(),
        n,
        "answered within 60 s; receipts by status {by_status:?}; the last: {:?}",
        got.last()
    );
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_the_site_broker_held_while_ferry_was_stopped_is_stored_whole_and_a_live_flood_is_still_refused(
) {
    const N: usize = 1000;
    const DEVICE: &str = "backlog-1";
    let mq = Mosquitto::start();
    // ferry's own limits: 200 a second, a burst of 400, 256 in flight.
    let mut ferry = Ferry::start(
        FerryOpts::new("gw-ext-backlog", mq.port)
            .in_mode(Mode::External)
            .with_default_limits(),
    );
    let mut raw = RawMqtt::connect(ferry.south_port, DEVICE, 60).await;
    raw.subscribe(&[device_topics(DEVICE).ack()]).await;
    let boot = boot_id();

    // ferry is stopped; the device sends 1,000, which the site broker keeps.
    assert!(ferry.terminate(Duration::from_secs(15)), "a clean stop");
    let early = publish_held(&mut raw, DEVICE, &boot, "held", N).await;
    assert!(early.is_empty(), "ferry is stopped: {early:?}");
    ferry.restart();
    let got = answers(&mut raw, N, Vec::new()).await;
    let refused: Vec<&Value> = got.iter().filter(|r| status(r) == "rejected").collect();
    assert!(
        refused.is_empty(),
        "{} of the backlog refused, e.g. {:?}",
        refused.len(),
        refused.first()
    );
    assert_eq!(
        got.iter().filter(|r| status(r) == "stored").count(),
        N,
        "each answered `stored`"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = ?1", [DEVICE]),
        N as i64
    );
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []), 0);
    // A quiet second later the burst is over, in one line.
    let taken_line = || {
        ferry
            .log()
            .lines()
            .find(|l| l.contains("event=\"south_backlog_taken\""))
            .map(str::to_string)
    };
    eventually(SECS_30, "a south_backlog_taken line", || {
        taken_line().is_some()
    })
    .await;
    let taken = taken_line().expect("checked");
    assert!(
        taken.contains("ended=\"drained\"") && taken.contains(&format!("messages={N}")),
        "{taken}"
    );

    // The backlog is taken: a device flooding now is the device sending
    // too fast, and is refused as ever.
    let early = publish_held(&mut raw, DEVICE, &boot, "live", N).await;
    let got = answers(&mut raw, N, early).await;
    let rate = got
        .iter()
        .filter(|r| {
            status(r) == "rejected" && r["reason"].as_str().is_some_and(|s| s.starts_with("rate:"))
        })
        .count();
    assert!(
        rate >= N / 4,
        "a live flood of {N} at once is past a burst of 400: {rate} refused"
    );
    assert!(
        log_count(&ferry, "device over south.rate_per_s") >= 1,
        "{}",
        ferry.log_tail()
    );
}

fn log_count(ferry: &Ferry, what: &str) -> usize {
    ferry.log().matches(what).count()
}
