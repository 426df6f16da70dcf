//! The gateway's life: retained status while it runs, and a graceful exit
//! on SIGTERM (exit 0, every `stored` receipt backed by a committed row,
//! `online: false` left behind).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};

use crate::support;

/// The first retained status a fresh subscriber sees.
async fn retained_status(port: u16, gateway: &str, client_id: &str) -> serde_json::Value {
    let mut opts = BackendOptions::new("127.0.0.1", port, gateway);
    opts.client_id = client_id.to_string();
    opts.persistent_session = false;
    let mut backend = BackendClient::connect(opts);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, backend.events.recv()).await {
            Ok(Some(BackendEvent::Status(s))) => {
                return serde_json::to_value(s).expect("status serializes")
            }
            Ok(Some(_)) => continue,
            _ => panic!("no retained status on ferry/{gateway}/status within 20 s"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_cleanly_and_leaves_the_retained_status_offline() {
    let mosquitto = support::Mosquitto::start();
    let mut ferry = support::Ferry::start(support::FerryOpts::new("gw-life", mosquitto.port));

    // Online once its subscriptions are acknowledged.
    let mut status = retained_status(mosquitto.port, "gw-life", "watch-1").await;
    for _ in 0..50 {
        if status["online"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = retained_status(mosquitto.port, "gw-life", "watch-1").await;
    }
    assert_eq!(status["online"], true, "{status}");

    // The last will carries the time ferry started; a clean exit says when
    // it left.
    let before_exit = support::now_ms();
    let status = ferry.terminate_status(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "ferry did not exit 0 within 5 s of SIGTERM ({status:?}):\n{}",
        ferry.log_tail()
    );
    let status = retained_status(mosquitto.port, "gw-life", "watch-2").await;
    assert_eq!(
        status["online"],
        false,
        "after a clean exit: {status}\n{}",
        ferry.log_tail()
    );
    let ts = status["ts"].as_u64().expect("status has ts");
    assert!(
        ts >= before_exit,
        "status ts {ts} predates the exit ({before_exit}): the last will, not a clean exit"
    );
    assert!(
        support::logged(&ferry.log(), "link_session_closed", "link=north") == 1,
        "{}",
        ferry.log_tail()
    );
}

/// Online once its subscriptions are acknowledged.
async fn wait_online(port: u16, gateway: &str) {
    for i in 0..50 {
        let status = retained_status(port, gateway, &format!("watch-online-{i}")).await;
        if status["online"] == true {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{gateway} never announced itself online");
}

both_modes!(sigterm_under_load_exits_zero_and_every_stored_receipt_is_a_committed_row);
async fn sigterm_under_load_exits_zero_and_every_stored_receipt_is_a_committed_row(
    mode: support::Mode,
) {
    let mosquitto = support::Mosquitto::start();
    let opts =
        support::FerryOpts::new("gw-drain", mosquitto.port).with(|c| c.shutdown.grace_s = 10);
    let mut ferry = support::Ferry::start_in(mode, opts);
    let _backend = support::Backend::connect_auto_ack(mosquitto.port, "gw-drain").await;
    wait_online(mosquitto.port, "gw-drain").await;

    // Three devices publishing as fast as the broker takes it, until ferry
    // is gone.
    let boot = support::boot_id();
    let mut devices = Vec::new();
    let mut publishers = Vec::new();
    for d in 0..3 {
        let device = support::Device::connect(ferry.south_port, &format!("drain-{d}")).await;
        let (client, topic, boot) = (device.client(), device.up_topic("t"), boot.clone());
        publishers.push(tokio::spawn(async move {
            for i in 0u64.. {
                let body = serde_json::json!({"msg_id": format!("{boot}-{i:06}"), "ts": support::now_ms(), "payload": i});
                let bytes = serde_json::to_vec(&body).expect("serialize envelope");
                if !client.publish(topic.as_str(), bytes).await {
                    return;
                }
            }
        }));
        devices.push(device);
    }
    // Mid-stream: wait until the devices have receipts coming.
    let warm = devices[0]
        .receipts_until(Duration::from_secs(20), |r| r.len() >= 200)
        .await;
    assert!(
        warm.len() >= 200,
        "only {} receipts before SIGTERM:\n{}",
        warm.len(),
        ferry.log_tail()
    );

    let signalled = Instant::now();
    let status = ferry.terminate_status(Duration::from_secs(15));
    let took = signalled.elapsed();
    for p in &publishers {
        p.abort();
    }
    assert!(
        status.is_some_and(|s| s.success()),
        "ferry did not exit 0 after SIGTERM under load ({status:?}):\n{}",
        ferry.log_tail()
    );
    assert!(
        took < Duration::from_secs(11),
        "exit took {took:?}, past the 10 s grace"
    );
    assert!(
        ferry.log().contains("ferry stopped cleanly"),
        "{}",
        ferry.log_tail()
    );

    // Checked before the test opens the database itself.
    assert!(
        !ferry.data_dir.join("ferry.db-wal").exists(),
        "the store was not closed (its WAL is still there)"
    );
    // Every receipt a device saw, by what it says: `stored` only after the
    // commit, `delivered` only after the commit of the move.
    let mut seen: HashMap<(String, String), HashSet<String>> = HashMap::new();
    for r in &warm {
        note(&mut seen, &devices[0].id, r);
    }
    for device in &mut devices {
        for r in device
            .receipts_until(Duration::from_millis(500), |_| false)
            .await
        {
            note(&mut seen, &device.id, &r);
        }
    }
    let db = ferry.db();
    let mut rows: HashMap<(String, String), String> = HashMap::new();
    let mut stmt = db
        .prepare("SELECT device, msg_id, state FROM uplink")
        .expect("prepare");
    for row in stmt
        .query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))
        .expect("query uplink")
    {
        let (key, state) = row.expect("row");
        rows.insert(key, state);
    }
    let stored = seen.values().filter(|s| s.contains("stored")).count();
    assert!(
        stored >= 200,
        "only {stored} messages were answered `stored`"
    );
    for (key, statuses) in &seen {
        let row = rows.get(key);
        assert!(
            row.is_some(),
            "{key:?} was answered {statuses:?} but is not in the database"
        );
        if statuses.contains("delivered") {
            assert_eq!(
                row.map(String::as_str),
                Some("delivered"),
                "{key:?} answered {statuses:?}"
            );
        }
    }

    let status = retained_status(mosquitto.port, "gw-drain", "watch-after").await;
    assert_eq!(
        status["online"], false,
        "after SIGTERM under load: {status}"
    );
}

/// Records one receipt a device saw.
fn note(
    seen: &mut HashMap<(String, String), HashSet<String>>,
    device: &str,
    r: &serde_json::Value,
) {
    let (Some(msg_id), Some(status)) = (r["msg_id"].as_str(), r["status"].as_str()) else {
        panic!("device {device} got a receipt without msg_id or status: {r}");
    };
    seen.entry((device.to_string(), msg_id.to_string()))
        .or_default()
        .insert(status.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_the_upstream_gone_still_exits_zero_with_what_was_stored() {
    let mut mosquitto = support::Mosquitto::start();
    let mut ferry = support::Ferry::start(support::FerryOpts::new("gw-alone", mosquitto.port));
    wait_online(mosquitto.port, "gw-alone").await;
    mosquitto.stop();

    let mut device = support::Device::connect(ferry.south_port, "alone-1").await;
    let ids = device.publish_many("t", &support::boot_id(), "m", 20).await;
    let receipts = device
        .receipts_until(Duration::from_secs(10), |r| r.len() >= ids.len())
        .await;
    assert_eq!(receipts.len(), ids.len(), "{receipts:?}");

    let signalled = Instant::now();
    let status = ferry.terminate_status(Duration::from_secs(15));
    assert!(
        status.is_some_and(|s| s.success()),
        "ferry did not exit 0 after SIGTERM with the upstream gone ({status:?}):\n{}",
        ferry.log_tail()
    );
    // Nothing to flush north: only the wait for a DISCONNECT that has no
    // link to go on.
    let took = signalled.elapsed();
    assert!(took < Duration::from_secs(5), "exit took {took:?}");
    let stored = ferry.query_i64(
        "SELECT COUNT(*) FROM uplink WHERE device = 'alone-1' AND state = 'stored'",
        [],
    );
    assert_eq!(stored, ids.len() as i64);
}

/// `log.format = "json"`: every line ferry writes is one JSON object with
/// its timestamp, level and message, and an event's fields by name next to
/// them: each of ferry's INFO, WARN and ERROR lines names its condition
/// (`event`), a rejected uplink its device and reason, an uplink the
/// backend nacked its device, msg_id, seq, attempts and reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_log_format_json_every_line_is_an_event_with_its_fields() {
    let mq = support::Mosquitto::start();
    let mut ferry = support::Ferry::start(
        support::FerryOpts::new("gw-json-log", mq.port).with(|c| c.log.format = "json".into()),
    );
    let backend = support::Backend::connect(mq.port, "gw-json-log").await;
    let mut device = support::Device::connect(ferry.south_port, "json-dev").await;
    device
        .publish_raw(&device.up_topic("t"), b"{\"no\": \"msg_id\"}".to_vec())
        .await;
    let receipt = device.next_receipt(Duration::from_secs(10)).await;
    assert_eq!(receipt.expect("a receipt")["status"], "rejected");
    let id = format!("{}-nacked", support::boot_id());
    device
        .publish_envelope("t", &id, serde_json::json!({"v": 1}))
        .await;
    let mut backend = backend;
    let north = backend
        .next_message(Duration::from_secs(10))
        .await
        .expect("the uplink north");
    let seq = north.seq().expect("seq");
    backend.nack("json-dev", &id, "unknown sensor", false).await;
    let failed = loop {
        let (r, _) = device.next_receipt_for(&id, Duration::from_secs(10)).await;
        let r = r.expect("a receipt for the nacked uplink");
        if r["status"] != "stored" {
            break r;
        }
    };
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(ferry.terminate(Duration::from_secs(10)), "ferry stopped");

    let log = ferry.log();
    let events: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.starts_with("=== harness"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(events.len() > 3, "{log}");
    for e in &events {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(e.get(key).is_some(), "no {key}: {e}");
        }
    }
    for e in events
        .iter()
        .filter(|e| e["target"].as_str().is_some_and(|t| t.starts_with("ferry")))
        .filter(|e| e["level"] != "DEBUG" && e["level"] != "TRACE")
    {
        assert!(e["event"].is_string(), "no event name: {e}");
    }
    let rejected = events
        .iter()
        .find(|e| e["event"] == "uplink_rejected")
        .unwrap_or_else(|| panic!("no `uplink_rejected` event in {log}"));
    assert_eq!(rejected["message"], "uplink rejected");
    assert_eq!(rejected["level"], "WARN");
    assert_eq!(rejected["device"], "json-dev", "{rejected}");
    assert!(
        rejected["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("malformed")),
        "{rejected}"
    );
    let dead = events
        .iter()
        .find(|e| e["event"] == "uplink_dead_lettered")
        .unwrap_or_else(|| panic!("no `uplink_dead_lettered` event in {log}"));
    assert_eq!(dead["level"], "WARN", "{dead}");
    assert_eq!(dead["device"], "json-dev", "{dead}");
    assert_eq!(dead["msg_id"], id.as_str(), "{dead}");
    assert_eq!(dead["seq"].as_u64(), Some(seq), "{dead}");
    assert_eq!(dead["attempts"].as_u64(), Some(1), "{dead}");
    assert!(
        dead["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("nacked") && r.contains("unknown sensor")),
        "{dead}"
    );
}
