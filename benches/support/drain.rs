//! Devices draining their inboxes in a reconnect storm: each a
//! [`DeviceClient`] that confirms every inbox batch as soon as it has it
//! and checks what arrived (seqs 1..=M, contiguous, each message once).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ferry::client::device::{DeviceClient, DeviceEvent};
use tokio::sync::watch;

use super::report::dist;

/// `{msg_prefix}{k}` → k (1-based).
pub fn msg_index(prefix: &str, msg_id: &str) -> Option<u64> {
    msg_id.strip_prefix(prefix)?.parse().ok()
}

/// Counters every device task adds to, read by the sampler.
#[derive(Default)]
pub struct Live {
    pub connected: AtomicU64,
    pub received: AtomicU64,
    pub done: AtomicU64,
}

/// One device's view of the storm (times in ms since the storm began).
#[derive(Default, Debug)]
pub struct DeviceReport {
    pub connected_ms: Option<f64>,
    pub first_msg_ms: Option<f64>,
    pub done_ms: Option<f64>,
    pub connects: u32,
    pub disconnects: u32,
    pub received: u64,
    pub batches: u32,
    pub empty_batches: u32,
    pub duplicates: u64,
    /// A new message whose seq is not the next one (a gap).
    pub seq_errors: u64,
    /// A msg_id not of this run, or one received twice under two seqs.
    pub msg_errors: u64,
    /// Message k arrived with seq ≠ k (possible only if intake reordered).
    pub order_mismatches: u64,
    pub tombstones: u64,
}

pub async fn device_task(
    mut client: DeviceClient,
    per_device: usize,
    msg_prefix: Arc<str>,
    live: Arc<Live>,
    origin: Instant,
    mut stop: watch::Receiver<bool>,
) -> DeviceReport {
    let mut r = DeviceReport::default();
    let mut seen = vec![false; per_device + 1];
    let ms = || origin.elapsed().as_secs_f64() * 1000.0;
    loop {
        let ev = tokio::select! {
            ev = client.events.recv() => ev,
            _ = stop.changed() => break,
        };
        let Some(ev) = ev else { break };
        match ev {
            DeviceEvent::Connected => {
                r.connects += 1;
                if r.connected_ms.is_none() {
                    r.connected_ms = Some(ms());
                    live.connected.fetch_add(1, Ordering::Relaxed);
                }
            }
            DeviceEvent::Disconnected => r.disconnects += 1,
            DeviceEvent::Receipt(_) | DeviceEvent::ConnectionFailed(_) => {}
            DeviceEvent::Inbox {
                messages,
                duplicates,
                ..
            } => {
                r.batches += 1;
                r.duplicates += duplicates as u64;
                let Some(last) = messages.last().map(|m| m.seq) else {
                    r.empty_batches += 1;
                    continue;
                };
                // Committed at once: confirm before counting.
                client.confirm(last);
                if r.first_msg_ms.is_none() {
                    r.first_msg_ms = Some(ms());
                }
                for m in &messages {
                    if m.seq != r.received + 1 {
                        r.seq_errors += 1;
                    }
                    if m.status.is_some() {
                        r.tombstones += 1;
                    }
                    match msg_index(&msg_prefix, &m.msg_id) {
                        Some(k) if (1..=per_device as u64).contains(&k) => {
                            if seen[k as usize] {
                                r.msg_errors += 1;
                            }
                            seen[k as usize] = true;
                            if k != m.seq {
                                r.order_mismatches += 1;
                            }
                        }
                        _ => r.msg_errors += 1,
                    }
                    r.received += 1;
                }
                live.received
                    .fetch_add(messages.len() as u64, Ordering::Relaxed);
                if r.done_ms.is_none() && r.received >= per_device as u64 {
                    r.done_ms = Some(ms());
                    live.done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    r
}

/// Prints when the MQTT 3.1.1 devices and the MQTT 5 devices connected and
/// drained, apart (`speaks_v5(i)`: device i connected with MQTT 5).
pub fn by_version(reports: &[DeviceReport], speaks_v5: impl Fn(usize) -> bool) {
    for (label, v5) in [("MQTT 3.1.1", false), ("MQTT 5", true)] {
        let group: Vec<&DeviceReport> = (reports.iter().enumerate())
            .filter(|(i, _)| speaks_v5(*i) == v5)
            .map(|(_, r)| r)
            .collect();
        let times =
            |f: fn(&DeviceReport) -> Option<f64>| group.iter().filter_map(|r| f(r)).collect();
        dist(
            &format!("{label} connect time"),
            times(|r| r.connected_ms),
            group.len(),
        );
        dist(
            &format!("{label} drained"),
            times(|r| r.done_ms),
            group.len(),
        );
    }
}
