//! A message's whole history, both directions, for `ferry trace`.
//!
//! Uplink: when ferry received the device's publish (`uplink.received_ms`),
//! when it was stored (`stored_ms`), every `uplink_history` line (each
//! failed attempt with why, replays, dead with the reason), and when it
//! was delivered (`done_ms`). An older ferry wrote `stored` and
//! `delivered` as history lines too; those are read as they are. Downlink: when ferry
//! received the backend's publish (`down_message.received_ms`), then every
//! `down_history` line of the message's delivery to the device (stored,
//! delivered, read, expired or dead with why). A message stored before
//! schema 8 has no receipt time and no `received` line.
//!
//! A delivered message the disk budget pruned before its retention left
//! only its dedup key (`uplink_key`, `down_key`): its trace is one line,
//! its final state at the time it was reached, saying so.
//!
//! Lines are in time order; a `received` line is never after the `stored`
//! line of its message (it is taken first, and listed first on a tie).

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

use super::{sqlite, OpsError};
use crate::dead_letter::Direction;

/// One step of a message's life.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceEvent {
    pub at_ms: i64,
    pub direction: Direction,
    /// What happened: `received` (ferry took the publish, device's or
    /// backend's, before committing it), then for an uplink `stored`,
    /// `attempt failed`, `replayed`, `delivered (backend ack)`, `dead`, or
    /// for a downlink its delivery's state (`stored`, `delivered`, `read`,
    /// `expired`, `dead`).
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

/// The detail of a line read from a dedup key.
pub const PRUNED_KEY_ONLY: &str = "pruned at the disk budget before its retention: only its dedup key is kept (store.min_dedup_s), and a resend is answered with this seq";

/// An uplink's own row, as the trace reads it.
struct UplinkRow {
    received_ms: Option<i64>,
    seq: i64,
    stored_ms: i64,
    state: String,
    done_ms: Option<i64>,
    /// It has `stored` as a history line (an older ferry wrote one).
    stored_line: bool,
    /// It has `delivered` as a history line (an older ferry wrote one).
    delivered_line: bool,
}

