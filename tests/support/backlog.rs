//! A north outage's backlog, written straight into a stopped gateway's
//! store in ferry's own schema: hundreds of thousands of stored uplinks in
//! a second or two, where publishing them would take minutes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::json;

use super::clients::{north_topics, NorthMessage};
use super::session::{unique_client_id, Session};

/// Writes `n` stored uplinks of `device` (seq 1..=n, msg_ids `bulk-{seq}`,
/// north envelopes as intake stores them) into the store in `data_dir`.
/// The gateway must be stopped.
pub fn write_uplinks(data_dir: &Path, gateway: &str, device: &str, n: u64) {
    let mut db = rusqlite::Connection::open(data_dir.join("ferry.db")).expect("open the store");
    let tx = db.transaction().expect("begin");
    let now = ferry::protocol::now_ms();
    {
        let mut up = tx
            .prepare(
                "INSERT INTO uplink (device, msg_id, seq, stream, state, body, stored_ms)
                 VALUES (?1, ?2, ?3, 't', 'stored', ?4, ?5)",
            )
            .expect("prepare");
        for seq in 1..=n {
            let msg_id = format!("bulk-{seq}");
            let body = serde_json::to_vec(&json!({
                "gateway": gateway, "device": device, "msg_id": msg_id, "seq": seq,
                "stream": "t", "ts": now - 1000, "stored_ts": now - 1000,
                "payload": "x".repeat(150),
            }))
            .expect("json");
            up.execute(rusqlite::params![
                device,
                msg_id,
                seq as i64,
                body,
                now - 1000
            ])
            .expect("insert uplink");
        }
        tx.execute(
            "INSERT INTO devices (device, up_seq) VALUES (?1, ?2)
             ON CONFLICT (device) DO UPDATE SET up_seq = excluded.up_seq",
            rusqlite::params![device, n as i64],
        )
        .expect("devices");
    }
    tx.commit().expect("commit");
}

/// An observer on the upstream while a backlog of `bulk…` devices drains:
/// counts their messages as they arrive, and stamps every other message
/// with when it came and how many backlog messages had come by then.
pub struct Arrivals {
    bulk: Arc<AtomicU64>,
    stamps: Arc<Mutex<HashMap<String, (Instant, u64)>>>,
    _session: Session,
}

impl Arrivals {
    /// Subscribes to `gateway`'s uplinks on the upstream at `port`.
    pub async fn watch(port: u16, gateway: &str) -> Arrivals {
        let bulk = Arc::new(AtomicU64::new(0));
        let stamps: Arc<Mutex<HashMap<String, (Instant, u64)>>> = Arc::default();
        let hook = {
            let bulk = bulk.clone();
            let stamps = stamps.clone();
            Box::new(move |m: &ferry::mqtt::Message| {
                if m.topic.contains("/up/bulk") {
                    bulk.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let msg = NorthMessage::from_publish(m);
                let seen = bulk.load(Ordering::Relaxed);
                stamps
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(msg.msg_id().to_string())
                    .or_insert((Instant::now(), seen));
            })
        };
        let session = Session::connect(
            &unique_client_id("observer"),
            port,
            vec![north_topics(gateway).up_filter()],
            true,
            Some(hook),
        )
        .await;
        Arrivals {
            bulk,
            stamps,
            _session: session,
        }
    }

    /// Backlog messages arrived so far.
    pub fn bulk_seen(&self) -> u64 {
        self.bulk.load(Ordering::Relaxed)
    }

    /// Each other message by msg_id: when it first arrived, and the
    /// backlog messages arrived by then.
    pub fn stamps(&self) -> HashMap<String, (Instant, u64)> {
        self.stamps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
