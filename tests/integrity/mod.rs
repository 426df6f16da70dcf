//! The store's hold on its files, through the real binary: one gateway per
//! store whatever becomes of `ferry.pid` (and none at all on a file system
//! without locks), a data directory or database file that vanishes under a
//! running gateway, and an fsync that fails. Each time nothing answered
//! `stored` is missing after a restart.

// The power-loss shim's (built with gcc): the `system-tests` feature's.
#[cfg(feature = "system-tests")]
mod fsync;
mod one_gateway;
mod vanished;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::support::{Device, Ferry};

const SECS_10: Duration = Duration::from_secs(10);

/// Sends `msg_ids` from `device` and waits for a `stored` receipt for
/// each; returns their seqs in order.
async fn stored(device: &mut Device, msg_ids: &[String]) -> Vec<u64> {
    for id in msg_ids {
        device
            .publish_envelope("t", id, serde_json::json!({"id": id}))
            .await;
    }
    let mut seqs = Vec::new();
    for id in msg_ids {
        let (receipt, _) = device.next_receipt_for(id, SECS_10).await;
        let receipt = receipt.unwrap_or_else(|| panic!("no receipt for {id}"));
        assert_eq!(receipt["status"], "stored", "{receipt}");
        seqs.push(receipt["seq"].as_u64().expect("a seq"));
    }
    seqs
}

/// The (device, msg_id) pairs of `keys` the store of `ferry` lacks.
fn missing(ferry: &Ferry, keys: &[(String, String)]) -> Vec<(String, String)> {
    let db = ferry.db();
    keys.iter()
        .filter(|(device, msg_id)| {
            db.query_row(
                "SELECT COUNT(*) FROM uplink WHERE device = ?1 AND msg_id = ?2",
                [device, msg_id],
                |r| r.get::<_, i64>(0),
            )
            .unwrap_or(0)
                == 0
        })
        .cloned()
        .collect()
}

/// Waits up to `timeout` for `event` in ferry's log.
async fn logged(ferry: &Ferry, event: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let needle = format!("event=\"{event}\"");
    while Instant::now() < deadline {
        if ferry.log().contains(&needle) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Whether `seqs` holds no seq twice.
fn distinct(seqs: &[u64]) -> bool {
    seqs.iter().collect::<HashSet<_>>().len() == seqs.len()
}
