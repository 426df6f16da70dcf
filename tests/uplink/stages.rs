//! The stage histograms (`ferry_uplink_stage_seconds`): every stored
//! uplink is timed once in each stage of its life, in both south modes.

use super::*;

/// The stages, as `/metrics` labels them.
const STAGES: [&str; 5] = [
    "queued",
    "commit",
    "receipt",
    "north_publish",
    "backend_ack",
];

fn count(stage: &str) -> String {
    format!("ferry_uplink_stage_seconds_count{{stage=\"{stage}\"}}")
}

both_modes!(every_stored_uplink_is_timed_once_in_each_stage);
async fn every_stored_uplink_is_timed_once_in_each_stage(mode: Mode) {
    const N: usize = 20;
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-stages", mq.port));
    let before = ferry.metrics();
    for stage in STAGES {
        // There from the start, at 0, with its finest bucket.
        assert_eq!(before.value(&count(stage)), 0.0, "{stage} before traffic");
        let finest =
            format!("ferry_uplink_stage_seconds_bucket{{le=\"0.0001\",stage=\"{stage}\"}}");
        assert_eq!(before.value(&finest), 0.0, "{stage} before traffic");
    }
    let _backend = Backend::connect_auto_ack(mq.port, "gw-stages").await;
    let mut device = Device::connect(ferry.south_port, "stage-1").await;
    let ids = device.publish_many("t", &boot_id(), "s", N).await;
    let receipts = device
        .receipts_until(SECS_30, |all| {
            ids_with_status(all, "delivered") == ids.len()
        })
        .await;
    assert_eq!(ids_with_status(&receipts, "delivered"), N, "{receipts:?}");

    // Each stage was observed before the receipt that ends it went out
    // (the backend's ack is timed before the `delivered` commit), so one
    // scrape sees them all.
    let m = ferry.metrics();
    for stage in STAGES {
        // Exactly once each: a message is timed to its first publish
        // only, and to the ack of the publish in flight.
        assert_eq!(m.value(&count(stage)), N as f64, "{stage}:\n{}", m.0);
    }
    let sum = |stage: &str| {
        m.value(&format!(
            "ferry_uplink_stage_seconds_sum{{stage=\"{stage}\"}}"
        ))
    };
    // A commit takes time (an fsync); the backend's ack a round trip.
    assert!(sum("commit") > 0.0, "{}", m.0);
    assert!(sum("backend_ack") > 0.0, "{}", m.0);
}
