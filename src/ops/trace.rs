//! A message's whole history, both directions, for `ferry trace`.
//!
//! Uplink: every `uplink_history` line (stored, each failed attempt with
//! why, replays, delivered or dead with the reason). Downlink: the
//! message's storing, then its delivery row to the device: the store keeps
//! only a delivery's current state, so its earlier states are not shown.

use rusqlite::{params, Connection};
use serde::Serialize;

use super::{sqlite, OpsError};

/// One step of a message's life.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceEvent {
    pub at_ms: i64,
    /// `up` or `down`.
    pub direction: &'static str,
    /// What happened: `stored`, `attempt failed`, `replayed`, `delivered`,
    /// `dead`, or a downlink delivery state (`stored`, `delivered`,
    /// `read`, `expired`, `dead`).
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
            "SELECT m.stored_ms, d.at_ms, d.state, d.seq FROM down_message m JOIN down_delivery d ON d.message_id = m.id
             WHERE d.device = ?1 AND m.msg_id = ?2",
        )
        .map_err(&read)?;
    let down = stmt
        .query_map(params![device, msg_id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })
        .map_err(&read)?;
    for d in down {
        let (stored_ms, at_ms, state, seq) = d.map_err(&read)?;
        out.push(TraceEvent {
            at_ms: stored_ms,
            direction: "down",
            event: "stored".into(),
            seq: Some(seq),
            detail: None,
        });
        if state != "stored" {
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
