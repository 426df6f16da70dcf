//! At the disk budget a resend is answered as the duplicate it is, in
//! both directions: an uplink stored and waiting (`stored`, its seq), one
//! delivered and pruned early (`delivered`, its seq), a downlink stored
//! (`stored`, its seq); only what is new is refused `disk_budget`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{reason, receipt};
use crate::support::receipts::eventually;
use crate::support::{self, boot_id, north_topics, Backend, BareClient, Device, Ferry, FerryOpts};

/// The next `n` receipts north for `msg_id`, skipping others (a page of
/// receipts comes as an array).
async fn north_receipts(receipts: &mut BareClient, msg_id: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut got = Vec::new();
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = receipts
            .next_json(left)
            .await
            .unwrap_or_else(|| panic!("no receipt north for {msg_id}: {got:?}"));
        let all = match r {
            Value::Array(v) => v,
            one => vec![one],
        };
        got.extend(all.into_iter().filter(|r| r["msg_id"] == msg_id));
    }
    got
}

async fn north_receipt(receipts: &mut BareClient, msg_id: &str) -> Value {
    north_receipts(receipts, msg_id, 1).await.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_disk_budget_a_resend_is_answered_with_its_receipt_and_seq_both_ways() {
    let mosquitto = support::Mosquitto::start();
    let opts = FerryOpts::new("gw-dup", mosquitto.port).with(|c| {
        c.store.max_db_bytes = 4 << 20;
        // Unacked messages wait for the backend, however long the test takes.
        c.retry.max_attempts = 100_000;
        // A pruned message's key is kept this long, at least.
        c.store.min_dedup_s = 3600;
    });
    let ferry = Ferry::start(opts);
    let backend = Backend::connect(mosquitto.port, "gw-dup").await;
    let mut receipts = BareClient::connect(
        mosquitto.port,
        "dup-receipts",
        vec![north_topics("gw-dup").receipts()],
    )
    .await;
    let mut alerts = BareClient::connect(
        mosquitto.port,
        "dup-alerts",
        vec!["ferry/gw-dup/alerts".to_string()],
    )
    .await;
    let mut device = Device::connect(ferry.south_port, "press-1").await;
    let boot = boot_id();

    // One uplink delivered, one downlink stored.
    let done = format!("{boot}-done");
    device.publish_envelope("t", &done, json!({ "n": 0 })).await;
    let r = receipt(&mut device, &done).await;
    assert_eq!(r["status"], "stored", "{r}");
    let done_seq = r["seq"].clone();
    backend.ack_ok("press-1", &done).await;
    let r = receipt(&mut device, &done).await;
    assert_eq!(r["status"], "delivered", "{r}");
    let down = format!("{boot}-down");
    let body = serde_json::to_vec(&json!({ "msg_id": down, "payload": "shift B" })).unwrap();
    backend
        .publish_raw("ferry/gw-dup/down/panel-1", body.clone())
        .await;
    let r = north_receipt(&mut receipts, &down).await;
    assert_eq!(r["status"], "stored", "{r}");
    let down_seq = r["seq"].clone();

    // Fill the store with undelivered uplinks until the first refusal.
    let blob = "x".repeat(50_000);
    let mut waiting = None;
    for i in 0..1000 {
        let id = format!("{boot}-{i:04}");
        device
            .publish_envelope("blob", &id, json!({ "blob": blob }))
            .await;
        let r = receipt(&mut device, &id).await;
        match r["status"].as_str() {
            Some("stored") => {
                waiting.get_or_insert((id, r["seq"].clone()));
            }
            Some("rejected") if reason(&r).starts_with("disk_budget: ") => break,
            _ => panic!("{r}"),
        }
    }
    let (waiting, waiting_seq) = waiting.expect("something stored before the budget");
    // Resends at the budget: answered, never refused.
    for _ in 0..3 {
        device
            .publish_envelope("blob", &waiting, json!({ "again": 1 }))
            .await;
        let r = receipt(&mut device, &waiting).await;
        assert_eq!(r["status"], "stored", "{r}");
        assert_eq!(r["seq"], waiting_seq, "{r}");
    }
    backend
        .publish_raw("ferry/gw-dup/down/panel-1", body.clone())
        .await;
    let r = north_receipt(&mut receipts, &down).await;
    assert_eq!(r["status"], "stored", "{r}");
    assert_eq!(r["seq"], down_seq, "{r}");
    assert_eq!(r["device"], "panel-1", "{r}");

    // At the budget the pruner deletes the delivered uplink early, keeping
    // its key: a resend of it is answered `delivered`, still at the budget.
    eventually(
        Duration::from_secs(20),
        "the delivered uplink pruned",
        || ferry.query_i64("SELECT count(*) FROM uplink WHERE msg_id = ?1", [&done]) == 0,
    )
    .await;
    assert_eq!(ferry.admin_get("/readyz").0, 503, "still at the budget");
    device
        .publish_envelope("t", &done, json!({ "again": 1 }))
        .await;
    let r = receipt(&mut device, &done).await;
    assert_eq!(r["status"], "delivered", "{r}");
    assert_eq!(r["seq"], done_seq, "{r}");

    // What is new is refused, both ways, and nothing of it is written.
    let new = format!("{boot}-new");
    device.publish_envelope("t", &new, json!({ "n": 1 })).await;
    let r = receipt(&mut device, &new).await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert!(reason(&r).starts_with("disk_budget: "), "{r}");
    let new_down = format!("{boot}-down2");
    backend
        .publish_raw(
            "ferry/gw-dup/down/panel-1",
            serde_json::to_vec(&json!({ "msg_id": new_down, "payload": "x" })).unwrap(),
        )
        .await;
    let r = north_receipt(&mut receipts, &new_down).await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert!(reason(&r).starts_with("disk_budget: "), "{r}");
    assert_eq!(r["device"], "panel-1", "{r}");
    // A resend naming a known device and a new one: the known one is
    // answered, the new one refused by name.
    backend
        .publish_raw(
            "ferry/gw-dup/down",
            serde_json::to_vec(
                &json!({ "msg_id": down, "payload": "shift B", "to": ["panel-1", "panel-2"] }),
            )
            .unwrap(),
        )
        .await;
    let mut got = north_receipts(&mut receipts, &down, 2).await;
    got.sort_by_key(|r| r["device"].as_str().unwrap_or("").to_string());
    assert_eq!(
        (&got[0]["device"], &got[0]["status"]),
        (&json!("panel-1"), &json!("stored")),
        "{got:?}"
    );
    assert_eq!(
        (&got[1]["device"], &got[1]["status"]),
        (&json!("panel-2"), &json!("rejected")),
        "{got:?}"
    );
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM uplink WHERE msg_id = ?1", [&waiting]),
        1
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery WHERE device = 'panel-2'",
            []
        ),
        0
    );
    assert_eq!(ferry.query_i64("SELECT count(*) FROM down_message", []), 1);

    // Whose data it is: the alert, the metric and `ferry status` name the
    // device whose undelivered uplinks fill the store.
    let alert = alerts
        .next_alert("disk_budget", Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("no disk_budget alert\n{}", ferry.log_tail()));
    let detail = alert["detail"].as_str().unwrap_or("").to_string();
    assert!(
        detail.contains("whose: undelivered uplinks: press-1 ("),
        "{detail}"
    );
    eventually(Duration::from_secs(10), "the holder metric", || {
        ferry
            .metrics()
            .get(r#"ferry_disk_budget_holder{kind="uplinks",holder="press-1"}"#)
            .is_some_and(|n| n > 10.0)
    })
    .await;
    let status = crate::ops::cli_json(&ferry, &["status"]);
    assert_eq!(status["uplink_top"][0]["device"], "press-1", "{status}");
}