/// Everything known of `(device, msg_id)`, oldest first.
pub fn trace(conn: &Connection, device: &str, msg_id: &str) -> Result<Vec<TraceEvent>, OpsError> {
    let read = sqlite("cannot read the history");
    let mut out = Vec::new();
    // The row: when it was received, stored and (if so) delivered. A
    // normal life writes no history lines (see `store::uplink::history`),
    // so `stored` and `delivered` come from here, unless an older ferry
    // stored the message and wrote them as lines.
    let row = conn
        .query_row(
            "SELECT u.received_ms, u.seq, u.stored_ms, u.state, u.done_ms,
                 EXISTS (SELECT 1 FROM uplink_history h WHERE h.uplink_id = u.id AND h.state = 'stored' AND h.detail IS NULL),
                 EXISTS (SELECT 1 FROM uplink_history h WHERE h.uplink_id = u.id AND h.state = 'delivered')
             FROM uplink u WHERE u.device = ?1 AND u.msg_id = ?2",
            params![device, msg_id],
            |r| {
                Ok(UplinkRow {
                    received_ms: r.get(0)?,
                    seq: r.get(1)?,
                    stored_ms: r.get(2)?,
                    state: r.get(3)?,
                    done_ms: r.get(4)?,
                    stored_line: r.get(5)?,
                    delivered_line: r.get(6)?,
                })
            },
        )
        .optional()
        .map_err(&read)?;
    if let Some(u) = &row {
        if let Some(at_ms) = u.received_ms {
            out.push(received_line(Direction::Up, at_ms, Some(u.seq)));
        }
        if !u.stored_line {
            out.push(TraceEvent {
                at_ms: u.stored_ms,
                direction: Direction::Up,
                event: "stored".into(),
                seq: Some(u.seq),
                detail: None,
            });
        }
    }
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
                direction: Direction::Up,
                event: event_name(&state, detail.as_deref()),
                seq: r.get(3)?,
                detail,
            })
        })
        .map_err(&read)?;
    for e in up {
        out.push(e.map_err(&read)?);
    }
    if let Some(u) = &row {
        if let (false, "delivered", Some(at_ms)) = (u.delivered_line, u.state.as_str(), u.done_ms) {
            out.push(TraceEvent {
                at_ms,
                direction: Direction::Up,
                event: event_name("delivered", None),
                seq: Some(u.seq),
                detail: None,
            });
        }
    }
    if row.is_none() {
        let key = conn
            .query_row(
                "SELECT seq, done_ms FROM uplink_key WHERE device = ?1 AND msg_id = ?2",
                params![device, msg_id],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
            )
            .optional()
            .map_err(&read)?;
        out.extend(
            key.map(|(seq, at_ms)| {
                pruned_line(Direction::Up, at_ms, seq, "delivered (backend ack)")
            }),
        );
    }
    let mut stmt = conn
        .prepare(
            "SELECT d.seq, d.state, d.at_ms, m.received_ms FROM down_message m JOIN down_delivery d ON d.message_id = m.id
             WHERE d.device = ?1 AND m.msg_id = ?2",
        )
        .map_err(&read)?;
    let deliveries: Vec<(i64, String, i64, Option<i64>)> = stmt
        .query_map(params![device, msg_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .map_err(&read)?
        .collect::<rusqlite::Result<_>>()
        .map_err(&read)?;
    if deliveries.is_empty() {
        let mut keys = conn
            .prepare("SELECT seq, state, done_ms FROM down_key WHERE device = ?1 AND msg_id = ?2")
            .map_err(&read)?;
        let kept = keys
            .query_map(params![device, msg_id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
            .map_err(&read)?;
        for k in kept {
            let (seq, state, at_ms) = k.map_err(&read)?;
            out.push(pruned_line(Direction::Down, at_ms, seq, &state));
        }
    }
    let mut stmt = conn
        .prepare(
            "SELECT at_ms, state, detail FROM down_history WHERE device = ?1 AND seq = ?2 ORDER BY at_ms, rowid",
        )
        .map_err(&read)?;
    for (seq, state, at_ms, received_ms) in deliveries {
        if let Some(received_ms) = received_ms {
            out.push(received_line(Direction::Down, received_ms, Some(seq)));
        }
        let before = out.len();
        let lines = stmt
            .query_map(params![device, seq], |r| {
                let state: String = r.get(1)?;
                let detail: Option<String> = r.get(2)?;
                let replayed = state == "stored"
                    && detail.as_deref().is_some_and(|d| d.starts_with("replayed"));
                Ok(TraceEvent {
                    at_ms: r.get(0)?,
                    direction: Direction::Down,
                    event: if replayed { "replayed".into() } else { state },
                    seq: Some(seq),
                    detail,
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
                direction: Direction::Down,
                event: state,
                seq: Some(seq),
                detail: None,
            });
        }
    }
    // Stable: on a tie, a `received` line stays before its `stored`.
    out.sort_by_key(|e| e.at_ms);
    Ok(out)
}

/// What a dedup key says of a message pruned early: `event` at `at_ms`.
fn pruned_line(direction: Direction, at_ms: i64, seq: i64, event: &str) -> TraceEvent {
    TraceEvent {
        at_ms,
        direction,
        event: event.into(),
        seq: Some(seq),
        detail: Some(PRUNED_KEY_ONLY.into()),
    }
}

fn received_line(direction: Direction, at_ms: i64, seq: Option<i64>) -> TraceEvent {
    TraceEvent {
        at_ms,
        direction,
        event: "received".into(),
        seq,
        detail: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::store::migrate(&mut conn).unwrap();
        conn.execute_batch(
            "INSERT INTO uplink (id, device, msg_id, seq, stream, state, body, stored_ms, received_ms)
               VALUES (1, 'd', 'new', 1, 't', 'stored', '{}', 1000, 1000),
                      (2, 'd', 'old', 2, 't', 'stored', '{}', 2000, NULL);
             INSERT INTO uplink_history VALUES (1, 1000, 'stored', NULL), (2, 2000, 'stored', NULL);
             INSERT INTO down_message (id, msg_id, body, stored_ms, received_ms) VALUES (1, 'down', '{}', 3000, 2990);
             INSERT INTO down_delivery (device, seq, message_id, state, at_ms) VALUES ('d', 1, 1, 'stored', 3000);
             INSERT INTO down_history VALUES ('d', 1, 3000, 'stored', NULL);",
        )
        .unwrap();
        conn
    }

    fn events(conn: &Connection, msg_id: &str) -> Vec<(&'static str, String, i64)> {
        trace(conn, "d", msg_id)
            .unwrap()
            .into_iter()
            .map(|e| (e.direction.as_str(), e.event, e.at_ms))
            .collect()
    }

    #[test]
    fn received_comes_first_even_in_the_same_millisecond_as_stored() {
        let conn = store();
        assert_eq!(
            events(&conn, "new"),
            [
                ("up", "received".into(), 1000),
                ("up", "stored".into(), 1000)
            ]
        );
        assert_eq!(
            events(&conn, "down"),
            [
                ("down", "received".into(), 2990),
                ("down", "stored".into(), 3000)
            ]
        );
    }

    #[test]
    fn a_message_stored_before_schema_8_has_no_received_line() {
        let conn = store();
        assert_eq!(events(&conn, "old"), [("up", "stored".into(), 2000)]);
    }

    #[test]
    fn stored_and_delivered_come_from_the_row_when_no_line_says_them() {
        let conn = store();
        conn.execute_batch(
            "INSERT INTO uplink (id, device, msg_id, seq, stream, state, body, stored_ms, received_ms, done_ms)
               VALUES (3, 'd', 'lean', 3, 't', 'delivered', '{}', 4000, 3999, 6000),
                      (4, 'd', 'older', 4, 't', 'delivered', '{}', 7000, 7000, 8000);
             INSERT INTO uplink_history VALUES (3, 5000, 'stored', 'attempt 1 failed: ack timeout');
             INSERT INTO uplink_history VALUES (4, 7000, 'stored', NULL), (4, 8000, 'delivered', NULL);",
        )
        .unwrap();
        assert_eq!(
            events(&conn, "lean"),
            [
                ("up", "received".into(), 3999),
                ("up", "stored".into(), 4000),
                ("up", "attempt failed".into(), 5000),
                ("up", "delivered (backend ack)".into(), 6000)
            ]
        );
        // An older ferry's lines are read as they are, never twice.
        assert_eq!(
            events(&conn, "older"),
            [
                ("up", "received".into(), 7000),
                ("up", "stored".into(), 7000),
                ("up", "delivered (backend ack)".into(), 8000)
            ]
        );
    }

    #[test]
    fn a_message_pruned_early_is_traced_from_its_dedup_key() {
        let conn = store();
        conn.execute_batch(
            "INSERT INTO uplink_key VALUES ('d', 'gone-up', 7, 9000, 9000);
             INSERT INTO down_key VALUES ('gone-down', 'd', 3, 'read', 9500, 9500);
             INSERT INTO down_key VALUES ('gone-down', 'other', 4, 'delivered', 9600, 9600);",
        )
        .unwrap();
        let up = trace(&conn, "d", "gone-up").unwrap();
        assert_eq!(
            up,
            [TraceEvent {
                at_ms: 9000,
                direction: Direction::Up,
                event: "delivered (backend ack)".into(),
                seq: Some(7),
                detail: Some(PRUNED_KEY_ONLY.into()),
            }]
        );
        let down = trace(&conn, "d", "gone-down").unwrap();
        assert_eq!(
            down,
            [TraceEvent {
                at_ms: 9500,
                direction: Direction::Down,
                event: "read".into(),
                seq: Some(3),
                detail: Some(PRUNED_KEY_ONLY.into()),
            }],
            "only this device's delivery"
        );
        // A row still there is traced from the row, never from a key.
        conn.execute_batch("INSERT INTO uplink_key VALUES ('d', 'new', 99, 1, 1);")
            .unwrap();
        assert_eq!(events(&conn, "new").len(), 2);
        assert!(trace(&conn, "d", "new")
            .unwrap()
            .iter()
            .all(|e| e.detail.is_none()));
    }
}
