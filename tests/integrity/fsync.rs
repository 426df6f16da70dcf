//! An fsync that fails (the power-loss shim's `POWERCUT_FSYNC_EIO_IF`: EIO,
//! and the writes since the last good sync never reach the disk, as a
//! kernel that drops the pages it failed to write): the commit it failed
//! is never answered `stored`, ferry logs `store_io_failed` naming the
//! fsync and exits instead of committing again on the same connection.
//! After a power cut (the disk holds only what was synced) and a restart
//! with fsync working, every uplink answered `stored` is there, the
//! device's resends are answered, and no seq is held twice.

use std::time::Duration;

use rand::SeedableRng;

use super::{distinct, logged, stored, SECS_10};
use crate::support::powercut::{Cut, PowerLoss};
use crate::support::{Device, Ferry, FerryOpts, Mosquitto};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_is_never_answered_stored_and_stops_the_store_until_a_restart() {
    let mq = Mosquitto::start();
    let power = PowerLoss::new();
    let faults = tempfile::tempdir().expect("temp dir");
    let trigger = faults.path().join("fail-fsync");
    let opts = power
        .on(FerryOpts::new("gw-fsync", mq.port))
        .with_env("POWERCUT_FSYNC_EIO_IF", &trigger.to_string_lossy());
    let mut ferry = Ferry::start(opts);
    let mut device = Device::connect(ferry.south_port, "fs-1").await;
    let ids = |tag: &str, n: usize| (0..n).map(|i| format!("{tag}-{i}")).collect::<Vec<_>>();
    let answered = stored(&mut device, &ids("good", 20)).await;
    assert_eq!(answered, (1..=20).collect::<Vec<u64>>());

    std::fs::write(&trigger, b"").expect("fsync fails from now on");
    let failed = ids("failed", 10);
    for id in &failed {
        device
            .publish_envelope("t", id, serde_json::json!({"id": id}))
            .await;
    }
    assert!(
        logged(&ferry, "store_io_failed", SECS_10).await,
        "the failed fsync was not reported"
    );
    let status = ferry
        .exit_within(SECS_10)
        .expect("ferry exits, not retrying");
    assert_eq!(status.code(), Some(1), "{status}");
    let log = ferry.log();
    let line = log
        .lines()
        .find(|l| l.contains("event=\"store_io_failed\""))
        .expect("the ERROR line");
    assert!(line.contains("ERROR") && line.contains("fsync"), "{line}");
    // Nothing of what the failed commits held was answered `stored`.
    while let Some(r) = device.next_receipt(Duration::from_millis(300)).await {
        assert!(
            !(r["status"] == "stored" && failed.iter().any(|id| r["msg_id"] == id.as_str())),
            "answered stored after the failed fsync: {r}"
        );
    }

    // The disk as a power cut would leave it: only what was synced.
    std::fs::remove_file(&trigger).expect("fsync works again");
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    tokio::task::block_in_place(|| power.cut(&mut ferry, Cut::Clean, &mut rng));
    ferry.restart();
    let good: Vec<(String, String)> = ids("good", 20)
        .into_iter()
        .map(|id| ("fs-1".to_string(), id))
        .collect();
    let lost = super::missing(&ferry, &good);
    assert!(lost.is_empty(), "answered `stored`, missing: {lost:?}");

    // The device resends what was never answered: each stored once.
    drop(device);
    let mut device = Device::connect(ferry.south_port, "fs-1").await;
    let resent = stored(&mut device, &failed).await;
    let mut seqs = answered;
    seqs.extend(&resent);
    assert!(distinct(&seqs), "{seqs:?}");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'fs-1'", []),
        30
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(DISTINCT seq) FROM uplink WHERE device = 'fs-1'",
            []
        ),
        30
    );
}
