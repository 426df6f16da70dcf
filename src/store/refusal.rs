//! Refusals at the door, bounded per peer: the dead letter of a message
//! ferry never accepted (malformed, too large, unauthorized, a bad topic;
//! from a device or the backend) keeps what an operator needs to act on
//! it, and no peer's refusals can fill the store for the others.
//!
//! What a dead letter keeps ([`Kept::of`]): the reason (its first
//! [`REASON_HEAD`] bytes), the payload's size and SHA-256 and its first
//! [`HEAD`] bytes, the topic's size and its first [`TOPIC_HEAD`] bytes, the
//! device as written (its first [`DEVICE_HEAD`] bytes), the msg_id. So a
//! row is at most a few KiB, whatever was sent.
//!
//! Whose it is ([`share_of`]): each valid device id has a share, the
//! backend one, and publishers that name no valid device one together
//! (their names are chosen by whoever publishes, so they are not counted
//! apart). `dead_letter_share` counts each share's rows and bytes, and all
//! of them together under `'*'`; SQL triggers keep it (schema 15), so
//! every delete — the retention, `ferry dlq purge`, a replay, from the
//! gateway or the CLI — gives its room back.
//!
//! What must hold ([`file()`]):
//! - a share holds at most `store.dead_letter_share_rows` rows and
//!   `store.dead_letter_share_bytes` bytes, all shares together at most
//!   `store.dead_letter_total_bytes`;
//! - past its share, a peer's further refusals are summed in one row of
//!   its own (a *summary*: how many, when the latest came, its reason in
//!   `last_error`, its msg_id and head), written once and then updated in
//!   place; past the total, everyone's are summed in one row for all. So
//!   refusals never take more than the total, plus one summary per full
//!   share (each share fills before it has one, so there are at most
//!   total / smallest share of them) and one for all;
//! - every refusal is still answered, with its own reason and the id of
//!   the row that holds it (its own, or its summary): the alerts see one
//!   new row per summary, not one per refusal;
//! - a new row (a dead letter or a summary) is written only if the disk
//!   budget admits it; a summary already there is updated even at the
//!   budget (it does not grow). Otherwise the refusal is answered
//!   `disk_budget` ([`Refusal::AtBudget`]), and nothing is written.

use rusqlite::{params, OptionalExtension, Transaction};
use tracing::warn;

use super::budget::Budget;
pub use super::record::refusal::{
    Kept, Refusal, Summary, DEVICE_HEAD, HEAD, REASON_HEAD, TOPIC_HEAD,
};
use crate::config::RefusalShares;
use crate::dead_letter::Direction;
use crate::ids::DeviceId;

/// The share of all refusals together.
const ALL: &str = "*";
/// What a row costs beyond its text and bytes (the trigger counts the
/// same): its other columns and its index entries.
const ROW_OVERHEAD: u64 = 64;

/// The share a refusal counts against: `device:{id}` for a valid device
/// id, `backend` for a downlink, `device:?` for publishers that name no
/// valid device.
pub fn share_of(direction: Direction, device: Option<&str>) -> String {
    match (direction, device.map(DeviceId::new)) {
        (Direction::Down, _) => "backend".into(),
        (Direction::Up, Some(Ok(id))) => format!("device:{id}"),
        (Direction::Up, _) => "device:?".into(),
    }
}

impl Summary {
    /// Counts a refusal summed in a summary, once it is committed, and
    /// says so the first time (one WARN per summary, as one alert).
    pub fn report(&self) {
        let total = crate::metrics::count(crate::metrics::Count::RefusalsSummarised);
        if self.opened {
            warn!(
                event = "dead_letter_share_full",
                share = %self.share,
                total,
                "a peer's dead-letter share is full: its further refusals are still answered and counted, and summed in one dead letter (`ferry dlq list`); purge its dead letters to give the room back"
            );
        }
    }
}

/// One share's use, as `dead_letter_share` counts it.
struct Use {
    rows: u64,
    bytes: u64,
    summary_id: Option<i64>,
}

fn usage(tx: &Transaction<'_>, share: &str) -> rusqlite::Result<Use> {
    Ok(tx
        .prepare_cached("SELECT rows, bytes, summary_id FROM dead_letter_share WHERE share = ?1")?
        .query_row([share], |r| {
            Ok(Use {
                rows: r.get::<_, i64>(0)?.max(0) as u64,
                bytes: r.get::<_, i64>(1)?.max(0) as u64,
                summary_id: r.get(2)?,
            })
        })
        .optional()?
        .unwrap_or(Use {
            rows: 0,
            bytes: 0,
            summary_id: None,
        }))
}

