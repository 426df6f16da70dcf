//! The uplink path end to end: devices on ferry's south broker, the real
//! `ferry` binary, a real Mosquitto upstream and a backend client on it.
//!
//! Each test starts its own Mosquitto and ferry on free ports and checks one
//! behaviour of docs/PROTOCOL.md from the outside: receipts on
//! `devices/{id}/ack`, messages on `ferry/{gateway}/up/...`, and rows in the
//! store. Helpers are here; the tests are in one file per theme.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::receipts::status;
use crate::support::{
    boot_id, north_topics, Backend, Device, Ferry, FerryOpts, Mode, Mosquitto, NorthMessage,
};
use ferry::ids::DeviceId;

mod acked;
mod backend;
mod batch;
mod delivery;
mod failover;
mod fairness;
mod props;
mod restarts;
mod retries;
mod stages;
mod stalled;

const SECS_5: Duration = Duration::from_secs(5);
const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

/// How many distinct msg_ids have a receipt with `wanted` status.
fn ids_with_status(receipts: &[Value], wanted: &str) -> usize {
    receipts
        .iter()
        .filter(|r| status(r) == wanted)
        .filter_map(|r| r["msg_id"].as_str())
        .collect::<HashSet<_>>()
        .len()
}

/// The receipts for one msg_id, in arrival order.
fn receipts_for<'a>(receipts: &'a [Value], msg_id: &str) -> Vec<&'a Value> {
    receipts.iter().filter(|r| r["msg_id"] == msg_id).collect()
}

/// Distinct (device, msg_id) pairs the backend has seen.
fn distinct_north(messages: &[NorthMessage]) -> usize {
    messages
        .iter()
        .map(|m| (m.device().to_string(), m.msg_id().to_string()))
        .collect::<HashSet<_>>()
        .len()
}

/// Checks that every msg_id got `stored` and then `delivered` with the same
/// seq, and nothing else; returns msg_id → seq.
fn assert_stored_then_delivered(
    device: &str,
    msg_ids: &[String],
    receipts: &[Value],
) -> HashMap<String, u64> {
    let mut seqs = HashMap::new();
    for id in msg_ids {
        let mine = receipts_for(receipts, id);
        let stored = mine.iter().position(|r| status(r) == "stored");
        let delivered = mine.iter().position(|r| status(r) == "delivered");
        let (Some(stored), Some(delivered)) = (stored, delivered) else {
            panic!("{device}/{id}: expected `stored` and `delivered`, got {mine:?}");
        };
        assert!(
            stored < delivered,
            "{device}/{id}: `delivered` came before `stored`: {mine:?}"
        );
        let seq = mine[stored]["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("{device}/{id}: `stored` without a u64 seq: {mine:?}"));
        assert!(seq >= 1, "{device}/{id}: seq must be ≥ 1, got {seq}");
        assert_eq!(
            mine[delivered]["seq"].as_u64(),
            Some(seq),
            "{device}/{id}: `delivered` seq differs from `stored` seq: {mine:?}"
        );
        assert!(
            mine.iter()
                .all(|r| matches!(status(r), "stored" | "delivered")),
            "{device}/{id}: unexpected receipt: {mine:?}"
        );
        seqs.insert(id.clone(), seq);
    }
    let distinct: HashSet<_> = seqs.values().collect();
    assert_eq!(
        distinct.len(),
        seqs.len(),
        "{device}: two messages share a seq: {seqs:?}"
    );
    seqs
}

/// Waits for `delivered` for every msg_id of each device (receipts so far
/// are kept in `receipts`) and checks the receipts.
async fn assert_all_delivered(
    devices: &mut [Device],
    ids: &[Vec<String>],
    receipts: &mut [Vec<Value>],
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    for (d, device) in devices.iter_mut().enumerate() {
        let want = ids[d].len();
        let have = ids_with_status(&receipts[d], "delivered");
        let left = deadline.saturating_duration_since(Instant::now());
        let got = device
            .receipts_until(left, |all| have + ids_with_status(all, "delivered") >= want)
            .await;
        receipts[d].extend(got);
        assert_eq!(
            ids_with_status(&receipts[d], "delivered"),
            want,
            "{}: every message is `delivered`",
            device.id
        );
        assert_stored_then_delivered(&device.id, &ids[d], &receipts[d]);
    }
}
