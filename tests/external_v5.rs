//! ferry's MQTT client side over MQTT 5, against real Mosquitto 2.0.11:
//! the external south's session to the site broker
//! (`south.mqtt_version = "5"`), the north session
//! (`north.mqtt_version = "5"`), and the client library's device and
//! backend (`DeviceOptions::v5`, `BackendOptions::v5`). What 5 adds that
//! 3.1.1 cannot say, a broker's refusal of one publish (PUBACK reason
//! code), is a failed attempt of that message and of no other.

use std::collections::HashSet;
use std::time::Duration;

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
use ferry::protocol::receipt::ReceiptStatus;
use serde_json::json;

use crate::support::{boot_id, Backend, Ferry, FerryOpts, Mode, Mosquitto};

const SECS_30: Duration = Duration::from_secs(30);

/// ferry in external mode, MQTT 5 to the site broker and to `north_port`.
fn external_v5(gateway: &str, north_port: u16) -> Ferry {
    Ferry::start(
        FerryOpts::new(gateway, north_port)
            .in_mode(Mode::External)
            .with(|c| {
                c.south.mqtt_version = "5".into();
                c.north.mqtt_version = "5".into();
            }),
    )
}

async fn connected_device(opts: DeviceOptions) -> DeviceClient {
    let id = opts.device.clone();
    let mut device = DeviceClient::connect(opts);
    match tokio::time::timeout(SECS_30, device.events.recv()).await {
        Ok(Some(DeviceEvent::Connected)) => device,
        other => panic!("device {id} did not connect: {other:?}"),
    }
}

