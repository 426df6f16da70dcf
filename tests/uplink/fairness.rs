//! Fair drain: one device's huge backlog does not hold back another
//! device's new message (docs/PROTOCOL.md, "Fair drain").

use super::*;
use crate::support::backlog;

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
    let arrivals = backlog::Arrivals::watch(mq.port, gw).await;

    // North returns: the backlog drains.
    ferry.restart();
    let mut alarm = Device::connect(ferry.south_port, "alarm").await;
    let boot = boot_id();
    let mut sent = Vec::new();
    for i in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let id = format!("{boot}-alarm-{i}");
        let at = Instant::now();
        let ahead = arrivals.bulk_seen();
        alarm.publish_envelope("alarm", &id, json!({"i": i})).await;
        sent.push((id, at, ahead));
    }
    let drained_meanwhile = arrivals.bulk_seen();
    eventually(SECS_10, "every alarm at the backend", || {
        arrivals.stamps().len() == sent.len()
    })
    .await;
    let arrived = arrivals.stamps();
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
