//! A north outage's backlog, written straight into a stopped gateway's
//! store in ferry's own schema: hundreds of thousands of stored uplinks in
//! a second or two, where publishing them would take minutes.

use std::path::Path;

use serde_json::json;

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
