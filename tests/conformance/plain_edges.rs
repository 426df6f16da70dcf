//! Plain devices (`south.plain_topics`) at the edges of the rules
//! (docs/PROTOCOL.md, "Plain devices"): with logins a client publishes
//! plain only under its own `{device}` level; in external mode the gateway
//! takes plain publishes from the site broker (whose ACL holds devices to
//! their own level, as docs/EXTERNAL.md has it); at the disk budget a
//! plain publish waits, unacknowledged, until there is room.

use std::collections::BTreeSet;
use std::time::Duration;

use rumqttc::Packet;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::plain_sessions::{acks_until, north_by_id, plain_publish, PLAIN};
use super::runner::tool;
use super::Gw;
use crate::support::{Backend, Device, Mode, RawMqtt};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

/// Receipts in a publish on a device's `ack` (one, or a page of them).
fn receipts_in(p: &rumqttc::Publish) -> Vec<Value> {
    match serde_json::from_slice::<Value>(&p.payload) {
        Ok(Value::Array(all)) => all,
        Ok(one) => vec![one],
        Err(e) => panic!("receipt not JSON ({e}): {:?}", p.payload),
    }
}

/// With passwords, press-7 publishes plain on press-8's level: refused
/// `unauthorized` (a `rejected` receipt on its own `ack`, a dead letter
/// under press-7), answered with its PUBACK, and nothing of it is stored
/// for press-8 or goes north. Its publish on its own level, and press-8's
/// on press-8's, are stored under the device the level names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_logins_a_plain_publish_on_another_devices_level_is_refused_unauthorized() {
    let mut gw = Gw::start("gw-plain-auth", |o| {
        o.with(|c| c.south.plain_topics = vec![PLAIN.to_string()])
            .with_passwords(&[("press-7", "pw-press-7"), ("press-8", "pw-press-8")])
    })
    .await;
    let mut p7 = RawMqtt::connect(gw.port(), "press-7", 60).await;
    let codes = p7.subscribe(&["devices/press-7/ack".to_string()]).await;
    assert_eq!(codes.len(), 1, "{codes:?}");
    p7.send(plain_publish("plant/line3/press-8/temp", 1, 78, false))
        .await;
    p7.send(plain_publish("plant/line3/press-7/temp", 2, 77, false))
        .await;
    let mut pubacks = Vec::new();
    let mut receipts = Vec::new();
    let deadline = Instant::now() + SECS_10;
    while pubacks.len() < 2 || receipts.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match p7.recv(left).await {
            Some(Packet::PubAck(a)) => pubacks.push(a.pkid),
            Some(Packet::Publish(p)) => {
                p7.send(Packet::PubAck(rumqttc::PubAck::new(p.pkid))).await;
                receipts.extend(receipts_in(&p));
            }
            Some(_) => {}
            None => panic!(
                "press-7: PUBACKs {pubacks:?}, receipts {receipts:?}\n{}",
                gw.ferry.log_tail()
            ),
        }
    }
    assert_eq!(pubacks, vec![1, 2], "both answered, in order");
    assert_eq!(receipts.len(), 1, "one receipt, the refusal: {receipts:?}");
    let r = &receipts[0];
    assert_eq!(r["status"], "rejected", "{r}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("unauthorized"),
        "{r}"
    );
    assert!(r["dead_letter"].as_i64().is_some(), "{r}");
    assert_eq!(
        gw.ferry.query_i64(
            "SELECT COUNT(*) FROM dead_letter WHERE device = 'press-7' AND reason LIKE 'unauthorized%'",
            []
        ),
        1,
        "the refusal dead-lettered under press-7"
    );

    // press-8 on its own level: taken, so the level itself is a plain one.
    let mut p8 = RawMqtt::connect(gw.port(), "press-8", 60).await;
    p8.send(plain_publish("plant/line3/press-8/temp", 1, 88, false))
        .await;
    let mut acked = BTreeSet::new();
    assert!(
        acks_until(&mut p8, &mut acked, &BTreeSet::from([1]), SECS_10).await,
        "press-8's own publish answered"
    );
    let own7 = north_by_id(&mut gw, "press-7", 1, SECS_30).await;
    let own8 = north_by_id(&mut gw, "press-8", 1, SECS_30).await;
    let values = |m: &std::collections::BTreeMap<String, (u64, u64)>| -> Vec<u64> {
        m.values().map(|(_, i)| *i).collect()
    };
    assert_eq!(values(&own7), vec![77], "press-7 north: {own7:?}");
    assert_eq!(
        values(&own8),
        vec![88],
        "press-8 north: nothing of press-7's"
    );
    let rows = |device: &str| {
        gw.ferry
            .query_i64("SELECT COUNT(*) FROM uplink WHERE device = ?1", [device])
    };
    assert_eq!((rows("press-7"), rows("press-8")), (1, 1), "rows stored");
}

