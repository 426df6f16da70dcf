//! Fair drain: one device's huge backlog does not hold back another
//! device's new message (docs/PROTOCOL.md, "Fair drain").

use super::*;
use crate::support::backlog;

/// Messages `bulk` has waiting when north returns.
const BACKLOG: u64 = 200_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_alarm_is_not_held_back_by_another_devices_backlog_of_two_hundred_thousand() {
    let mut mq = Mosquitto::start();
    let gw = "gw-fair";
    let mut ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    assert!(ferry.terminate(SECS_30), "stopped to write the backlog");
    backlog::write_uplinks(&ferry.data_dir, gw, "bulk", BACKLOG);

    // The outage: ferry comes back with its upstream gone (as
    // benches/backlog.rs), then the upstream returns.
    mq.stop();
    ferry.restart();
    let mut alarm = Device::connect(ferry.south_port, "alarm").await;
    mq.restart();
    // The backend acks everything; the observer stamps what arrives.
    let _backend = Backend::connect_auto_ack(mq.port, gw).await;
    let arrivals = backlog::Arrivals::watch(mq.port, gw).await;
    eventually(SECS_30, "the backlog draining", || {
        arrivals.bulk_seen() > 1000
    })
    .await;

    let boot = boot_id();
    let mut sent = Vec::new();
    let mut receipts = Vec::new();
    for i in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let id = format!("{boot}-alarm-{i}");
        let at = Instant::now();
        let ahead = arrivals.bulk_seen();
        alarm.publish_envelope("alarm", &id, json!({"i": i})).await;
        // Its `stored` receipt leaves after its commit: bulk messages
        // seen from here on arrived after the alarm was committed.
        let got = alarm
            .receipts_until(SECS_5, |all| {
                all.iter()
                    .any(|r| r["msg_id"] == id.as_str() && status(r) == "stored")
            })
            .await;
        let committed = arrivals.bulk_seen();
        receipts.extend(got);
        sent.push((id, at, ahead, committed));
    }
    let drained_meanwhile = arrivals.bulk_seen();
    eventually(SECS_10, "every alarm at the backend", || {
        arrivals.stamps().len() == sent.len()
    })
    .await;
    let arrived = arrivals.stamps();
    let mut report = Vec::new();
    for (id, at, bulk_before, bulk_committed) in &sent {
        let (when, bulk_at_arrival) = arrived[id];
        let latency = when.duration_since(*at);
        report.push((
            latency.as_millis(),
            bulk_at_arrival.saturating_sub(*bulk_before),
            bulk_at_arrival.saturating_sub(*bulk_committed),
        ));
    }
    assert!(
        drained_meanwhile > 1000 && drained_meanwhile < BACKLOG,
        "the alarms were sent while the backlog drained ({drained_meanwhile} of {BACKLOG} by the last): {report:?}"
    );
    // The bound (docs/PROTOCOL.md, "Fair drain"): from its commit on, at
    // most two north.max_inflight windows (32) of the backlogged device
    // reach the backend ahead of an alarm. While it is being committed the
    // drain goes on, so counted from its publish there are more (about
    // two windows in every run here); behind the backlog it would be
    // thousands of messages and seconds.
    for (latency_ms, _, after_commit) in &report {
        assert!(
            *latency_ms < 1000 && *after_commit <= 2 * 32,
            "an alarm reached the backend {latency_ms} ms after it was sent, {after_commit} bulk messages after its commit (each: latency ms, bulk messages in between from its publish, from its commit): {report:?}"
        );
    }
    println!("alarm latency (ms, bulk messages in between from publish, from commit): {report:?}");
    let got = alarm
        .receipts_until(SECS_10, |all| {
            let mut seen = receipts.clone();
            seen.extend_from_slice(all);
            super::ids_with_status(&seen, "delivered") == sent.len()
        })
        .await;
    receipts.extend(got);
    assert_eq!(
        super::ids_with_status(&receipts, "delivered"),
        sent.len(),
        "{receipts:?}"
    );
}

use crate::support::receipts::eventually;
