//! The uplink and isolation at every protocol level the embedded broker
//! speaks (MQTT 3.1, 3.1.1 and 5), with bare clients that send exactly
//! what they are told (`support::any_version`). The same rules hold for
//! all three: every uplink is `stored` once, in order, and reaches the
//! backend as the device's; a resend is answered with its original `seq`;
//! a publish on another device's topic is `rejected` (`unauthorized`) and
//! reaches no one; a subscription to another device's topic is refused.
//! The downlink's matrix is `downlink::versions`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::any_version::{AnyDevice, Level};
use crate::support::{Backend, Ferry, FerryOpts, Mosquitto};

const SECS_10: Duration = Duration::from_secs(10);

fn envelope(msg_id: &str, n: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({"msg_id": msg_id, "payload": {"n": n}})).unwrap()
}

/// Receipts until `n` of them came (or 10 s passed).
async fn receipts(dev: &mut AnyDevice, n: usize) -> Vec<Value> {
    let mut all = Vec::new();
    while all.len() < n {
        let Some((_, body)) = dev.next_message(SECS_10).await else {
            break;
        };
        all.push(serde_json::from_slice(&body).unwrap());
    }
    all
}

async fn uplinks_are_stored_once_in_order_and_a_resend_is_answered(level: Level) {
    const N: u64 = 20;
    let name = format!("{level:?}").to_lowercase();
    let device = format!("up-{name}");
    let mq = Mosquitto::start();
    let gateway = format!("gw-up-{name}");
    let ferry = Ferry::start(FerryOpts::new(&gateway, mq.port));
    let mut backend = Backend::connect(mq.port, &gateway).await;
    let mut dev = AnyDevice::connect(level, ferry.south_port, &device).await;
    assert_eq!(
        dev.subscribe(&[format!("devices/{device}/ack")]).await,
        [true]
    );
    let topic = format!("devices/{device}/up/line/temp");
    for i in 1..=N {
        dev.publish(&topic, envelope(&format!("u-{i:02}"), i)).await;
    }
    // A resend of the fifth.
    dev.publish(&topic, envelope("u-05", 5)).await;
    let got = receipts(&mut dev, N as usize + 1).await;
    assert_eq!(got.len(), N as usize + 1, "{level:?}: {got:?}");
    let stored: Vec<(String, u64)> = got
        .iter()
        .filter(|r| r["status"] == "stored")
        .map(|r| {
            (
                r["msg_id"].as_str().unwrap().to_string(),
                r["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut expected: Vec<(String, u64)> = (1..=N).map(|i| (format!("u-{i:02}"), i)).collect();
    expected.push(("u-05".into(), 5));
    assert_eq!(
        stored, expected,
        "{level:?}: stored in order, the resend answered"
    );

    let north = backend
        .messages_until(SECS_10, |all| all.len() >= N as usize)
        .await;
    let north: Vec<_> = north
        .into_iter()
        .chain(backend.drain_for(Duration::from_millis(300)).await)
        .collect();
    let seen: Vec<(String, String, Option<u64>)> = north
        .iter()
        .map(|m| (m.device().to_string(), m.msg_id().to_string(), m.seq()))
        .collect();
    let want: Vec<(String, String, Option<u64>)> = (1..=N)
        .map(|i| (device.clone(), format!("u-{i:02}"), Some(i)))
        .collect();
    assert_eq!(
        seen, want,
        "{level:?}: each once, in order, as the device's"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink", []),
        N as i64,
        "{level:?}: stored once each"
    );
}

async fn a_device_is_held_to_its_own_topics(level: Level) {
    let name = format!("{level:?}").to_lowercase();
    let (me, other) = (format!("iso-{name}"), format!("iso-{name}-b"));
    let mq = Mosquitto::start();
    let gateway = format!("gw-iso-{name}");
    let ferry = Ferry::start(FerryOpts::new(&gateway, mq.port));
    let mut backend = Backend::connect(mq.port, &gateway).await;
    let mut dev = AnyDevice::connect(level, ferry.south_port, &me).await;
    let granted = dev
        .subscribe(&[
            format!("devices/{me}/ack"),
            format!("devices/{other}/ack"),
            format!("devices/{other}/inbox"),
            "devices/+/ack".to_string(),
            "#".to_string(),
        ])
        .await;
    assert_eq!(granted, [true, false, false, false, false], "{level:?}");
    for kind in ["up/t", "confirm", "nack", "status"] {
        let forged = format!("devices/{other}/{kind}");
        dev.publish(&forged, envelope(&format!("forged-{kind}"), 1))
            .await;
    }
    let got = receipts(&mut dev, 4).await;
    assert_eq!(got.len(), 4, "{level:?}: every forgery answered: {got:?}");
    for r in &got {
        assert_eq!(r["status"], "rejected", "{level:?}: {r}");
        let reason = r["reason"].as_str().unwrap();
        assert!(reason.starts_with("unauthorized"), "{level:?}: {r}");
    }
    let north = backend.drain_for(Duration::from_millis(500)).await;
    assert!(
        north.iter().all(|m| m.device() != other),
        "{level:?}: nothing reached the backend as {other}"
    );
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM uplink", []), 0);
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        4,
        "{level:?}: each kept as a dead letter"
    );
}

macro_rules! at_every_level {
    ($case:ident) => {
        mod $case {
            use super::Level;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mqtt_31() {
                super::$case(Level::V31).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mqtt_311() {
                super::$case(Level::V311).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mqtt_5() {
                super::$case(Level::V5).await;
            }
        }
    };
}

at_every_level!(uplinks_are_stored_once_in_order_and_a_resend_is_answered);
at_every_level!(a_device_is_held_to_its_own_topics);
