//! Devices flooding the store at full speed: the store does not overshoot
//! its disk budget by what arrives between two measures. The use is read
//! as the budget reads it (pages in use plus the WAL file) by a reader of
//! the test's own, many times a second, while the flood goes on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::support::{self, boot_id, Device, Ferry, FerryOpts};

/// Pages in use plus the WAL file, as a reader sees them now.
fn used(ferry: &Ferry) -> u64 {
    let db = ferry.db();
    let pragma = |name: &str| -> u64 {
        db.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
            .map_or(0, |v| v.max(0) as u64)
    };
    let pages = pragma("page_count").saturating_sub(pragma("freelist_count"));
    let wal = std::fs::metadata(ferry.data_dir.join("ferry.db-wal")).map_or(0, |m| m.len());
    pages * pragma("page_size") + wal
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_flooding_at_full_speed_take_the_store_no_further_than_a_twentieth_past_its_budget()
{
    let mosquitto = support::Mosquitto::start();
    let budget: u64 = 4 << 20;
    let opts = FerryOpts::new("gw-over", mosquitto.port).with(|c| {
        c.store.max_db_bytes = budget;
        c.retry.max_attempts = 100_000;
        c.south.rate_per_s = 100_000.0;
        c.south.burst = 100_000;
    });
    let ferry = Arc::new(Ferry::start(opts));
    let boot = boot_id();
    let flooding = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (ferry, flooding) = (ferry.clone(), flooding.clone());
        tokio::task::spawn_blocking(move || {
            let mut most = 0;
            while flooding.load(Ordering::Relaxed) {
                most = most.max(used(&ferry));
                std::thread::sleep(Duration::from_millis(10));
            }
            most.max(used(&ferry))
        })
    };
    // Four devices, 300 uplinks of 20 kB each, sent without waiting: 24 MB
    // at the door of a 4 MiB store.
    let blob = "x".repeat(20_000);
    let mut devices = Vec::new();
    for d in 0..4 {
        devices.push(Device::connect(ferry.south_port, &format!("flood-{d}")).await);
    }
    for i in 0..300 {
        for (d, device) in devices.iter().enumerate() {
            let id = format!("{boot}-{d}-{i:03}");
            device
                .publish_envelope("t", &id, json!({ "blob": blob }))
                .await;
        }
    }
    // Every one answered: stored until the budget, refused after.
    let (mut stored, mut refused) = (0, 0);
    for device in &mut devices {
        let got = device
            .receipts_until(Duration::from_secs(60), |r| r.len() >= 300)
            .await;
        assert_eq!(got.len(), 300, "{}", ferry.log_tail());
        stored += got.iter().filter(|r| r["status"] == "stored").count();
        refused += got
            .iter()
            .filter(|r| {
                r["reason"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("disk_budget"))
            })
            .count();
    }
    flooding.store(false, Ordering::Relaxed);
    let most = watcher.await.expect("the watcher");
    eprintln!("budget {budget}, most {most}, stored {stored}, refused {refused}");
    assert_eq!(stored + refused, 1200);
    assert!(
        refused > 0 && stored > 50,
        "stored {stored}, refused {refused}"
    );
    assert!(
        most <= budget + budget / 20,
        "the store reached {most} bytes against a budget of {budget}\n{}",
        ferry.log_tail()
    );
}
