//! Dead letters: list, show, replay, purge.
//!
//! A dead letter that references a stored uplink (`uplink_id`: nacked,
//! retries exhausted, expired) can be replayed: in one transaction its
//! message goes back to `stored` with fresh attempts and no ttl, keeping
//! its msg_id, seq and body, its history gets a `replayed` line, a
//! `replay_request` tells the running gateway to load it, and the dead
//! letter is removed (a new one is written if it dies again). Anything
//! else is refused with the reason (a message rejected at the door was
//! never stored) except a downlink delivery its device nacked: that one goes
//! again under a new seq, through the gateway (see `down.rs`).

use base64::Engine as _;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;

use super::{sqlite, OpsError};
use crate::dead_letter::Direction;

/// One dead letter, as `dlq list` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeadLetterRow {
    pub id: i64,
    pub device: Option<String>,
    pub msg_id: Option<String>,
    pub direction: Direction,
    pub reason: String,
    pub attempts: u32,
    /// The first failed attempt, or the dead-lettering if none failed before.
    pub first_failure_ms: i64,
    /// When it was dead-lettered.
    pub last_failure_ms: i64,
    /// Whether `dlq replay` can send it again.
    pub replayable: bool,
}

/// What `dlq list` keeps.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub device: Option<String>,
    /// Dead letters whose reason starts with this (e.g. `nacked`).
    pub reason: Option<String>,
    pub direction: Option<Direction>,
}

const ROW_SQL: &str = "SELECT d.id, d.device, d.msg_id, d.direction, d.reason, d.attempts,
        coalesce((SELECT min(h.at_ms) FROM uplink_history h
                  WHERE h.uplink_id = d.uplink_id AND h.state = 'stored' AND h.detail LIKE 'attempt %'), d.at_ms),
        d.at_ms,
        (d.uplink_id IS NOT NULL AND coalesce((SELECT u.state = 'dead' FROM uplink u WHERE u.id = d.uplink_id), 0))
        OR (d.direction = 'down' AND d.topic LIKE 'seq %' AND coalesce((
            SELECT x.state = 'dead' AND v.delivered_upto >= x.seq FROM down_delivery x JOIN devices v ON v.device = x.device
            WHERE x.device = d.device AND x.seq = CAST(substr(d.topic, 5) AS INTEGER)), 0))
    FROM dead_letter d";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<DeadLetterRow> {
    Ok(DeadLetterRow {
        id: r.get(0)?,
        device: r.get(1)?,
        msg_id: r.get(2)?,
        direction: r.get(3)?,
        reason: r.get(4)?,
        attempts: r.get(5)?,
        first_failure_ms: r.get(6)?,
        last_failure_ms: r.get(7)?,
        replayable: r.get(8)?,
    })
}

/// The dead letters `filter` keeps, oldest first.
pub fn list(conn: &Connection, filter: &Filter) -> Result<Vec<DeadLetterRow>, OpsError> {
    list_page(conn, filter, Page::After(0), None)
}

/// Which dead letters a page of [`list_page`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// Those with an id above this, oldest first.
    After(i64),
    /// The newest, newest first.
    Newest,
}

/// Up to `limit` of the dead letters `filter` keeps, in `page` (the admin
/// API pages through them).
pub fn list_page(
    conn: &Connection,
    filter: &Filter,
    page: Page,
    limit: Option<usize>,
) -> Result<Vec<DeadLetterRow>, OpsError> {
    let (after, order) = match page {
        Page::After(after) => (after, "ASC"),
        Page::Newest => (i64::MIN, "DESC"),
    };
    let sql = format!(
        "{ROW_SQL} WHERE (?1 IS NULL OR d.device = ?1) AND (?2 IS NULL OR substr(d.reason, 1, length(?2)) = ?2)
         AND (?3 IS NULL OR d.direction = ?3) AND d.id > ?4 ORDER BY d.id {order} LIMIT ?5"
    );
    let read = sqlite("cannot read the dead letters");
    let mut stmt = conn.prepare(&sql).map_err(&read)?;
    let rows = stmt
        .query_map(
            params![
                filter.device,
                filter.reason,
                filter.direction.map(Direction::as_str),
                after,
                limit.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX))
            ],
            row,
        )
        .map_err(&read)?;
    rows.collect::<rusqlite::Result<_>>().map_err(read)
}

/// A payload for people: its text if it is UTF-8, else base64.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Payload {
    /// `utf8` or `base64`.
    pub encoding: &'static str,
    pub data: String,
    pub bytes: usize,
}

