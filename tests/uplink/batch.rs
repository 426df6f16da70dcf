//! North batches (`north.batch_max` > 1, docs/PROTOCOL.md "North
//! batches"): uplinks published as JSON arrays on `ferry/{gateway}/up`,
//! read by a raw MQTT backend on Mosquitto and by ferry's own client
//! library.

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};

use super::*;

/// One arrival on `ferry/{gateway}/up/#`, a batch split into its bodies.
struct Arrival {
    batch: bool,
    bodies: Vec<Value>,
}

fn split(m: &NorthMessage, gateway: &str) -> Arrival {
    if m.topic == format!("ferry/{gateway}/up") {
        let bodies = m
            .body
            .as_array()
            .unwrap_or_else(|| panic!("a batch that is not an array: {:?}", m.body))
            .clone();
        Arrival {
            batch: true,
            bodies,
        }
    } else {
        Arrival {
            batch: false,
            bodies: vec![m.body.clone()],
        }
    }
}

/// A body as the backend keys it.
fn key(body: &Value) -> (String, String) {
    (
        body["device"].as_str().unwrap_or("").to_string(),
        body["msg_id"].as_str().unwrap_or("").to_string(),
    )
}

/// Ack bodies `ok`, as one ack array.
fn ack_array(bodies: &[&Value]) -> Vec<u8> {
    let acks: Vec<Value> = bodies
        .iter()
        .map(|b| json!({"device": b["device"], "msg_id": b["msg_id"], "status": "ok"}))
        .collect();
    serde_json::to_vec(&acks).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_keep_each_devices_order_and_what_the_backend_leaves_unacked_is_sent_again() {
    const GATEWAY: &str = "gw-batch";
    const DEVICES: usize = 3;
    const EACH: usize = 20;
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new(GATEWAY, mq.port).with(|c| {
        c.north.batch_max = 8;
        c.north.batch_linger_ms = 100;
        c.north.ack_timeout_ms = 1_000;
    }));
    let mut backend = Backend::connect(mq.port, GATEWAY).await;
    let boot = boot_id();
    let mut devices = Vec::new();
    let mut ids = Vec::new();
    for d in 0..DEVICES {
        let device = Device::connect(ferry.south_port, &format!("bat-{d}")).await;
        ids.push(device.publish_many("line/t", &boot, "b", EACH).await);
        devices.push(device);
    }

    // Each batch is acked with one ack array: on its first arrival every
    // message but those whose seq is a multiple of 5; those when they
    // come again (after the ack timeout).
    let total = DEVICES * EACH;
    let mut seen: HashMap<(String, String), usize> = HashMap::new();
    let mut last_seq: HashMap<String, u64> = HashMap::new();
    let mut batches = 0;
    let mut largest = 0;
    let mut left_unacked = HashSet::new();
    let mut again = HashSet::new();
    let deadline = Instant::now() + SECS_30;
    while (seen.len() < total || again.len() < DEVICES * (EACH / 5)) && Instant::now() < deadline {
        let Some(m) = backend.next_message(SECS_5).await else {
            continue;
        };
        let arrival = split(&m, GATEWAY);
        assert!(
            arrival.batch,
            "a message went alone on {}: {:?}",
            m.topic, m.body
        );
        batches += 1;
        largest = largest.max(arrival.bodies.len());
        assert!(
            (1..=8).contains(&arrival.bodies.len()),
            "{}",
            arrival.bodies.len()
        );
        let mut ack = Vec::new();
        for body in &arrival.bodies {
            for field in [
                "gateway",
                "device",
                "msg_id",
                "seq",
                "stream",
                "ts",
                "stored_ts",
                "payload",
            ] {
                assert!(body.get(field).is_some(), "no {field} in {body}");
            }
            assert_eq!(body["stream"], "line/t", "{body}");
            let k = key(body);
            let seq = body["seq"].as_u64().unwrap();
            *seen.entry(k.clone()).or_default() += 1;
            if seen[&k] > 1 {
                assert!(left_unacked.contains(&k), "{k:?} was acked and came again");
                again.insert(k);
                ack.push(body);
                continue;
            }
            // A device's first attempts: its seqs only grow, across
            // batches and within each.
            let last = last_seq.insert(k.0.clone(), seq).unwrap_or(0);
            assert!(seq > last, "{}: seq {seq} after {last}", k.0);
            if seq % 5 == 0 {
                left_unacked.insert(k);
            } else {
                ack.push(body);
            }
        }
        if !ack.is_empty() {
            backend.publish_ack_raw(ack_array(&ack)).await;
        }
    }
    assert_eq!(seen.len(), total, "{}", ferry.log_tail());
    assert!(
        batches < total && largest > 1,
        "{batches} publishes for {total} messages, the largest of {largest}"
    );
    assert_eq!(left_unacked.len(), DEVICES * (EACH / 5));
    assert_eq!(again, left_unacked, "what was left unacked came again");
    let mut receipts: Vec<Vec<Value>> = vec![Vec::new(); DEVICES];
    assert_all_delivered(&mut devices, &ids, &mut receipts, SECS_30).await;
    // Nothing acked came a second time.
    let extra = backend.drain_for(Duration::from_millis(1500)).await;
    let again: Vec<(String, String)> = extra
        .iter()
        .flat_map(|m| split(m, GATEWAY).bodies)
        .map(|b| key(&b))
        .collect();
    assert!(
        again.is_empty(),
        "after every ack, these came again: {again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_publishes_before_a_restart_and_batches_after_reach_the_client_library_once_each_in_order(
) {
    const GATEWAY: &str = "gw-batch-restart";
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new(GATEWAY, mq.port).with(|c| {
        c.north.ack_timeout_ms = 60_000;
    }));
    // A raw backend that acks nothing: it sees how each message went.
    let mut watcher = Backend::connect(mq.port, GATEWAY).await;
    let boot = boot_id();
    let device = Device::connect(ferry.south_port, "bat-r").await;
    let before = device.publish_many("t", &boot, "before", 5).await;
    let singles = watcher
        .messages_until(SECS_10, |all| distinct_north(all) >= 5)
        .await;
    assert_eq!(distinct_north(&singles), 5);
    assert!(
        singles
            .iter()
            .all(|m| m.topic == format!("ferry/{GATEWAY}/up/bat-r/t")),
        "batch_max 1 publishes each alone: {:?}",
        singles.iter().map(|m| &m.topic).collect::<Vec<_>>()
    );
    drop(device);

    // Killed with all five unacked; back with batches on.
    ferry.restart_with(|c| {
        c.north.batch_max = 10;
        c.north.batch_linger_ms = 200;
    });
    let mut backend = BackendClient::connect(BackendOptions::new("127.0.0.1", mq.port, GATEWAY));
    let device = Device::connect(ferry.south_port, "bat-r").await;
    let after = device.publish_many("t", &boot, "after", 5).await;
    let want: Vec<String> = before.iter().chain(&after).cloned().collect();

    // The client library splits batches into single uplinks: each of the
    // ten once acked, in seq order.
    let mut got: Vec<(String, u64)> = Vec::new();
    let deadline = Instant::now() + SECS_30;
    while got.len() < want.len() && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(event)) = tokio::time::timeout(left, backend.events.recv()).await else {
            break;
        };
        if let BackendEvent::Uplink(m) = event {
            let id = m.envelope.msg_id.to_string();
            if got.iter().any(|(g, _)| *g == id) {
                continue; // a resend that crossed our ack
            }
            backend.ack_message(&m);
            got.push((id, m.seq.0));
        }
    }
    let ids: Vec<String> = got.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids, want, "{}", ferry.log_tail());
    assert!(
        got.windows(2).all(|w| w[0].1 < w[1].1),
        "seqs in order: {got:?}"
    );
    // The raw watcher saw them after the restart as batches, not singles.
    let later = watcher
        .messages_until(SECS_5, |all| {
            all.iter()
                .flat_map(|m| split(m, GATEWAY).bodies)
                .map(|b| key(&b))
                .collect::<HashSet<_>>()
                .len()
                >= 10
        })
        .await;
    assert!(
        !later.is_empty() && later.iter().all(|m| split(m, GATEWAY).batch),
        "{:?}",
        later.iter().map(|m| &m.topic).collect::<Vec<_>>()
    );
    // And the device hears `delivered` for all ten.
    let mut device = device;
    let receipts = device
        .receipts_until(SECS_30, |all| {
            ids_with_status(all, "delivered") >= want.len()
        })
        .await;
    assert_eq!(ids_with_status(&receipts, "delivered"), want.len());
}