/// External mode: `mosquitto_pub` publishes plain on the site broker
/// (QoS 1, as device press-9 under the ACL's `pattern write
/// plant/+/%c/#`); the gateway, subscribed to the plain filters there,
/// stores it once and the backend gets it once on `up/press-9/plain`. A
/// publish on another device's level is denied by the broker's ACL and
/// never reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_external_mode_a_plain_publish_on_the_site_broker_reaches_the_backend_once() {
    let gateway = "gw-plain-ext";
    let mut gw = Gw::start(gateway, |o| {
        o.in_mode(Mode::External)
            .with(|c| c.south.plain_topics = vec![PLAIN.to_string()])
    })
    .await;
    gw.backend = Backend::connect_auto_ack(gw.mq.port, gateway).await;
    let port = gw.port().to_string();
    let publish = |topic: &'static str, body: &'static str| {
        let port = port.clone();
        async move {
            let args = [
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-i",
                "press-9",
                "-q",
                "1",
                "-t",
                topic,
                "-m",
                body,
            ];
            let (status, out, err) = tool("mosquitto_pub", &args, SECS_10).await;
            assert_eq!(status, Some(0), "mosquitto_pub {topic}: {out}{err}");
        }
    };
    publish("plant/line3/press-10/temp", "{\"i\":10}").await;
    publish("plant/line3/press-9/temp", "{\"i\":9}").await;
    let got = gw
        .backend
        .messages_until(SECS_30, |all| all.iter().any(|m| m.device() == "press-9"))
        .await;
    let m = got
        .iter()
        .find(|m| m.device() == "press-9")
        .unwrap_or_else(|| panic!("nothing north from press-9\n{}", gw.ferry.log_tail()));
    assert!(
        m.topic.ends_with("/up/press-9/plain"),
        "north topic {}",
        m.topic
    );
    assert_eq!(m.body["topic"], "plant/line3/press-9/temp", "{}", m.body);
    assert_eq!(m.body["payload"], json!({ "i": 9 }), "{}", m.body);
    let msg_id = m.msg_id().to_string();
    assert!(msg_id.starts_with("p."), "{msg_id}");
    // Whatever else comes meanwhile: the same message again, or nothing.
    let later = gw.backend.drain_for(Duration::from_secs(2)).await;
    for m in got.iter().chain(&later) {
        assert_eq!(m.device(), "press-9", "only press-9's: {}", m.body);
        assert_eq!(m.msg_id(), msg_id, "one message: {}", m.body);
    }
    assert_eq!(gw.stored("press-9", &msg_id), 1, "stored once");
    assert_eq!(
        gw.ferry.query_i64("SELECT COUNT(*) FROM uplink", []),
        1,
        "nothing else stored"
    );
}

/// At the disk budget (4 MiB, filled by another device's undelivered
/// uplinks until one is refused `disk_budget`), a plain QoS 1 publish is
/// neither refused nor acknowledged: the connection stays open, nothing is
/// stored. Once the backend acks what fills the store (delivered, pruned
/// at the budget) its PUBACK comes on the same connection, and it is
/// stored once and goes north.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_disk_budget_a_plain_publish_waits_unacknowledged_until_there_is_room() {
    let mut gw = Gw::start("gw-plain-budget", |o| {
        o.with(|c| {
            c.south.plain_topics = vec![PLAIN.to_string()];
            c.store.max_db_bytes = 4 << 20;
            // Unacked messages wait for the backend, however long it takes.
            c.retry.max_attempts = 100_000;
        })
    })
    .await;
    let mut filler = Device::connect(gw.port(), "filler-1").await;
    let blob = "x".repeat(50_000);
    let mut stored = Vec::new();
    for i in 0..1000 {
        let id = format!("{}-{i:04}", gw.boot);
        filler
            .publish_envelope("blob", &id, json!({ "blob": blob }))
            .await;
        let (r, _) = filler.next_receipt_for(&id, SECS_10).await;
        let r = r.unwrap_or_else(|| panic!("no receipt for {id}"));
        match r["status"].as_str() {
            Some("stored") => stored.push(id),
            Some("rejected")
                if r["reason"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("disk_budget: ") =>
            {
                break
            }
            _ => panic!("{r}"),
        }
    }
    assert!(!stored.is_empty(), "something stored before the budget");

    let device = "press-5";
    let mut raw = RawMqtt::connect(gw.port(), device, 60).await;
    raw.send(plain_publish("plant/line1/press-5/temp", 1, 5, false))
        .await;
    let mut acked = BTreeSet::new();
    let one = BTreeSet::from([1]);
    assert!(
        !acks_until(&mut raw, &mut acked, &one, Duration::from_secs(2)).await,
        "a plain publish at the budget was acknowledged\n{}",
        gw.ferry.log_tail()
    );
    assert!(acked.is_empty(), "{acked:?}");
    assert_eq!(
        gw.ferry
            .query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'press-5'", []),
        0
    );
    assert_eq!(
        gw.ferry.query_i64(
            "SELECT COUNT(*) FROM dead_letter WHERE device = 'press-5'",
            []
        ),
        0,
        "waiting, not refused"
    );

    for id in &stored {
        gw.backend.ack_ok("filler-1", id).await;
    }
    assert!(
        acks_until(&mut raw, &mut acked, &one, SECS_30).await,
        "no PUBACK once there was room (the connection closed, or 30 s)\n{}",
        gw.ferry.log_tail()
    );
    let north = north_by_id(&mut gw, device, 1, SECS_30).await;
    assert_eq!(north.len(), 1, "{north:?}");
    let (id, (_, i)) = north.iter().next().expect("one");
    assert_eq!(*i, 5);
    assert_eq!(gw.stored(device, id), 1, "{id} stored once");
}
