//! Fair drain: one device's huge backlog does not hold back another
//! device's new message (docs/PROTOCOL.md, "Fair drain").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::support::backlog;
use crate::support::session::{unique_client_id, Session};

/// Messages `bulk` has waiting when north returns.
const BACKLOG: u64 = 200_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_alarm_is_not_held_back_by_another_devices_backlog_of_two_hundred_thousand() {
    let mq = Mosquitto::start();
    let gw = "gw-fair";
    let mut ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    assert!(ferry.terminate(SECS_30), "stopped to write the backlog");
    backlog::write_uplinks(&ferry.data_dir, gw, "bulk", BACKLOG);

    // The backend acks everything; the observer stamps what arrives.
    let _backend = Backend::connect_auto_ack(mq.port, gw).await;
    let bulk_seen = Arc::new(AtomicU64::new(0));
    let alarms: Arc<Mutex<HashMap<String, (Instant, u64)>>> = Arc::default();
    let hook = {
        let bulk_seen = bulk_seen.clone();
        let alarms = alarms.clone();
        Box::new(move |m: &ferry::mqtt::Message| {
            if m.topic.contains("/up/bulk/") {
                bulk_seen.fetch_add(1, Ordering::Relaxed);
            } else {
                let msg = NorthMessage::from_publish(m);
                let seen = bulk_seen.load(Ordering::Relaxed);
                alarms
                    .lock()
                    .unwrap()
                    .entry(msg.msg_id().to_string())
                    .or_insert((Instant::now(), seen));
            }
        })
    };
    let _observer = Session::connect(
        &unique_client_id("observer"),
        mq.port,
        vec![north_topics(gw).up_filter()],
        true,
        Some(hook),
    )
    .await;

    // North returns: the backlog drains.
    ferry.restart();
    let mut alarm = Device::connect(ferry.south_port, "alarm").await;
    let boot = boot_id();
    let mut sent = Vec::new();
    for i in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let id = format!("{boot}-alarm-{i}");
        let at = Instant::now();
        let ahead = bulk_seen.load(Ordering::Relaxed);
        alarm.publish_envelope("alarm", &id, json!({"i": i})).await;
        sent.push((id, at, ahead));
    }
    let drained_meanwhile = bulk_seen.load(Ordering::Relaxed);
    eventually(SECS_10, "every alarm at the backend", || {
        alarms.lock().unwrap().len() == sent.len()
    })
    .await;
    let arrived = alarms.lock().unwrap().clone();
    let mut report = Vec::new();
    for (id, at, bulk_before) in &sent {
        let (when, bulk_at_arrival) = arrived[id];
        let latency = when.duration_since(*at);
        report.push((
            latency.as_millis(),
            bulk_at_arrival.saturating_sub(*bulk_before),
        ));
    }
    assert!(
        drained_meanwhile > 1000 && drained_meanwhile < BACKLOG,
        "the alarms were sent while the backlog drained ({drained_meanwhile} of {BACKLOG} by the last): {report:?}"
    );
    // The bound (docs/PROTOCOL.md, "Fair drain"): ahead of a new message
    // are only the other device's messages in flight (north.max_inflight,
    // 32) and those its acks let go while the new one is committed: about
    // two windows, a few ms, in every run here. Behind the backlog it
    // would be thousands of messages and seconds.
    for (latency_ms, in_between) in &report {
        assert!(
            *latency_ms < 1000 && *in_between <= 4 * 32,
            "an alarm reached the backend {latency_ms} ms after it was sent, {in_between} bulk messages after it (each: latency ms, bulk messages that arrived in between): {report:?}"
        );
    }
    println!("alarm latency (ms, bulk messages in between): {report:?}");
    let receipts = alarm
        .receipts_until(SECS_10, |all| {
            super::ids_with_status(all, "delivered") == sent.len()
        })
        .await;
    assert_eq!(
        super::ids_with_status(&receipts, "delivered"),
        sent.len(),
        "{receipts:?}"
    );
}

use crate::support::receipts::eventually;
