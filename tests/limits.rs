//! Input limits (issue 8 item 4; docs/SECURITY.md, "Limits"), against the
//! real `ferry` binary and a real Mosquitto upstream: a device over its
//! rate, past its uplinks in flight, a control over its rate, JSON nested
//! too deep from a device and from the backend, a publish declaring 200 MB,
//! and garbage on the wire. Each violation is answered to that client,
//! counted and logged once, and every other device's traffic goes on.
//!
//! Subscriptions past `south.max_subscriptions` are in
//! `edges::subscriptions_past_the_limit_get_a_failure_code`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
use ferry::ids::DeviceId;
use ferry::protocol::receipt::ReceiptStatus;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::receipts::{ids_with, status};
use crate::support::{
    self, boot_id, device_topics, north_topics, Backend, BareClient, Device, Ferry, FerryOpts,
    Mode, Mosquitto, RawMqtt,
};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

fn reason(r: &Value) -> &str {
    r["reason"].as_str().unwrap_or("")
}

/// ferry's log lines that contain every one of `parts`.
fn log_lines(ferry: &Ferry, parts: &[&str]) -> Vec<String> {
    ferry
        .log()
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .map(str::to_string)
        .collect()
}

/// Waits until ferry's log has a line with every one of `parts`; returns it.
async fn log_line(ferry: &Ferry, parts: &[&str], timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(line) = log_lines(ferry, parts).pop() {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {parts:?} within {timeout:?}\n{}",
            ferry.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The number after `field=` in a log line.
fn field(line: &str, field: &str) -> u64 {
    let at = line
        .find(&format!("{field}="))
        .unwrap_or_else(|| panic!("no {field} in {line}"));
    line[at + field.len() + 1..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|e| panic!("{field} in {line}: {e}"))
}

/// An envelope as bytes.
fn envelope(id: &str, payload: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"msg_id": id, "payload": payload})).unwrap()
}

both_modes!(a_device_over_its_rate_is_refused_retryably_and_another_device_is_undisturbed);
async fn a_device_over_its_rate_is_refused_retryably_and_another_device_is_undisturbed(mode: Mode) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-rate", mq.port).with(|c| {
            c.south.rate_per_s = 5.0;
            c.south.burst = 10;
        }),
    );
    let mut loud = Device::connect(ferry.south_port, "loud").await;
    let mut quiet = Device::connect(ferry.south_port, "quiet").await;
    let boot = boot_id();

    let ids = loud.publish_many("t", &boot, "l", 40).await;
    let quiet_ids = quiet.publish_many("t", &boot, "q", 5).await;
    let answered = |all: &[Value]| {
        all.iter()
            .filter_map(|r| r["msg_id"].as_str())
            .collect::<HashSet<_>>()
            .len()
    };
    let got = loud
        .receipts_until(SECS_30, |all| answered(all) == 40)
        .await;
    let stored = ids_with(&got, "stored");
    let refused: Vec<&Value> = got.iter().filter(|r| status(r) == "rejected").collect();
    // Its burst, and what the bucket refilled while they came in.
    assert!((10..=14).contains(&stored.len()), "{got:?}");
    assert_eq!(stored.len() + refused.len(), ids.len(), "{got:?}");
    for r in &refused {
        assert_eq!(
            reason(r),
            "rate: over 5 publishes per second, burst 10",
            "{r}"
        );
        assert!(r["dead_letter"].is_null(), "nothing kept: {r}");
        assert!(ids.iter().any(|id| r["msg_id"] == json!(id)), "{r}");
    }
    let q = quiet.receipts_until(SECS_30, |all| all.len() == 5).await;
    assert_eq!(ids_with(&q, "stored").len(), quiet_ids.len(), "{q:?}");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'loud'", []),
        stored.len() as i64,
        "a refused uplink is not stored"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        0,
        "nor dead-lettered"
    );

    // One line when it started, one when its bucket is full again (10
    // tokens at 5 a second, then the sweep), with the count.
    let back = log_line(
        &ferry,
        &["device back within south.rate_per_s", "device=loud"],
        SECS_10,
    )
    .await;
    assert_eq!(field(&back, "limited"), refused.len() as u64, "{back}");
    let over = log_lines(&ferry, &["device over south.rate_per_s", "device=loud"]);
    assert_eq!(over.len(), 1, "one line, not one per message: {over:#?}");
    assert!(over[0].contains("rate_per_s=5") && over[0].contains("burst=10"));
    assert!(log_lines(&ferry, &["device=quiet", "rate_per_s"]).is_empty());

    // The device still holds what was refused; sent again, it is stored.
    let again: Vec<String> = refused
        .iter()
        .take(5)
        .map(|r| r["msg_id"].as_str().unwrap().to_string())
        .collect();
    for id in &again {
        loud.publish_raw(&loud.up_topic("t"), envelope(id, json!("again")))
            .await;
    }
    let got = loud.receipts_until(SECS_10, |all| all.len() == 5).await;
    assert_eq!(
        ids_with(&got, "stored"),
        again.iter().cloned().collect::<HashSet<_>>(),
        "{got:?}"
    );
}