impl Payload {
    pub fn of(raw: &[u8]) -> Payload {
        // A head a dead letter kept may end inside a character: text up to
        // there is still text.
        let text = std::str::from_utf8(raw).or_else(|e| match e.error_len() {
            None => std::str::from_utf8(&raw[..e.valid_up_to()]),
            Some(_) => Err(e),
        });
        match text {
            Ok(text) => Payload {
                encoding: "utf8",
                data: text.to_string(),
                bytes: raw.len(),
            },
            Err(_) => Payload {
                encoding: "base64",
                data: base64::engine::general_purpose::STANDARD.encode(raw),
                bytes: raw.len(),
            },
        }
    }
}

/// Everything about one dead letter, as `dlq show` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeadLetterDetail {
    #[serde(flatten)]
    pub row: DeadLetterRow,
    pub topic: Option<String>,
    pub last_error: Option<String>,
    /// The stored uplink it references, if any.
    pub uplink_id: Option<i64>,
    pub seq: Option<i64>,
    /// That uplink's state now.
    pub message_state: Option<String>,
    /// What it keeps of the payload: all of it, or (a refusal at the door
    /// larger than that, or a message that died) its first bytes.
    pub payload: Payload,
    /// The payload's size as sent, when known (`payload` may be its head).
    pub payload_bytes: Option<i64>,
    /// The SHA-256 of the whole payload as sent (refusals at the door).
    pub payload_sha256: Option<String>,
    /// The topic's size as sent (`topic` may be its head).
    pub topic_bytes: Option<i64>,
    /// How many refusals the row stands for: 1, or more for a summary of a
    /// peer past its dead-letter share (its latest in `last_error`).
    pub refusals: i64,
    /// A summary's latest refusal.
    pub last_refusal_ms: Option<i64>,
}

/// One dead letter; `None` if there is none with that id.
pub fn show(conn: &Connection, id: i64) -> Result<Option<DeadLetterDetail>, OpsError> {
    let read = sqlite("cannot read the dead letter");
    let sql = format!("{ROW_SQL} WHERE d.id = ?1");
    let Some(base) = conn.query_row(&sql, [id], row).optional().map_err(&read)? else {
        return Ok(None);
    };
    let detail = conn
        .query_row(
            "SELECT d.topic, d.last_error, d.uplink_id, CAST(d.raw AS BLOB), u.seq, u.state,
                    d.raw_bytes, d.raw_sha256, d.topic_bytes, d.refusals, d.last_ms
             FROM dead_letter d LEFT JOIN uplink u ON u.id = d.uplink_id WHERE d.id = ?1",
            [id],
            |r| {
                Ok(DeadLetterDetail {
                    row: base.clone(),
                    topic: r.get(0)?,
                    last_error: r.get(1)?,
                    uplink_id: r.get(2)?,
                    payload: Payload::of(&r.get::<_, Vec<u8>>(3)?),
                    seq: r.get(4)?,
                    message_state: r.get(5)?,
                    payload_bytes: r.get(6)?,
                    payload_sha256: r.get(7)?,
                    topic_bytes: r.get(8)?,
                    refusals: r.get(9)?,
                    last_refusal_ms: r.get(10)?,
                })
            },
        )
        .map_err(read)?;
    Ok(Some(detail))
}

/// What became of one dead letter `dlq replay` was asked to send again.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Replayed {
    pub id: i64,
    pub replayed: bool,
    pub device: Option<String>,
    pub msg_id: Option<String>,
    /// An uplink's seq (kept); `None` for a downlink delivery, whose new
    /// seq the gateway gives when it takes the replay.
    pub seq: Option<i64>,
    /// Why it was not replayed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// The ids `dlq replay --all [--device D]` means: every replayable one.
pub fn replayable_ids(conn: &Connection, device: Option<&str>) -> Result<Vec<i64>, OpsError> {
    let filter = Filter {
        device: device.map(str::to_string),
        ..Filter::default()
    };
    Ok(list(conn, &filter)?
        .into_iter()
        .filter(|r| r.replayable)
        .map(|r| r.id)
        .collect())
}

/// The dead letter a replay starts from.
struct Found {
    device: Option<String>,
    msg_id: Option<String>,
    direction: Direction,
    reason: String,
    uplink_id: Option<i64>,
    topic: Option<String>,
}

