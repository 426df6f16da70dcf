//! The operator CLI (`ferry dlq`, `ferry trace`, `ferry status`) run as the
//! real binary against a running gateway with real Mosquitto upstream: what
//! it shows must match the traffic, and what it changes (replay, purge)
//! must take effect in the running gateway.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{
    boot_id, device_topics, ferry_command, Backend, BareClient, Device, Ferry, FerryOpts, Mode,
    Mosquitto,
};

const SECS_10: Duration = Duration::from_secs(10);

/// `ferry ARGS… --config FILE`: (exit code, stdout, stderr).
pub(crate) fn cli(config: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = ferry_command()
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap_or_else(|e| panic!("run ferry {args:?}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ferry ARGS… --json`, which must succeed, parsed.
pub(crate) fn cli_json(ferry: &Ferry, args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let (code, out, err) = cli(&ferry.config_path, &args);
    assert_eq!(code, Some(0), "ferry {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("ferry {args:?} printed {out:?}: {e}"))
}

/// The `event` of each line of a trace (`ferry trace --json`), in order.
pub(crate) fn event_names(trace: &Value) -> Vec<&str> {
    trace
        .as_array()
        .unwrap_or_else(|| panic!("a trace is an array: {trace}"))
        .iter()
        .filter_map(|e| e["event"].as_str())
        .collect()
}

/// Asks `probe` every 100 ms until it returns `Some`, for `timeout` at most.
async fn wait_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = probe() {
            return Some(t);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends one uplink the backend nacks with `retry: false`; returns its
/// msg_id and seq once the device got `failed`.
async fn nacked_uplink(
    device: &mut Device,
    backend: &mut Backend,
    name: &str,
    reason: &str,
) -> (String, u64) {
    let id = format!("{}-{name}", boot_id());
    device.publish_envelope("t", &id, json!({"v": 1})).await;
    let m = backend.next_message(SECS_10).await.expect("north message");
    assert_eq!(m.msg_id(), id);
    let seq = m.seq().expect("seq");
    backend.nack(m.device(), &id, reason, false).await;
    assert_eq!(final_receipt(device, &id).await["status"], "failed");
    (id, seq)
}

/// The next receipt for `id` past `stored`.
async fn final_receipt(device: &mut Device, id: &str) -> Value {
    loop {
        let (r, _) = device.next_receipt_for(id, SECS_10).await;
        let r = r.unwrap_or_else(|| panic!("no final receipt for {id}"));
        if r["status"] != "stored" {
            return r;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nacked_uplink_is_listed_and_replay_delivers_it_with_the_same_identity() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-ops-replay", mq.port));
    let mut backend = Backend::connect(mq.port, "gw-ops-replay").await;
    let mut device = Device::connect(ferry.south_port, "press-7").await;
    let (id, seq) = nacked_uplink(&mut device, &mut backend, "r", "unknown sensor").await;

    let list = cli_json(&ferry, &["dlq", "list"]);
    let rows = list.as_array().expect("an array");
    assert_eq!(rows.len(), 1, "{list}");
    let row = &rows[0];
    assert_eq!(
        (row["device"].as_str(), row["msg_id"].as_str()),
        (Some("press-7"), Some(id.as_str()))
    );
    assert_eq!(row["direction"], "up");
    let reason = row["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with("nacked") && reason.contains("unknown sensor"),
        "{row}"
    );
    assert_eq!(row["replayable"], true);
    let (code, table, _) = cli(&ferry.config_path, &["dlq", "list", "--reason", "nacked"]);
    assert_eq!(code, Some(0));
    assert!(table.starts_with("ID") && table.contains(&id), "{table}");
    let none = cli_json(&ferry, &["dlq", "list", "--direction", "down"]);
    assert_eq!(none, json!([]));
    let dl = row["id"].as_i64().expect("id");
    let shown = cli_json(&ferry, &["dlq", "show", &dl.to_string()]);
    assert_eq!(shown["seq"].as_u64(), Some(seq), "{shown}");
    assert_eq!(shown["payload"]["encoding"], "utf8");
    assert!(
        shown["payload"]["data"]
            .as_str()
            .unwrap_or("")
            .contains(&id),
        "{shown}"
    );

    // While the gateway runs: the backend sees it again, same identity.
    let (code, out, err) = cli(&ferry.config_path, &["dlq", "replay", &dl.to_string()]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("replayed"), "{out}");
    let again = backend
        .next_message(SECS_10)
        .await
        .expect("the replayed message north");
    assert_eq!(
        (again.device(), again.msg_id(), again.seq()),
        ("press-7", id.as_str(), Some(seq))
    );
    backend.ack_ok("press-7", &id).await;
    let delivered = final_receipt(&mut device, &id).await;
    assert_eq!(delivered["status"], "delivered", "{delivered}");
    assert_eq!(delivered["seq"].as_u64(), Some(seq));
    let state: String = ferry
        .db()
        .query_row(
            "SELECT state FROM uplink WHERE device = 'press-7' AND msg_id = ?1",
            [&id],
            |r| r.get(0),
        )
        .expect("uplink row");
    assert_eq!(state, "delivered");
    assert_eq!(cli_json(&ferry, &["dlq", "list"]), json!([]));

    let trace = cli_json(&ferry, &["trace", "press-7", &id]);
    let events = event_names(&trace);
    assert_eq!(
        events,
        [
            "received",
            "stored",
            "dead (backend nack)",
            "replayed",
            "delivered (backend ack)"
        ],
        "{trace}"
    );
    // Replaying it again: nothing dead to replay, said why, exit 1.
    let (code, out, err) = cli(&ferry.config_path, &["dlq", "replay", &dl.to_string()]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("not replayed: no dead letter"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_shows_every_retry_with_its_reason() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-ops-trace", mq.port));
    let mut backend = Backend::connect(mq.port, "gw-ops-trace").await;
    let mut device = Device::connect(ferry.south_port, "press-8").await;
    let id = format!("{}-t", boot_id());
    device.publish_envelope("t", &id, json!({"v": 2})).await;
    for busy in ["busy once", "busy twice"] {
        let m = backend.next_message(SECS_10).await.expect("north message");
        assert_eq!(m.msg_id(), id);
        backend.nack("press-8", &id, busy, true).await;
    }
    let m = backend
        .next_message(SECS_10)
        .await
        .expect("the third attempt");
    assert_eq!(m.msg_id(), id);
    backend.ack_ok("press-8", &id).await;
    assert_eq!(final_receipt(&mut device, &id).await["status"], "delivered");

    let trace = wait_for(SECS_10, || {
        let t = cli_json(&ferry, &["trace", "press-8", &id]);
        let failed = t
            .as_array()?
            .iter()
            .filter(|e| e["event"] == "attempt failed")
            .count();
        (failed == 2).then_some(t)
    })
    .await
    .expect("two failed attempts in the trace");
    let events = trace.as_array().expect("an array");
    let names = event_names(&trace);
    assert_eq!(
        names,
        [
            "received",
            "stored",
            "attempt failed",
            "attempt failed",
            "delivered (backend ack)"
        ],
        "{trace}"
    );
    assert!(
        events[2]["detail"]
            .as_str()
            .unwrap_or("")
            .contains("busy once"),
        "{trace}"
    );
    assert!(
        events[3]["detail"]
            .as_str()
            .unwrap_or("")
            .contains("busy twice"),
        "{trace}"
    );
    let at: Vec<i64> = events.iter().filter_map(|e| e["at_ms"].as_i64()).collect();
    assert_eq!(at.len(), events.len(), "every line has its time: {trace}");
    // In time order, so `received` (when the device's publish reached
    // ferry) is not after `stored`.
    assert!(
        at.windows(2).all(|w| w[0] <= w[1]),
        "in time order: {trace}"
    );
    let (code, table, _) = cli(&ferry.config_path, &["trace", "press-8", &id]);
    assert_eq!(code, Some(0));
    assert!(table.contains("busy twice"), "{table}");
    assert!(table.contains("received"), "{table}");

    let (code, _, err) = cli(&ferry.config_path, &["trace", "press-8", "no-such-id"]);
    assert_eq!(code, Some(1));
    assert!(
        err.trim().lines().count() == 1 && err.contains("no message"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_matches_the_traffic_with_north_down() {
    let mut mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new("gw-ops-status", mq.port));
    let mut a = Device::connect(ferry.south_port, "st-a").await;
    let _b = Device::connect(ferry.south_port, "st-b").await;
    let up = wait_for(SECS_10, || {
        let s = cli_json(&ferry, &["status"]);
        (s["north"]["up"] == true && s["devices_online"] == 2).then_some(s)
    })
    .await;
    assert!(
        up.is_some(),
        "north up and 2 devices online: {}",
        cli_json(&ferry, &["status"])
    );

    mq.stop();
    for i in 0..3 {
        let id = format!("{}-s{i}", boot_id());
        a.publish_envelope("t", &id, json!({"i": i})).await;
        let (stored, _) = a.next_receipt_for(&id, SECS_10).await;
        assert_eq!(stored.expect("`stored`")["status"], "stored");
    }
    let s = wait_for(SECS_10, || {
        let s = cli_json(&ferry, &["status"]);
        (s["north"]["up"] == false).then_some(s)
    })
    .await
    .expect("north down in the status");
    assert_eq!(s["running"], true, "{s}");
    assert_eq!(s["devices_online"], 2, "{s}");
    assert_eq!(s["uplink_backlog"], 3, "{s}");
    assert!(
        s["uplink_oldest_age_s"].as_f64().is_some_and(|a| a >= 0.0),
        "{s}"
    );
    assert_eq!(s["downlink_backlog"], 0, "{s}");
    assert_eq!(s["dead_letters"], 0, "{s}");
    assert!(s["store"]["total_bytes"].as_u64().unwrap_or(0) > 0, "{s}");
    assert_eq!(
        s["store"]["budget_bytes"].as_u64(),
        Some(ferry.config.store.max_db_bytes),
        "{s}"
    );
    let (code, text, _) = cli(&ferry.config_path, &["status"]);
    assert_eq!(code, Some(0));
    assert!(
        text.contains("north: down since")
            && text.contains("backend: present since")
            && text.contains("uplink backlog: 3"),
        "{text}"
    );

    ferry.kill();
    let s = cli_json(&ferry, &["status"]);
    assert_eq!(s["running"], false, "{s}");
    assert_eq!(s["uplink_backlog"], 3, "the store's figures still: {s}");
    let (_, text, _) = cli(&ferry.config_path, &["status"]);
    assert!(text.contains("not running"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_old_dead_letters_and_a_rejected_one_is_not_replayed() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-ops-purge", mq.port));
    let mut backend = Backend::connect(mq.port, "gw-ops-purge").await;
    let mut device = Device::connect(ferry.south_port, "press-9").await;
    nacked_uplink(&mut device, &mut backend, "p", "bad").await;
    device
        .publish_raw(&device.up_topic("t"), b"not json".to_vec())
        .await;
    let rows = wait_for(SECS_10, || {
        let l = cli_json(&ferry, &["dlq", "list", "--device", "press-9"]);
        (l.as_array()?.len() == 2).then_some(l)
    })
    .await
    .expect("two dead letters");
    let rejected = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["replayable"] == false)
        .expect("the rejected one")["id"]
        .to_string();
    let (code, out, _) = cli(&ferry.config_path, &["dlq", "replay", &rejected]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("never stored"), "{out}");

    let (code, _, err) = cli(&ferry.config_path, &["dlq", "purge", "--older-than", "30w"]);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("--older-than") && err.trim().lines().count() == 1,
        "{err}"
    );
    let kept = cli_json(&ferry, &["dlq", "purge", "--older-than", "1h"]);
    assert_eq!(kept["purged"], 0, "{kept}");
    std::thread::sleep(Duration::from_millis(1100));
    let gone = cli_json(&ferry, &["dlq", "purge", "--older-than", "1s"]);
    assert_eq!(gone["purged"], 2, "{gone}");
    assert_eq!(cli_json(&ferry, &["dlq", "list"]), json!([]));
}

#[test]
fn without_a_store_or_with_a_bad_config_the_cli_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::support::write_file(
        dir.path(),
        "ferry.toml",
        &format!(
            "[gateway]\nid = \"gw\"\ndata_dir = {:?}\n",
            dir.path().join("data").display().to_string()
        ),
    );
    let (code, _, err) = cli(&config, &["status"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("no store at") && err.trim().lines().count() == 1,
        "{err}"
    );
    assert!(!dir.path().join("data").join("ferry.db").exists());
    let bad = crate::support::write_file(dir.path(), "bad.toml", "[gateway]\nnope = 1\n");
    let (code, _, err) = cli(&bad, &["dlq", "list"]);
    assert_eq!(code, Some(64), "{err}");
    let (code, _, err) = cli(&config, &["dlq", "replay"]);
    assert_eq!(code, Some(64), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_shows_a_downlink_stored_delivered_and_read() {
    use ferry::client::backend::{BackendClient, BackendOptions};
    use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};

    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-ops-down", mq.port));
    // No dead letters yet: `replay --all` says there is nothing to replay.
    let (code, out, err) = cli(&ferry.config_path, &["dlq", "replay", "--all"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        "nothing to replay: no replayable dead letter",
        "{err}"
    );
    let north_up = wait_for(SECS_10, || {
        (cli_json(&ferry, &["status"])["north"]["up"] == true).then_some(())
    })
    .await;
    assert!(north_up.is_some(), "north never up");
    let mut device =
        DeviceClient::connect(DeviceOptions::new("127.0.0.1", ferry.south_port, "panel-1"));
    let backend = BackendClient::connect(BackendOptions::new("127.0.0.1", mq.port, "gw-ops-down"));
    let id = format!("{}-d", boot_id());
    backend.send_down(&["panel-1"], json!({"msg_id": id, "payload": "shift B"}));
    let deadline = Instant::now() + Duration::from_secs(20);
    let seq = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, device.events.recv()).await {
            Ok(Some(DeviceEvent::Inbox { messages, .. })) => {
                if let Some(m) = messages.iter().find(|m| m.msg_id == id) {
                    break m.seq;
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("no inbox with {id}"),
        }
    };
    device.read(seq);
    let trace = wait_for(SECS_10, || {
        let t = cli_json(&ferry, &["trace", "panel-1", &id]);
        (t.as_array()?.iter().any(|e| e["event"] == "read")).then_some(t)
    })
    .await
    .expect("`read` in the trace");
    let events: Vec<(&str, &str)> = trace
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["direction"].as_str().unwrap_or(""),
                e["event"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        events,
        [
            ("down", "received"),
            ("down", "stored"),
            ("down", "delivered"),
            ("down", "read")
        ],
        "{trace}"
    );
    assert!(trace[0]["seq"].as_u64() == Some(seq), "{trace}");
    // When the backend's publish reached ferry: not after it was stored.
    assert!(
        trace[0]["at_ms"].as_i64().is_some()
            && trace[0]["at_ms"].as_i64() <= trace[1]["at_ms"].as_i64(),
        "{trace}"
    );

    // Two for a device that never connects: its backlog, on top.
    for n in 0..2 {
        let id = format!("{}-off{n}", boot_id());
        backend.send_down(&["panel-off"], json!({"msg_id": id, "payload": n}));
    }
    let s = wait_for(SECS_10, || {
        let s = cli_json(&ferry, &["status", "--top", "1"]);
        (s["downlink_backlog"] == 2).then_some(s)
    })
    .await
    .expect("a downlink backlog of 2");
    assert_eq!(
        s["downlink_top"],
        json!([{"device": "panel-off", "messages": 2}]),
        "{s}"
    );
    assert!(s["downlink_oldest_age_s"].as_f64().is_some(), "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_follows_the_external_south_link() {
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start_in(Mode::External, FerryOpts::new("gw-ops-ext", mq.port));
    let up = wait_for(SECS_10, || {
        let s = cli_json(&ferry, &["status"]);
        (s["south"]["up"] == true).then_some(s)
    })
    .await
    .expect("south up in the status");
    assert_eq!(up["south_mode"], "external", "{up}");
    assert_eq!(up["devices_online"], 0, "{up}");
    let since = up["south"]["since_ms"].as_i64().expect("since_ms");
    // Presence behind a site broker: the devices' own status messages.
    let panel = BareClient::device(&ferry, "panel-9").await;
    wait_for(SECS_10, || {
        (cli_json(&ferry, &["status"])["devices_online"] == 1).then_some(())
    })
    .await
    .expect("panel-9 online once it said so");
    panel
        .publish(
            &device_topics("panel-9").status(),
            json!({"online": false}).to_string(),
        )
        .await;
    wait_for(SECS_10, || {
        (cli_json(&ferry, &["status"])["devices_online"] == 0).then_some(())
    })
    .await
    .expect("panel-9 offline once it said so");

    ferry.site.as_mut().expect("the site broker").stop();
    let down = wait_for(SECS_10, || {
        let s = cli_json(&ferry, &["status"]);
        (s["south"]["up"] == false).then_some(s)
    })
    .await
    .expect("south down in the status once the site broker stopped");
    assert!(down["south"]["since_ms"].as_i64() >= Some(since), "{down}");
    let (_, text, _) = cli(&ferry.config_path, &["status"]);
    assert!(text.contains("south: down since"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downlink_its_device_nacked_is_replayed_under_a_new_seq_with_its_msg_id() {
    use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
    use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions, InboxMessage};

    let mq = Mosquitto::start();
    let gw = "gw-ops-down-replay";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    let mut backend = BackendClient::connect(BackendOptions::new("127.0.0.1", mq.port, gw));
    let mut device =
        DeviceClient::connect(DeviceOptions::new("127.0.0.1", ferry.south_port, "panel-2"));
    // The next inbox messages the device is handed.
    async fn inbox(device: &mut DeviceClient) -> Vec<InboxMessage> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, device.events.recv()).await {
                Ok(Some(DeviceEvent::Inbox { messages, .. })) if !messages.is_empty() => {
                    return messages
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => panic!("no inbox batch"),
            }
        }
    }
    // The next receipt for `id` with `status`; its seq.
    async fn receipt(backend: &mut BackendClient, id: &str, status: &str) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, backend.events.recv()).await {
                Ok(Some(BackendEvent::Receipt(r)))
                    if r.msg_id.as_deref() == Some(id) && r.status == status =>
                {
                    return r.seq.expect("a seq");
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => panic!("no `{status}` receipt for {id}"),
            }
        }
    }

    let id = format!("{}-cmd", boot_id());
    backend.send_down(
        &["panel-2"],
        json!({"msg_id": id, "payload": "unknown command"}),
    );
    let batch = inbox(&mut device).await;
    assert_eq!(batch[0].msg_id, id);
    let old = batch[0].seq;
    device.nack(old, "unknown command");
    assert_eq!(receipt(&mut backend, &id, "failed").await, old);
    let rows = wait_for(SECS_10, || {
        let l = cli_json(&ferry, &["dlq", "list", "--direction", "down"]);
        (l.as_array()?.len() == 1).then_some(l)
    })
    .await
    .expect("the nack dead-lettered");
    assert_eq!(rows[0]["replayable"], true, "{rows}");
    let dl = rows[0]["id"].as_i64().expect("an id").to_string();

    // The device's firmware is fixed: the operator replays it.
    let (code, out, err) = cli(&ferry.config_path, &["dlq", "replay", &dl]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("new seq"), "{out}");
    let again = inbox(&mut device).await;
    assert_eq!(again[0].msg_id, id, "handed again, same msg_id");
    let new = again[0].seq;
    assert!(new > old, "under a new seq: {new} after {old}");
    assert_eq!(receipt(&mut backend, &id, "stored").await, new);
    device.confirm(new);
    assert_eq!(receipt(&mut backend, &id, "delivered").await, new);

    assert_eq!(cli_json(&ferry, &["dlq", "list"]), json!([]));
    let trace = cli_json(&ferry, &["trace", "panel-2", &id]);
    let events = event_names(&trace);
    assert_eq!(
        events,
        ["received", "stored", "dead", "replayed", "delivered"],
        "{trace}"
    );
    let log = ferry.log();
    for event in ["downlink_dead_lettered", "downlink_replayed"] {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("event=\"{event}\"")) && l.contains(&id)),
            "no {event} line for {id}\n{}",
            ferry.log_tail()
        );
    }
    // Replayed once: a second replay finds nothing.
    let (code, out, _) = cli(&ferry.config_path, &["dlq", "replay", &dl]);
    assert_eq!(code, Some(1), "{out}");

    // A nack ahead of the cursor: not replayable until the device has
    // confirmed past it (its cursor would otherwise run into a gap).
    let (a, b) = (format!("{id}-a"), format!("{id}-b"));
    backend.send_down(&["panel-2"], json!({"msg_id": a, "payload": 1}));
    let first = inbox(&mut device).await;
    backend.send_down(&["panel-2"], json!({"msg_id": b, "payload": 2}));
    let ahead = receipt(&mut backend, &b, "stored").await;
    assert_eq!(ahead, first.last().expect("a message").seq + 1);
    // The device takes b before it confirms a (a nack reaches only what
    // the device was sent): it pulls from behind its cursor.
    device.pull(Some(new - 1), None);
    let second = inbox(&mut device).await;
    assert!(second.iter().any(|m| m.seq == ahead), "{second:?}");
    device.nack(ahead, "unknown command");
    let row = wait_for(SECS_10, || {
        let l = cli_json(&ferry, &["dlq", "list", "--direction", "down"]);
        l.as_array()?.first().cloned()
    })
    .await
    .expect("the nack ahead dead-lettered");
    assert_eq!(row["replayable"], false, "{row}");
    let (code, out, _) = cli(
        &ferry.config_path,
        &[
            "dlq",
            "replay",
            &row["id"].as_i64().expect("id").to_string(),
        ],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("has not confirmed past"), "{out}");
}