/// Receipts with `status` a device saw, by msg_id, until it has `want`
/// ids or the deadline passed.
async fn receipts(
    device: &mut DeviceClient,
    status: ReceiptStatus,
    want: usize,
    timeout: Duration,
) -> HashSet<String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut done = HashSet::new();
    while done.len() < want {
        match tokio::time::timeout_at(deadline, device.events.recv()).await {
            Ok(Some(DeviceEvent::Receipt(r))) if r.status == status => {
                done.extend(r.msg_id.map(|m| m.to_string()));
            }
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    done
}

/// Whether Mosquitto's log says `client_id` connected with MQTT 5.
fn connected_with_v5(broker: &Mosquitto, client_id: &str) -> bool {
    let log = std::fs::read_to_string(broker.log_path()).unwrap_or_default();
    log.contains(&format!("as {client_id} (p5,"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_mode_over_mqtt_5_stores_and_delivers_a_v5_devices_uplinks_and_brings_it_downlinks(
) {
    let gw = "gw-v5-ext";
    let mq = Mosquitto::start();
    let ferry = external_v5(gw, mq.port);
    let mut backend = BackendClient::connect(BackendOptions::new("127.0.0.1", mq.port, gw).v5());
    match tokio::time::timeout(SECS_30, backend.events.recv()).await {
        Ok(Some(BackendEvent::Connected)) => {}
        other => panic!("the backend did not connect: {other:?}"),
    }
    let mut opts = DeviceOptions::new("127.0.0.1", ferry.south_port, "v5-dev-1").v5();
    opts.resend_after = Duration::from_secs(2);
    let mut device = connected_device(opts).await;
    let boot = boot_id();
    let n = 20;
    let ids: HashSet<String> = (0..n).map(|i| format!("{boot}-v5-{i:03}")).collect();
    for id in &ids {
        device.send("t", id, json!({"v": 5})).expect("valid id");
    }

    // The backend acks each uplink as it comes.
    let mut uplinks = HashSet::new();
    let deadline = tokio::time::Instant::now() + SECS_30;
    while uplinks.len() < n {
        match tokio::time::timeout_at(deadline, backend.events.recv()).await {
            Ok(Some(BackendEvent::Uplink(m))) => {
                backend.ack_message(&m);
                uplinks.insert(m.envelope.msg_id.to_string());
            }
            Ok(Some(_)) => {}
            other => panic!(
                "{} of {n} uplinks reached the backend: {other:?}\n{}",
                uplinks.len(),
                ferry.log_tail()
            ),
        }
    }
    assert_eq!(uplinks, ids, "every uplink, once");
    let delivered = receipts(&mut device, ReceiptStatus::Delivered, n, SECS_30).await;
    assert_eq!(
        delivered,
        ids,
        "every uplink delivered\n{}",
        ferry.log_tail()
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM uplink WHERE device = 'v5-dev-1' AND state = 'delivered'",
            []
        ),
        n as i64
    );

    // A downlink reaches the v5 device through the site broker.
    backend.send_down(
        &["v5-dev-1"],
        json!({"msg_id": format!("{boot}-down"), "payload": {"set": 1}}),
    );
    let deadline = tokio::time::Instant::now() + SECS_30;
    let seq = loop {
        match tokio::time::timeout_at(deadline, device.events.recv()).await {
            Ok(Some(DeviceEvent::Inbox { messages, .. })) if !messages.is_empty() => {
                assert_eq!(messages[0].msg_id, format!("{boot}-down"));
                break messages[0].seq;
            }
            Ok(Some(_)) => {}
            other => panic!("no inbox batch: {other:?}\n{}", ferry.log_tail()),
        }
    };
    device.confirm(seq);

    let site = ferry
        .site
        .as_ref()
        .expect("external mode has a site broker");
    assert!(
        connected_with_v5(site, &format!("ferry-{gw}-south")),
        "ferry's south session spoke MQTT 5\n{}",
        site.log_tail()
    );
    assert!(
        connected_with_v5(site, "v5-dev-1"),
        "the device spoke MQTT 5"
    );
    assert!(
        connected_with_v5(&mq, &format!("ferry-{gw}")),
        "ferry's north session spoke MQTT 5"
    );
    assert!(connected_with_v5(&mq, &format!("backend-{gw}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_v5_devices_send_while_ferry_is_stopped_waits_in_its_mqtt_5_session_on_the_site_broker(
) {
    // A v5 session ends with its connection unless it has an expiry: ferry
    // asks for one that never ends, as 3.1.1's clean session off does.
    let gw = "gw-v5-away";
    let mq = Mosquitto::start();
    let mut ferry = external_v5(gw, mq.port);
    let _backend = Backend::connect_auto_ack(mq.port, gw).await;
    let mut opts = DeviceOptions::new("127.0.0.1", ferry.south_port, "v5-away-1").v5();
    opts.resend_after = Duration::from_secs(60);
    let mut device = connected_device(opts).await;
    let boot = boot_id();

    ferry.kill();
    let ids: HashSet<String> = (0..30).map(|i| format!("{boot}-away-{i:03}")).collect();
    for id in &ids {
        device.send("t", id, json!(1)).expect("valid id");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    ferry.restart();

    // No resend within the test (60 s): each came from the site broker's
    // queue for ferry's session.
    let delivered = receipts(&mut device, ReceiptStatus::Delivered, ids.len(), SECS_30).await;
    assert_eq!(delivered, ids, "{}", ferry.log_tail());
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(DISTINCT seq) FROM uplink WHERE device = 'v5-away-1' AND seq BETWEEN 1 AND 30",
            []
        ),
        30,
        "stored once each, seqs 1..=30"
    );
    assert!(
        ferry.log().contains("session_present=true"),
        "ferry found its session on the site broker again\n{}",
        ferry.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uplink_the_upstream_refuses_by_mqtt_5_reason_code_is_dead_lettered_and_others_are_delivered(
) {
    let gw = "gw-v5-deny";
    // The upstream's ACL lets ferry publish anything but one device's
    // uplinks. Over 3.1.1 Mosquitto would PUBACK and drop them in silence.
    let dir = tempfile::tempdir().expect("temp dir");
    let acl = dir.path().join("acl");
    std::fs::write(
        &acl,
        format!("topic readwrite #\ntopic deny ferry/{gw}/up/v5-denied/#\n"),
    )
    .expect("write acl");
    let mq = Mosquitto::start_with(&[&format!("acl_file {}", acl.display())]);
    let ferry =
        Ferry::start(FerryOpts::new(gw, mq.port).with(|c| c.north.mqtt_version = "5".into()));
    let _backend = Backend::connect_auto_ack(mq.port, gw).await;
    let mut denied = connected_device(DeviceOptions::new(
        "127.0.0.1",
        ferry.south_port,
        "v5-denied",
    ))
    .await;
    let mut fine =
        connected_device(DeviceOptions::new("127.0.0.1", ferry.south_port, "v5-fine")).await;
    let boot = boot_id();
    let (no, yes) = (format!("{boot}-no"), format!("{boot}-yes"));
    denied.send("t", &no, json!(1)).expect("valid id");
    fine.send("t", &yes, json!(1)).expect("valid id");

    let delivered = receipts(&mut fine, ReceiptStatus::Delivered, 1, SECS_30).await;
    assert!(delivered.contains(&yes), "{}", ferry.log_tail());
    // Five refused attempts (retry.max_attempts), then the dead letter.
    let failed = receipts(&mut denied, ReceiptStatus::Failed, 1, SECS_30).await;
    assert!(failed.contains(&no), "{}", ferry.log_tail());
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []), 1);

    // Mosquitto 2.0.11 closes a v5 connection right after the PUBACK
    // that refuses a QoS 1 publish (its handler returns the ACL error):
    // each attempt is a refusal, or a drop with that message alone in
    // flight, a failed attempt either way; nothing else is held to it.
    let log = ferry.log();
    assert!(
        log.contains("event=\"link_publish_refused\"") && log.contains("reason=\"not_authorized\""),
        "the refusal is logged with its reason code\n{}",
        ferry.log_tail()
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM uplink WHERE device = 'v5-fine' AND state = 'delivered'",
            []
        ),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uplink_larger_than_the_upstreams_mqtt_5_maximum_packet_size_is_refused_unsent_and_the_link_holds(
) {
    // rumqttc's v5 client fails the whole connection on a publish larger
    // than the CONNACK's maximum packet size; the session refuses it first.
    let gw = "gw-v5-big";
    let mq = Mosquitto::start_with(&["max_packet_size 2000"]);
    let ferry =
        Ferry::start(FerryOpts::new(gw, mq.port).with(|c| c.north.mqtt_version = "5".into()));
    let _backend = Backend::connect_auto_ack(mq.port, gw).await;
    let mut device =
        connected_device(DeviceOptions::new("127.0.0.1", ferry.south_port, "v5-big")).await;
    let boot = boot_id();
    let (big, small) = (format!("{boot}-big"), format!("{boot}-small"));
    device
        .send("t", &big, json!("x".repeat(3000)))
        .expect("valid id");
    device.send("t", &small, json!(1)).expect("valid id");

    let failed = receipts(&mut device, ReceiptStatus::Failed, 1, SECS_30).await;
    assert!(failed.contains(&big), "{}", ferry.log_tail());
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM uplink WHERE device = 'v5-big' AND state = 'delivered'",
            []
        ),
        1,
        "the small one went through\n{}",
        ferry.log_tail()
    );
    let log = ferry.log();
    assert!(
        log.contains("reason=\"packet_too_large\""),
        "{}",
        ferry.log_tail()
    );
    assert_eq!(
        log.matches("event=\"link_down\"").count(),
        0,
        "never written, so never a reason to drop the link\n{}",
        ferry.log_tail()
    );
}