both_modes!(a_device_client_resends_what_the_default_rate_refused_until_all_is_stored_once);
async fn a_device_client_resends_what_the_default_rate_refused_until_all_is_stored_once(
    mode: Mode,
) {
    // ferry's own limits: 200 a second, a burst of 400.
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-rate-client", mq.port).with_default_limits(),
    );
    let mut opts = DeviceOptions::new("127.0.0.1", ferry.south_port, "eager");
    opts.resend_after = Duration::from_millis(300);
    let mut device = DeviceClient::connect(opts);
    match tokio::time::timeout(SECS_30, device.events.recv()).await {
        Ok(Some(DeviceEvent::Connected)) => {}
        other => panic!("the device did not connect: {other:?}"),
    }
    let boot = boot_id();
    let n = 700;
    for i in 0..n {
        device
            .send("t", &format!("{boot}-{i:04}"), json!(i))
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (mut stored, mut refused) = (HashSet::new(), 0);
    while stored.len() < n {
        match tokio::time::timeout_at(deadline, device.events.recv()).await {
            Ok(Some(DeviceEvent::Receipt(r))) if r.is_retryable() => refused += 1,
            Ok(Some(DeviceEvent::Receipt(r))) => {
                assert_eq!(r.status, ReceiptStatus::Stored, "{r:?}");
                stored.extend(r.msg_id.map(|m| m.to_string()));
            }
            Ok(Some(_)) => {}
            _ => panic!(
                "{} of {n} stored, {refused} refused\n{}",
                stored.len(),
                ferry.log_tail()
            ),
        }
    }
    assert!(refused > 0, "the burst was over the limit");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'eager'", []),
        n as i64,
        "each stored once"
    );
}

both_modes!(a_device_past_its_uplinks_in_flight_is_refused_and_another_is_not_held_up);
async fn a_device_past_its_uplinks_in_flight_is_refused_and_another_is_not_held_up(mode: Mode) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-inflight", mq.port).with(|c| c.south.max_inflight_per_device = 2),
    );
    let mut busy = Device::connect(ferry.south_port, "busy").await;
    let mut steady = Device::connect(ferry.south_port, "steady").await;
    let boot = boot_id();

    let n = 200;
    let sender = {
        let (client, topic, boot) = (busy.client(), busy.up_topic("t"), boot.clone());
        tokio::spawn(async move {
            for i in 0..n {
                assert!(
                    client
                        .publish(
                            topic.as_str(),
                            envelope(&format!("{boot}-b{i:04}"), json!(i))
                        )
                        .await
                );
            }
        })
    };
    // Meanwhile one at a time from another device: never refused.
    for i in 0..5 {
        let id = format!("{boot}-s{i}");
        steady.publish_envelope("t", &id, json!(i)).await;
        let (r, _) = steady.next_receipt_for(&id, SECS_10).await;
        assert_eq!(r.as_ref().map(status), Some("stored"), "{r:?}");
    }
    sender.await.unwrap();
    let got = busy.receipts_until(SECS_30, |all| all.len() >= n).await;
    assert_eq!(got.len(), n, "one answer each");
    let stored = ids_with(&got, "stored");
    let refused: Vec<&Value> = got.iter().filter(|r| status(r) == "rejected").collect();
    assert_eq!(stored.len() + refused.len(), n);
    assert!(!refused.is_empty(), "200 pipelined past 2 in flight");
    for r in &refused {
        assert_eq!(reason(r), "rate: more than 2 uplinks in flight", "{r}");
        assert!(r["dead_letter"].is_null(), "{r}");
    }
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'busy'", []),
        stored.len() as i64
    );
    // Each run of refusals is one line when it starts and one with its
    // count when nothing is in flight any more.
    let past = log_lines(
        &ferry,
        &["device past south.max_inflight_per_device", "device=busy"],
    );
    let back = log_lines(
        &ferry,
        &[
            "device back under south.max_inflight_per_device",
            "device=busy",
        ],
    );
    assert!(!past.is_empty());
    assert_eq!(past.len(), back.len(), "{past:#?}\n{back:#?}");
    let counted: u64 = back.iter().map(|l| field(l, "limited")).sum();
    assert_eq!(counted, refused.len() as u64);
    assert!(log_lines(&ferry, &["device=steady", "max_inflight_per_device"]).is_empty());
}

