//! No single peer can stall, starve or silently lose: each test plays one
//! hostile or clumsy peer (a device, the backend, the upstream broker, the
//! disk) against the real `ferry` binary and a real Mosquitto, and checks
//! that it is answered while everyone else's traffic flows.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{boot_id, north_connects, Backend, Device, Ferry, FerryOpts, Mosquitto};
use serde_json::{json, Value};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);
const SECS_60: Duration = Duration::from_secs(60);

fn status(r: &Value) -> &str {
    r["status"].as_str().unwrap_or("")
}

/// Distinct msg_ids with `wanted` status among `receipts`.
fn ids_with(receipts: &[Value], wanted: &str) -> HashSet<String> {
    receipts
        .iter()
        .filter(|r| status(r) == wanted)
        .filter_map(|r| r["msg_id"].as_str().map(str::to_string))
        .collect()
}

/// Publishes `n` envelopes `{boot}-{tag}-{i}`; returns their ids.
async fn publish_many(device: &Device, boot: &str, tag: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("{boot}-{tag}-{i}");
        device.publish_envelope("t", &id, json!({"i": i})).await;
        ids.push(id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_or_a_65000_byte_stream_is_rejected_at_intake_and_the_link_stays_up() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-poison-topic", mq.port));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-poison-topic").await;
    let mut evil = Device::connect(ferry.south_port, "evil").await;
    let mut good = Device::connect(ferry.south_port, "good").await;
    let boot = boot_id();

    let long = "x".repeat(65_000);
    for (stream, why) in [
        ("a\0b", "a NUL byte"),
        (long.as_str(), "a 65,000-byte level"),
    ] {
        let id = format!("{boot}-{}", stream.len());
        let body = serde_json::to_vec(&json!({"msg_id": id, "payload": 1})).unwrap();
        evil.publish_raw(&format!("devices/evil/up/{stream}"), body)
            .await;
        let (r, _) = evil.next_receipt_for(&id, SECS_10).await;
        let r = r.unwrap_or_else(|| panic!("{why}: no receipt"));
        assert_eq!(status(&r), "rejected", "{why}: {r}");
        assert!(
            r["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("bad_topic: bad stream"),
            "{why}: {r}"
        );
        assert!(r["dead_letter"].as_i64().is_some(), "{why}: {r}");
    }
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'evil'", []),
        0,
        "nothing north can never publish is stored"
    );

    let ids = publish_many(&good, &boot, "g", 20).await;
    let got = good
        .receipts_until(SECS_30, |all| ids_with(all, "delivered").len() == 20)
        .await;
    assert_eq!(ids_with(&got, "delivered").len(), ids.len(), "{got:?}");
    let north = backend.drain_for(Duration::from_millis(300)).await;
    assert!(north.iter().all(|m| m.device() == "good"), "{north:?}");
    assert_eq!(
        north_connects(&ferry.log()),
        1,
        "the north link never dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_upstream_drops_the_link_on_is_dead_lettered_while_another_device_flows() {
    // The upstream takes no packet over 20,000 bytes: it closes the
    // connection of whoever sends one.
    let mq = Mosquitto::start_with(&["max_packet_size 20000"]);
    let attempts = 3;
    let ferry = Ferry::start(FerryOpts {
        retry_max_attempts: attempts,
        retry_base_ms: 100,
        retry_max_ms: 400,
        ..FerryOpts::new("gw-poison", mq.port)
    });
    let _backend = Backend::connect_auto_ack(mq.port, "gw-poison").await;
    let mut big = Device::connect(ferry.south_port, "big").await;
    let mut small = Device::connect(ferry.south_port, "small").await;
    let boot = boot_id();

    let mut ids = publish_many(&small, &boot, "before", 25).await;
    let poison = format!("{boot}-poison");
    big.publish_envelope("t", &poison, json!("p".repeat(30_000)))
        .await;
    ids.extend(publish_many(&small, &boot, "after", 25).await);

    let seen = big
        .receipts_until(SECS_60, |all| {
            all.iter()
                .any(|r| r["msg_id"] == poison && status(r) == "failed")
        })
        .await;
    let mine: Vec<_> = seen.iter().filter(|r| r["msg_id"] == poison).collect();
    let Some(failed) = mine.iter().find(|r| status(r) == "failed") else {
        panic!(
            "the poison message was never dead-lettered: {seen:?}\n{}",
            ferry.log_tail()
        );
    };
    assert_eq!(status(mine[0]), "stored", "stored first: {mine:?}");
    assert_eq!(status(failed), "failed", "{failed}");
    let reason = failed["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with(&format!("exhausted: {attempts} attempts"))
            && reason.contains("closed the connection on this message"),
        "{reason}"
    );
    let (dl_attempts, dl_reason): (i64, String) = ferry
        .db()
        .query_row(
            "SELECT attempts, reason FROM dead_letter WHERE msg_id = ?1",
            [&poison],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("a dead-letter row for the poison message");
    assert_eq!(dl_attempts, attempts as i64);
    assert_eq!(dl_reason, reason);

    let got = small
        .receipts_until(SECS_60, |all| ids_with(all, "delivered").len() == ids.len())
        .await;
    assert_eq!(
        ids_with(&got, "delivered").len(),
        ids.len(),
        "every message of the other device is delivered"
    );
    // One drop finds the suspect, each further one is a counted attempt;
    // the link is never in a tight loop.
    let connects = north_connects(&ferry.log());
    assert!(
        (2..=attempts as usize + 3).contains(&connects),
        "{connects} north connections"
    );

    // After the dead letter the link comes back once and stays up.
    let later = publish_many(&small, &boot, "later", 5).await;
    let got = small
        .receipts_until(SECS_30, |all| {
            ids_with(all, "delivered").len() == later.len()
        })
        .await;
    assert_eq!(ids_with(&got, "delivered").len(), later.len());
    let settled = north_connects(&ferry.log());
    let last = publish_many(&small, &boot, "last", 5).await;
    let got = small
        .receipts_until(SECS_30, |all| {
            ids_with(all, "delivered").len() == last.len()
        })
        .await;
    assert_eq!(ids_with(&got, "delivered").len(), last.len());
    assert_eq!(north_connects(&ferry.log()), settled, "no more drops");
}