/// Files the refusal `dl` against its share (see the module doc), in the
/// writer's transaction.
pub(super) fn file(
    tx: &Transaction<'_>,
    dl: &Kept,
    shares: &RefusalShares,
    budget: &Budget,
    store_ms: i64,
) -> rusqlite::Result<Refusal> {
    let share = share_of(dl.direction, dl.device.as_deref());
    let size = dl.size() + ROW_OVERHEAD;
    let all = usage(tx, ALL)?;
    let own = usage(tx, &share)?;
    if all.bytes + size > shares.total_bytes {
        return summarise(tx, dl, ALL, all.summary_id, shares, budget, store_ms);
    }
    if own.rows + 1 > shares.rows || own.bytes + size > shares.bytes {
        return summarise(tx, dl, &share, own.summary_id, shares, budget, store_ms);
    }
    if !budget.admit(size + ROW_OVERHEAD) {
        return Ok(Refusal::AtBudget {
            detail: budget.refusal_detail(),
        });
    }
    Ok(Refusal::Filed {
        id: insert(tx, dl, Some(&share), &dl.reason, false, store_ms)?,
        summary: None,
    })
}

/// Writes `dl` as a dead letter of no peer's share (a receipt north the
/// upstream would never take: ferry's own); its id.
pub(super) fn file_unshared(
    tx: &Transaction<'_>,
    dl: &Kept,
    store_ms: i64,
) -> rusqlite::Result<i64> {
    insert(tx, dl, None, &dl.reason, false, store_ms)
}

/// Writes `dl` as a dead letter counted against `share` (`None`: against
/// none), with `reason`, as a `summary` (its refusal in `last_error`) or
/// not; its id.
fn insert(
    tx: &Transaction<'_>,
    dl: &Kept,
    share: Option<&str>,
    reason: &str,
    summary: bool,
    store_ms: i64,
) -> rusqlite::Result<i64> {
    tx.prepare_cached(
        "INSERT INTO dead_letter (at_ms, direction, device, msg_id, reason, topic, raw, at_store_ms,
                                  raw_bytes, raw_sha256, topic_bytes, share, last_ms, last_error)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        dl.at_ms,
        dl.direction,
        dl.device,
        dl.msg_id,
        reason,
        dl.topic,
        &dl.raw[..],
        store_ms,
        dl.raw_bytes as i64,
        dl.raw_sha256,
        dl.topic_bytes as i64,
        share,
        summary.then_some(dl.at_ms),
        summary.then_some(&dl.reason),
    ])?;
    Ok(tx.last_insert_rowid())
}

/// Sums `dl` in the summary of `share`: the one `summary_id` names if it
/// is still there, else a new one (if the budget admits it).
fn summarise(
    tx: &Transaction<'_>,
    dl: &Kept,
    share: &str,
    summary_id: Option<i64>,
    shares: &RefusalShares,
    budget: &Budget,
    store_ms: i64,
) -> rusqlite::Result<Refusal> {
    let updated: Option<i64> = match summary_id {
        Some(id) => tx
            .prepare_cached(
                "UPDATE dead_letter SET refusals = refusals + 1, last_ms = ?2, last_error = ?3,
                        msg_id = ?4, topic = ?5, topic_bytes = ?6, raw = ?7, raw_bytes = ?8, raw_sha256 = ?9
                 WHERE id = ?1 RETURNING refusals",
            )?
            .query_row(
                params![
                    id,
                    dl.at_ms,
                    dl.reason,
                    dl.msg_id,
                    dl.topic,
                    dl.topic_bytes as i64,
                    &dl.raw[..],
                    dl.raw_bytes as i64,
                    dl.raw_sha256
                ],
                |r| r.get(0),
            )
            .optional()?,
        None => None,
    };
    let (id, opened, refusals) = match (summary_id, updated) {
        (Some(id), Some(refusals)) => (id, false, refusals),
        _ => {
            let reason = summary_reason(share, shares);
            if !budget.admit(dl.size() + reason.len() as u64 + ROW_OVERHEAD) {
                return Ok(Refusal::AtBudget {
                    detail: budget.refusal_detail(),
                });
            }
            (insert(tx, dl, None, &reason, true, store_ms)?, true, 1)
        }
    };
    tx.prepare_cached(
        "INSERT INTO dead_letter_share (share, summary_id, summarised) VALUES (?1, ?2, 1)
         ON CONFLICT (share) DO UPDATE SET summary_id = excluded.summary_id, summarised = summarised + 1",
    )?
    .execute(params![share, id])?;
    Ok(Refusal::Filed {
        id,
        summary: Some(Summary {
            share: share.to_string(),
            opened,
            refusals,
        }),
    })
}

/// A summary's reason: whose share is full, and where the rest goes.
fn summary_reason(share: &str, shares: &RefusalShares) -> String {
    match share {
        ALL => format!(
            "summarised: the dead letters of all refusals are at store.dead_letter_total_bytes \
             ({} bytes); every peer's further refusals are counted in this row, the latest in last_error",
            shares.total_bytes
        ),
        share => format!(
            "summarised: {share} is past its dead-letter share (store.dead_letter_share_rows {} rows, \
             store.dead_letter_share_bytes {} bytes); its further refusals are counted in this row, \
             the latest in last_error",
            shares.rows, shares.bytes
        ),
    }
}

#[cfg(test)]
mod tests;