both_modes!(a_confirm_dropped_over_the_rate_is_repaired_by_the_batch_coming_again);
async fn a_confirm_dropped_over_the_rate_is_repaired_by_the_batch_coming_again(mode: Mode) {
    let mq = Mosquitto::start();
    let gw = "gw-rate-confirm";
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new(gw, mq.port).with(|c| {
            c.south.rate_per_s = 4.0;
            c.south.burst = 4;
            c.downlink.confirm_timeout_ms = 500;
        }),
    );
    let backend = Backend::connect(mq.port, gw).await;
    let topics = device_topics("confirmer");
    let mut device = BareClient::device(&ferry, "confirmer").await;
    let down = serde_json::to_vec(&json!({"msg_id": "down-1", "payload": "hi"})).unwrap();
    backend
        .publish_raw(
            &north_topics(gw).down_to(&DeviceId::new("confirmer").unwrap()),
            down,
        )
        .await;
    let first = device.next_json(SECS_30).await.expect("a batch");
    assert_eq!(first["messages"][0]["seq"], 1, "{first}");

    // Its bucket emptied, the device confirms: dropped.
    for i in 0..10 {
        device
            .publish(&topics.up("t"), envelope(&format!("flood-{i}"), json!(i)))
            .await;
    }
    device.publish(&topics.confirm(), r#"{"upto":1}"#).await;
    // The batch comes again; the device confirms each time it does, as a
    // device must, until the gateway has it.
    let mut batches = 1;
    let deadline = Instant::now() + SECS_30;
    while ferry.query_i64(
        "SELECT delivered_upto FROM devices WHERE device = 'confirmer'",
        [],
    ) != 1
    {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the cursor never moved\n{}",
            ferry.log_tail()
        );
        if let Some(batch) = device.next_json(left.min(Duration::from_millis(200))).await {
            assert_eq!(batch["messages"][0]["seq"], 1, "{batch}");
            batches += 1;
            device.publish(&topics.confirm(), r#"{"upto":1}"#).await;
        }
    }
    assert!(
        batches >= 2,
        "the dropped confirm left the batch unconfirmed"
    );
    assert_eq!(
        log_lines(
            &ferry,
            &["device over south.rate_per_s", "device=confirmer"]
        )
        .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_said_over_the_rate_reaches_the_gateway_once_the_device_slows_down() {
    // External mode: the device's own status is the gateway's only word
    // of its presence, so a status over the rate is held, not dropped.
    let mq = Mosquitto::start();
    let gw = "gw-rate-status";
    let ferry = Ferry::start_in(
        Mode::External,
        FerryOpts::new(gw, mq.port).with(|c| {
            c.south.rate_per_s = 2.0;
            c.south.burst = 3;
        }),
    );
    let backend = Backend::connect(mq.port, gw).await;
    let topics = device_topics("presence");
    let mut device = BareClient::connect(ferry.south_port, "presence", vec![topics.inbox()]).await;
    for i in 0..8 {
        device
            .publish(&topics.up("t"), envelope(&format!("flood-{i}"), json!(i)))
            .await;
    }
    device.publish(&topics.status(), r#"{"online":true}"#).await;
    let down = serde_json::to_vec(&json!({"msg_id": "down-1", "payload": "hi"})).unwrap();
    backend
        .publish_raw(
            &north_topics(gw).down_to(&DeviceId::new("presence").unwrap()),
            down,
        )
        .await;
    // Nothing but that status says the device is there.
    let batch = device.next_json(SECS_10).await;
    assert_eq!(
        batch.as_ref().map(|b| b["messages"][0]["msg_id"].clone()),
        Some(json!("down-1")),
        "{batch:?}\n{}",
        ferry.log_tail()
    );
    assert_eq!(
        log_lines(&ferry, &["device over south.rate_per_s", "device=presence"]).len(),
        1
    );
}

both_modes!(json_nested_deeper_than_32_is_rejected_malformed_and_dead_lettered);
async fn json_nested_deeper_than_32_is_rejected_malformed_and_dead_lettered(mode: Mode) {
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-deep", mq.port));
    let mut deep = Device::connect(ferry.south_port, "deep").await;
    let mut other = Device::connect(ferry.south_port, "other").await;

    let nested = |n: usize| {
        format!(
            r#"{{"msg_id":"deep-{n}","payload":{}1{}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    let unclosed = format!(r#"{{"msg_id":"deep-open","payload":{}"#, "[".repeat(60_000));
    let topic = deep.up_topic("t");
    // 31 levels of payload in the envelope's one: at the limit, accepted.
    deep.publish_raw(&topic, nested(31)).await;
    deep.publish_raw(&topic, nested(40)).await;
    deep.publish_raw(&topic, unclosed).await;
    let control = format!(r#"{{"upto":1,"x":{}}}"#, "[".repeat(50));
    deep.publish_raw(&deep.topics.confirm(), control).await;
    other.publish_envelope("t", "other-1", json!(1)).await;

    let got = deep.receipts_until(SECS_30, |all| all.len() == 3).await;
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(status(&got[0]), "stored", "{}", got[0]);
    for (r, id) in got[1..].iter().zip(["deep-40", "deep-open"]) {
        assert_eq!(status(r), "rejected", "{r}");
        assert_eq!(reason(r), "malformed: nested deeper than 32", "{r}");
        assert_eq!(r["msg_id"], id, "its id, read without parsing: {r}");
        assert!(r["dead_letter"].as_i64().is_some(), "{r}");
    }
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM dead_letter WHERE device = 'deep' AND reason = 'malformed: nested deeper than 32'",
            []
        ),
        2
    );
    let line = log_line(&ferry, &["device control nested too deep"], SECS_10).await;
    assert!(line.contains("device=deep"), "{line}");
    assert_eq!(field(&line, "total"), 3, "envelopes and controls counted");
    let lines = log_lines(&ferry, &["device envelope nested too deep"]);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let (r, _) = other.next_receipt_for("other-1", SECS_10).await;
    assert_eq!(r.as_ref().map(status), Some("stored"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_downlink_nested_deeper_than_32_is_rejected_north_and_the_next_is_stored() {
    let mq = Mosquitto::start();
    let gw = "gw-deep-down";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    let backend = Backend::connect(mq.port, gw).await;
    let mut receipts = RawMqtt::connect(mq.port, "deep-receipts", 30).await;
    // Downlinks reach the gateway once its north subscriptions are
    // acknowledged, which its retained status says (`online`); a publish
    // before that reaches no one.
    receipts.subscribe(&[north_topics(gw).status()]).await;
    let online = receipts
        .read_publishes(SECS_30, |p| {
            serde_json::from_slice::<Value>(&p.payload).is_ok_and(|s| s["online"] == true)
        })
        .await;
    assert!(online, "gateway {gw} did not report online within 30 s");
    receipts.subscribe(&[north_topics(gw).receipts()]).await;
    let to = north_topics(gw).down_to(&DeviceId::new("d1").unwrap());

    let deep = format!(
        r#"{{"msg_id":"deep-down","payload":{}"#,
        "{\"a\":".repeat(10_000)
    );
    backend.publish_raw(&to, deep.into_bytes()).await;
    let fine = serde_json::to_vec(&json!({"msg_id": "fine-down", "payload": [[["ok"]]]})).unwrap();
    backend.publish_raw(&to, fine).await;

    let mut all: Vec<Value> = Vec::new();
    receipts
        .read_publishes(SECS_30, |p| {
            match serde_json::from_slice::<Value>(&p.payload) {
                Ok(Value::Array(items)) => all.extend(items),
                Ok(one) => all.push(one),
                Err(_) => {}
            }
            all.iter().any(|r| r["msg_id"] == "fine-down")
        })
        .await;
    let rejected: Vec<&Value> = all.iter().filter(|r| r["msg_id"] == "deep-down").collect();
    assert_eq!(rejected.len(), 1, "{all:?}");
    assert_eq!(status(rejected[0]), "rejected");
    assert!(
        reason(rejected[0]).starts_with("malformed: nested deeper than 32"),
        "{}",
        rejected[0]
    );
    assert!(
        all.iter()
            .any(|r| r["msg_id"] == "fine-down" && status(r) == "stored"),
        "{all:?}"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM dead_letter WHERE direction = 'down' AND reason = 'malformed: nested deeper than 32'",
            []
        ),
        1
    );
    let line = log_line(&ferry, &["backend downlink nested too deep"], SECS_10).await;
    assert_eq!(field(&line, "total"), 1, "{line}");
}

/// The fixed header of a QoS 1 PUBLISH whose remaining length is `len`.
fn publish_header(len: usize) -> Vec<u8> {
    let mut out = vec![0x32];
    let mut x = len;
    loop {
        let mut byte = (x % 128) as u8;
        x /= 128;
        if x > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if x == 0 {
            return out;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_declaring_200_mb_is_skipped_unbuffered_while_another_device_flows() {
    let ferry = Ferry::start(FerryOpts::new("gw-200mb", support::free_port()));
    let pid = ferry.pid().expect("ferry runs");
    let mut other = Device::connect(ferry.south_port, "other").await;
    let mut raw = RawMqtt::connect(ferry.south_port, "huge", 60).await;
    raw.subscribe(&[device_topics("huge").ack()]).await;
    let before = support::rss_kib(pid).unwrap();

    // A PUBLISH that says 200 MB are coming, and then sends them.
    let topic = b"devices/huge/up/t";
    let head = br#"{"msg_id":"huge-1","payload":""#;
    let total = 200 << 20;
    let len = 2 + topic.len() + 2 + total;
    let mut start = publish_header(len);
    start.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    start.extend_from_slice(topic);
    start.extend_from_slice(&7u16.to_be_bytes());
    start.extend_from_slice(head);
    raw.write_raw(&start).await.unwrap();
    let chunk = vec![b'z'; 1 << 20];
    raw.write_raw(&chunk).await.unwrap();
    let mut sent = head.len() + chunk.len();
    // Answered as soon as its head (4 KiB) is in: nothing waits for the
    // rest. (Its PUBACK waits: a client writes no packet inside another.)
    let receipt = loop {
        match raw.recv(SECS_10).await {
            Some(rumqttc::Packet::Publish(p)) => break p,
            Some(_) => continue,
            None => panic!("no receipt for the declared 200 MB"),
        }
    };
    let r: Value = serde_json::from_slice(&receipt.payload).unwrap();
    assert_eq!(status(&r), "rejected", "{r}");
    assert_eq!(r["msg_id"], "huge-1", "{r}");
    // The whole packet's size, over the largest packet a device may send.
    let packet = publish_header(len).len() + len;
    assert_eq!(
        reason(&r),
        format!(
            "too_large: {packet} bytes > 66560, the largest packet a device may send \
             (south.max_payload_bytes + 1024)"
        )
    );

    let mut peak = before;
    let mut i = 0;
    while sent < total {
        let n = chunk.len().min(total - sent);
        raw.write_raw(&chunk[..n]).await.unwrap();
        sent += n;
        i += 1;
        if i % 20 == 0 {
            peak = peak.max(support::rss_kib(pid).unwrap());
            let id = format!("other-{i}");
            other.publish_envelope("t", &id, json!(i)).await;
            let (got, _) = other.next_receipt_for(&id, SECS_10).await;
            assert_eq!(got.as_ref().map(status), Some("stored"), "{got:?}");
        }
    }
    eprintln!("RSS {before} KiB before, {peak} KiB at most while 200 MB streamed past");
    assert!(
        peak < before + 32 * 1024,
        "the broker buffered it: {before} KiB -> {peak} KiB"
    );
    // The same connection goes on after the skipped bytes.
    let after = raw.publish("devices/huge/up/t", envelope("huge-2", json!(1)));
    raw.send_many([
        rumqttc::Packet::PubAck(rumqttc::PubAck::new(receipt.pkid)),
        after,
    ])
    .await;
    let mut next = None;
    raw.read_publishes(SECS_10, |p| {
        next = serde_json::from_slice::<Value>(&p.payload).ok();
        true
    })
    .await;
    let next = next.unwrap_or_else(|| {
        panic!(
            "no receipt after the skipped publish; {} stored\n{}",
            ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'huge'", []),
            ferry.log_tail()
        )
    });
    assert_eq!(
        (status(&next), &next["msg_id"]),
        ("stored", &json!("huge-2"))
    );
}

/// Whether the peer closed `stream` within `timeout` (what it sent
/// meanwhile is discarded).
async fn closed_within(stream: &mut tokio::net::TcpStream, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut scratch = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut scratch)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_wire_closes_only_that_connection() {
    let ferry = Ferry::start(
        FerryOpts::new("gw-garbage", support::free_port())
            .with(|c| c.south.connect_timeout_ms = 1000),
    );
    let mut device = Device::connect(ferry.south_port, "bystander").await;
    let stored = |r: Option<Value>| r.as_ref().map(status) == Some("stored");
    device.publish_envelope("t", "before", json!(0)).await;
    assert!(stored(device.next_receipt_for("before", SECS_10).await.0));

    // Instead of a CONNECT: noise, a CONNECT declaring 268 MB, and text
    // that never completes a packet.
    let before_connect: [&[u8]; 3] = [
        &[0xff; 256],
        &[0x10, 0xff, 0xff, 0xff, 0x7f],
        b"GET / HTTP/1.1\r\nHost: ferry\r\n\r\n",
    ];
    // After a CONNECT: noise, a PUBLISH whose length never ends, and a
    // packet of the reserved type 0.
    let after_connect: [&[u8]; 3] = [
        &[0xff; 256],
        &[0x32, 0xff, 0xff, 0xff, 0xff, 0xff],
        &[0x00, 0x00],
    ];
    let mut cases = 0;
    for (i, bytes) in before_connect.iter().enumerate() {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", ferry.south_port))
            .await
            .unwrap();
        s.write_all(bytes).await.unwrap();
        assert!(closed_within(&mut s, SECS_10).await, "case {i} stays open");
        cases += 1;
        let id = format!("during-a{i}");
        device.publish_envelope("t", &id, json!(i)).await;
        assert!(
            stored(device.next_receipt_for(&id, SECS_10).await.0),
            "{id}"
        );
    }
    for (i, bytes) in after_connect.iter().enumerate() {
        let mut raw = RawMqtt::connect(ferry.south_port, &format!("noisy-{i}"), 30).await;
        raw.write_raw(bytes).await.unwrap();
        assert!(
            raw.closed_within(SECS_10).await,
            "case {i} after CONNECT stays open"
        );
        cases += 1;
        let id = format!("during-b{i}");
        device.publish_envelope("t", &id, json!(i)).await;
        assert!(
            stored(device.next_receipt_for(&id, SECS_10).await.0),
            "{id}"
        );
    }
    assert_eq!(cases, 6);
    device.publish_envelope("t", "after", json!(9)).await;
    assert!(stored(device.next_receipt_for("after", SECS_10).await.0));
    assert_eq!(device.subacks(), 1, "the bystander was never cut off");
    let errors: Vec<String> = log_lines(&ferry, &[" ERROR "]);
    assert!(errors.is_empty(), "{errors:#?}");
}