/// Sends dead letter `id` back into the pipeline (see the module doc), in
/// one transaction of its own. A refusal is an answer, not an error.
pub fn replay(conn: &mut Connection, id: i64, now_ms: i64) -> Result<Replayed, OpsError> {
    let write = sqlite("cannot replay");
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&write)?;
    let found = tx
        .query_row(
            "SELECT device, msg_id, direction, reason, uplink_id, topic FROM dead_letter WHERE id = ?1",
            [id],
            |r| {
                Ok(Found {
                    device: r.get(0)?,
                    msg_id: r.get(1)?,
                    direction: r.get(2)?,
                    reason: r.get(3)?,
                    uplink_id: r.get(4)?,
                    topic: r.get(5)?,
                })
            },
        )
        .optional()
        .map_err(&write)?;
    let refused = |device, msg_id, why: String| Replayed {
        id,
        replayed: false,
        device,
        msg_id,
        seq: None,
        refused: Some(why),
    };
    let Some(Found {
        device,
        msg_id,
        direction,
        reason,
        uplink_id,
        topic,
    }) = found
    else {
        return Ok(refused(None, None, format!("no dead letter {id}")));
    };
    if direction == Direction::Down {
        let why = match down::seq_of(topic.as_deref()) {
            Some(seq) => down::check(&tx, device.as_deref(), seq).map_err(&write)?,
            None => Some(format!("refused at the door ({reason}): it was never stored; the backend must send it again")),
        };
        if let Some(why) = why {
            return Ok(refused(device, msg_id, why));
        }
        tx.execute(
            "INSERT INTO down_replay_request (dead_letter_id, at_ms) VALUES (?1, ?2)
             ON CONFLICT (dead_letter_id) DO NOTHING",
            params![id, now_ms],
        )
        .map_err(&write)?;
        tx.commit().map_err(write)?;
        // The new seq is the gateway's to give, when it takes the request.
        return Ok(Replayed {
            id,
            replayed: true,
            device,
            msg_id,
            seq: None,
            refused: None,
        });
    }
    let Some(uplink_id) = uplink_id else {
        let why = format!("rejected at the door ({reason}): it was never stored, so there is nothing to resend; the device must send it again");
        return Ok(refused(device, msg_id, why));
    };
    // Fresh attempts; no ttl, or an expired message would die again at once.
    let seq: Option<i64> = tx
        .query_row(
            "UPDATE uplink SET state = 'stored', attempts = 0, next_attempt_ms = NULL, expires_ms = NULL
             WHERE id = ?1 AND state = 'dead' RETURNING seq",
            [uplink_id],
            |r| r.get(0),
        )
        .optional()
        .map_err(&write)?;
    let Some(seq) = seq else {
        return Ok(refused(
            device,
            msg_id,
            "its message is no longer dead (replayed already?)".into(),
        ));
    };
    tx.execute(
        "INSERT INTO uplink_history (uplink_id, at_ms, state, detail) VALUES (?1, ?2, 'stored', ?3)",
        params![uplink_id, now_ms, format!("replayed: dead letter {id} ({reason})")],
    )
    .map_err(&write)?;
    tx.execute(
        "INSERT INTO replay_request (uplink_id, at_ms) VALUES (?1, ?2)
         ON CONFLICT (uplink_id) DO UPDATE SET at_ms = excluded.at_ms",
        params![uplink_id, now_ms],
    )
    .map_err(&write)?;
    tx.execute("DELETE FROM dead_letter WHERE id = ?1", [id])
        .map_err(&write)?;
    tx.commit().map_err(write)?;
    Ok(Replayed {
        id,
        replayed: true,
        device,
        msg_id,
        seq: Some(seq),
        refused: None,
    })
}

/// Dead letters removed per transaction: the gateway's writer waits at
/// most one batch.
const PURGE_BATCH: i64 = 1000;

/// Deletes the dead letters written before `before_ms`; returns how many.
pub fn purge(conn: &Connection, before_ms: i64) -> Result<u64, OpsError> {
    let write = sqlite("cannot purge the dead letters");
    let mut total = 0u64;
    loop {
        let n = conn
            .execute(
                "DELETE FROM dead_letter WHERE id IN
                 (SELECT id FROM dead_letter WHERE at_ms < ?1 ORDER BY id LIMIT ?2)",
                params![before_ms, PURGE_BATCH],
            )
            .map_err(&write)?;
        total += n as u64;
        if (n as i64) < PURGE_BATCH {
            return Ok(total);
        }
    }
}

mod down;
#[cfg(test)]
mod tests;
