//! A message's whole history, both directions, for `ferry trace`.
//!
//! Uplink: every `uplink_history` line (stored, each failed attempt with
//! why, replays, delivered or dead with the reason). Downlink: every
//! `down_history` line of the message's delivery to the device (stored,
//! delivered, read, expired or dead with why).

use rusqlite::{params, Connection};
use serde::Serialize;

use super::{sqlite, OpsError};

/// One step of a message's life.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceEvent {
    pub at_ms: i64,
    /// `up` or `down`.
    pub direction: &'static str,
    /// What happened: `stored`, `attempt failed`, `replayed`, `delivered
    /// (backend ack)`, `dead`, or a downlink delivery's state (`stored`,
    /// `delivered`, `read`, `expired`, `dead`).
    pub event: String,
    pub seq: Option<i64>,
    pub detail: Option<String>,
}

/// Names a history line: the store writes `stored` for the first store,
/// for each counted failed attempt ("attempt N failed: …") and for a
/// replay ("replayed: …").
pub fn event_name(state: &str, detail: Option<&str>) -> String {
    match (state, detail) {
        ("stored", Some(d)) if d.starts_with("attempt ") => "attempt failed".into(),
        ("stored", Some(d)) if d.starts_with("replayed") => "replayed".into(),
        ("delivered", _) => "delivered (backend ack)".into(),
        ("dead", Some(d)) if d.starts_with("nacked") => "dead (backend nack)".into(),
        (s, _) => s.to_string(),
    }
}

/// Everything known of `(device, msg_id)`, oldest first.
pub fn trace(conn: &Connection, device: &str, msg_id: &str) -> Result<Vec<TraceEvent>, OpsError> {
    let read = sqlite("cannot read the history");
    let mut out = Vec::new();
    let mut stmt = conn
        .prepare(
            "SELECT h.at_ms, h.state, h.detail, u.seq FROM uplink u JOIN uplink_history h ON h.uplink_id = u.id
             WHERE u.device = ?1 AND u.msg_id = ?2 ORDER BY h.at_ms, h.rowid",
        )
        .map_err(&read)?;
    let up = stmt
        .query_map(params![device, msg_id], |r| {
            let state: String = r.get(1)?;
            let detail: Option<String> = r.get(2)?;
            Ok(TraceEvent {
                at_ms: r.get(0)?,
                direction: "up",
                event: event_name(&state, detail.as_deref()),
                seq: r.get(3)?,
                detail,
            })
        })
        .map_err(&read)?;
    for e in up {
        out.push(e.map_err(&read)?);
    }
    let mut stmt = conn
        .prepare(
            "SELECT d.seq, d.state, d.at_ms FROM down_message m JOIN down_delivery d ON d.message_id = m.id
             WHERE d.device = ?1 AND m.msg_id = ?2",
        )
        .map_err(&read)?;
    let deliveries: Vec<(i64, String, i64)> = stmt
        .query_map(params![device, msg_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .map_err(&read)?
        .collect::<rusqlite::Result<_>>()
        .map_err(&read)?;
    let mut stmt = conn
        .prepare(
            "SELECT at_ms, state, detail FROM down_history WHERE device = ?1 AND seq = ?2 ORDER BY at_ms, rowid",
        )
        .map_err(&read)?;
    for (seq, state, at_ms) in deliveries {
        let before = out.len();
        let lines = stmt
            .query_map(params![device, seq], |r| {
                Ok(TraceEvent {
                    at_ms: r.get(0)?,
                    direction: "down",
                    event: r.get(1)?,
                    seq: Some(seq),
                    detail: r.get(2)?,
                })
            })
            .map_err(&read)?;
        for e in lines {
            out.push(e.map_err(&read)?);
        }
        if out.len() == before {
            // Stored before deliveries had a history: its state now.
            out.push(TraceEvent {
                at_ms,
                direction: "down",
                event: state,
                seq: Some(seq),
                detail: None,
            });
        }
    }
    out.sort_by_key(|e| e.at_ms);
    Ok(out)
}
