//! Uplink rows: intake with dedup and sequencing, state transitions, dead
//! letters and the pending-work queries. Every function here runs inside
//! the writer's open transaction and returns what its commit will make true.
//! The records it reads and writes are in [`super::record::uplink`].

use std::collections::HashMap;

use bytes::Bytes;
use rusqlite::{params, OptionalExtension, Transaction};

use super::budget::Budget;
use super::clock::Now;
use super::error::StoreError;
use super::refusal::HEAD;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::north::with_seq;
use crate::state::MessageState;
use crate::store::record::uplink::{
    AttemptRecord, Duplicate, Intake, IntakeOutcome, Moved, PendingMessage, Transition,
};

type Result<T> = std::result::Result<T, StoreError>;

/// Devices whose last uplink seq is kept in memory, at most (about).
const MAX_CACHED_SEQS: usize = 65_536;

/// The last uplink seq per device, as committed and as this transaction has it.
#[derive(Default)]
pub struct SeqCache {
    committed: HashMap<DeviceId, u64>,
    in_tx: HashMap<DeviceId, u64>,
}

impl SeqCache {
    fn last(&mut self, tx: &Transaction<'_>, device: &DeviceId) -> rusqlite::Result<u64> {
        if let Some(s) = self
            .in_tx
            .get(device)
            .or_else(|| self.committed.get(device))
        {
            return Ok(*s);
        }
        let s = tx
            .prepare_cached("SELECT up_seq FROM devices WHERE device = ?1")?
            .query_row([device.as_str()], |r| r.get::<_, i64>(0))
            .optional()?
            .unwrap_or(0) as u64;
        self.committed.insert(device.clone(), s);
        Ok(s)
    }

    /// Writes this transaction's new seqs to the `devices` table.
    pub fn flush(&self, tx: &Transaction<'_>) -> rusqlite::Result<()> {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO devices (device, up_seq) VALUES (?1, ?2)
             ON CONFLICT (device) DO UPDATE SET up_seq = excluded.up_seq",
        )?;
        for (device, seq) in &self.in_tx {
            stmt.execute(params![device.as_str(), *seq as i64])?;
        }
        Ok(())
    }

    pub fn committed(&mut self) {
        // A cache, not a record: beyond this many devices it starts again
        // from the table, so it does not grow with every device ever seen.
        if self.committed.len() > MAX_CACHED_SEQS {
            self.committed.clear();
        }
        self.committed.extend(self.in_tx.drain());
    }

    pub fn rolled_back(&mut self) {
        self.in_tx.clear();
    }
}

/// Stores a new message with the device's next seq, or reports the
/// existing one for a repeated `(device, msg_id)`; `store_ms` (the store
/// clock) stamps it beside `stored_ms`.
pub fn intake(
    tx: &Transaction<'_>,
    seqs: &mut SeqCache,
    msg: &Intake,
    budget: &Budget,
    store_ms: i64,
) -> Result<IntakeOutcome> {
    // A message pruned under the disk budget is known by its key alone.
    if let Some(dup) = super::keys::uplink(tx, &msg.device, &msg.msg_id)? {
        return Ok(IntakeOutcome::Duplicate(dup));
    }
    // At the budget only what the store knows is answered (as the
    // duplicate it is); nothing new is written.
    if !budget.admit(msg.cost()) {
        return Ok(match existing(tx, &msg.device, &msg.msg_id)? {
            Some(dup) => IntakeOutcome::Duplicate(dup),
            None => IntakeOutcome::AtBudget {
                msg_id: msg.msg_id.clone(),
                detail: budget.refusal_detail(),
            },
        });
    }
    let seq = Seq(seqs.last(tx, &msg.device)? + 1);
    let body = Bytes::from(with_seq(&msg.body, seq));
    let inserted = tx
        .prepare_cached(
            "INSERT INTO uplink (device, msg_id, seq, stream, state, body, stored_ms, expires_ms, no_retry, received_ms, stored_store_ms)
             VALUES (?1, ?2, ?3, ?4, 'stored', ?5, ?6, ?7, ?8, ?9, ?10)
             ON CONFLICT (device, msg_id) DO NOTHING",
        )?
        .execute(params![
            msg.device.as_str(),
            msg.msg_id.as_str(),
            seq.0 as i64,
            &msg.stream,
            &body[..],
            msg.stored_ms,
            msg.expires_ms,
            msg.no_retry,
            msg.received_ms,
            store_ms,
        ])?;
    if inserted == 0 {
        let dup =
            existing(tx, &msg.device, &msg.msg_id)?.ok_or_else(|| StoreError::CorruptRow {
                table: "uplink",
                detail: format!("{}/{} conflicts but cannot be read", msg.device, msg.msg_id),
            })?;
        return Ok(IntakeOutcome::Duplicate(dup));
    }
    // No history row: the row itself says when it was stored (see
    // [`history`]).
    let id = tx.last_insert_rowid();
    seqs.in_tx.insert(msg.device.clone(), seq.0);
    Ok(IntakeOutcome::Stored(PendingMessage {
        id,
        device: msg.device.clone(),
        msg_id: msg.msg_id.clone(),
        seq,
        stream: msg.stream.clone(),
        body,
        expires_ms: msg.expires_ms,
        no_retry: msg.no_retry,
        attempts: 0,
    }))
}

/// The message `(device, msg_id)` as it stands, if stored.
pub(super) fn existing(
    tx: &Transaction<'_>,
    device: &DeviceId,
    msg_id: &MsgId,
) -> Result<Option<Duplicate>> {
    let row: Option<(i64, String, Option<String>)> = tx
        .prepare_cached(
            "SELECT seq, state, last_error FROM uplink WHERE device = ?1 AND msg_id = ?2",
        )?
        .query_row([device.as_str(), msg_id.as_str()], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    let Some((seq, state, reason)) = row else {
        return super::keys::uplink(tx, device, msg_id);
    };
    Ok(Some(Duplicate {
        msg_id: msg_id.clone(),
        seq: Seq(seq as u64),
        state: message_state(&state)?,
        reason,
    }))
}

/// A message's state as written; a name this build does not know is an
/// error, never taken for `stored`.
pub(super) fn message_state(s: &str) -> Result<MessageState> {
    MessageState::parse(s).ok_or_else(|| StoreError::CorruptRow {
        table: "uplink",
        detail: format!("unknown state {s:?}"),
    })
}

/// Appends a line to a message's history, for what its row cannot say:
/// each counted failed attempt, a replay, and a dead end with its reason.
/// A normal life, `stored` then `delivered`, writes none: `ferry trace`
/// reads those two from the row's `stored_ms` and `done_ms`, so a
/// delivered message costs one insert and one update.
fn history(
    tx: &Transaction<'_>,
    id: i64,
    at_ms: i64,
    state: MessageState,
    detail: Option<&str>,
) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO uplink_history (uplink_id, at_ms, state, detail) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![id, at_ms, state.as_str(), detail])?;
    Ok(())
}

/// Moves a `stored` message to `t.to`, done at `t.at_ms` and `store_ms`
/// (the store clock); `None` if it is not `stored` (or unknown). A move
/// the state machine forbids is refused before any write.
pub fn transition(tx: &Transaction<'_>, t: &Transition, store_ms: i64) -> Result<Option<Moved>> {
    MessageState::Stored.check_move(t.to)?;
    // A read, then an update by rowid: `UPDATE … RETURNING` builds an
    // ephemeral table (a B-tree and its pager) every time it runs, which
    // cost a third of this function in issue 20's profile.
    let moved = tx
        .prepare_cached(
            "SELECT id, seq, stored_ms FROM uplink WHERE device = ?1 AND msg_id = ?2 AND state = 'stored'",
        )?
        .query_row(params![t.device.as_str(), t.msg_id.as_str()], |r| {
            Ok(Moved {
                id: r.get(0)?,
                seq: Seq(r.get::<_, i64>(1)? as u64),
                stored_ms: r.get(2)?,
                attempts: t.attempts,
            })
        })
        .optional()?;
    let Some(moved) = moved else { return Ok(None) };
    tx.prepare_cached(
        "UPDATE uplink SET state = ?2, attempts = ?3, last_error = coalesce(?4, last_error), next_attempt_ms = NULL, done_ms = ?5, done_store_ms = ?6
         WHERE id = ?1",
    )?
    .execute(params![moved.id, t.to.as_str(), t.attempts, t.reason, t.at_ms, store_ms])?;
    if t.to != MessageState::Delivered || t.reason.is_some() {
        history(tx, moved.id, t.at_ms, t.to, t.reason.as_deref())?;
    }
    if t.to == MessageState::Dead {
        tx.prepare_cached(
            "INSERT INTO dead_letter (at_ms, direction, device, msg_id, uplink_id, reason, attempts, last_error, topic, raw, raw_bytes, at_store_ms)
             SELECT ?2, 'up', device, msg_id, id, ?3, attempts, last_error, stream, substr(body, 1, ?5), length(body), ?4 FROM uplink WHERE id = ?1",
        )?
        .execute(params![moved.id, t.at_ms, t.dead_reason(), store_ms, HEAD as i64])?;
    }
    Ok(Some(moved))
}

pub fn record_attempt(tx: &Transaction<'_>, rec: &AttemptRecord) -> Result<()> {
    tx.prepare_cached(
        "UPDATE uplink SET attempts = ?2, next_attempt_ms = ?3, last_error = ?4 WHERE id = ?1 AND state = 'stored'",
    )?
    .execute(params![rec.id, rec.attempts, rec.next_attempt_ms, rec.error])?;
    let detail = rec.detail();
    Ok(history(
        tx,
        rec.id,
        rec.at_ms,
        MessageState::Stored,
        Some(&detail),
    )?)
}

/// Takes up to `limit` replay requests (see `replay_request`): deletes
/// them and returns the replayed messages that are still `stored`.
pub fn take_replays(tx: &Transaction<'_>, limit: usize) -> Result<Vec<PendingMessage>> {
    let ids: Vec<i64> = tx
        .prepare_cached("SELECT uplink_id FROM replay_request ORDER BY uplink_id LIMIT ?1")?
        .query_map([limit as i64], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        tx.prepare_cached("DELETE FROM replay_request WHERE uplink_id = ?1")?
            .execute([id])?;
        let row = tx
            .prepare_cached(
                "SELECT device, msg_id, seq, stream, body, expires_ms, no_retry, attempts FROM uplink
                 WHERE id = ?1 AND state = 'stored'",
            )?
            .query_row([id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Vec<u8>>(4)?,
                    r.get::<_, Option<i64>>(5)?,
                    r.get::<_, bool>(6)?,
                    r.get::<_, u32>(7)?,
                ))
            })
            .optional()?;
        let Some((device, msg_id, seq, stream, body, expires_ms, no_retry, attempts)) = row else {
            continue;
        };
        // Only valid ids are ever stored; a bad one would be a hand edit.
        let (Ok(device), Ok(msg_id)) = (DeviceId::new(device), MsgId::new(msg_id)) else {
            continue;
        };
        out.push(PendingMessage {
            id,
            device,
            msg_id,
            seq: Seq(seq as u64),
            stream,
            body: Bytes::from(body),
            expires_ms,
            no_retry,
            attempts,
        });
    }
    Ok(out)
}

/// Up to `limit` stored messages of `device` after `after`, in seq order,
/// none past row `upto` (see `Store::receipted`): a device's rows are in
/// seq order, so what is left out is its newest.
pub fn pending(
    tx: &Transaction<'_>,
    device: &DeviceId,
    after: Seq,
    limit: usize,
    upto: i64,
) -> Result<Vec<PendingMessage>> {
    let mut stmt = tx.prepare_cached(
        "SELECT id, msg_id, seq, stream, body, expires_ms, no_retry, attempts FROM uplink
         WHERE device = ?1 AND state = 'stored' AND seq > ?2 AND id <= ?4 ORDER BY seq LIMIT ?3",
    )?;
    let rows = stmt.query_map(
        params![device.as_str(), after.0 as i64, limit as i64, upto],
        |r| {
            let msg_id: String = r.get(1)?;
            Ok(PendingMessage {
                id: r.get(0)?,
                device: device.clone(),
                msg_id: MsgId::new(msg_id).map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        1,
                        rusqlite::types::Type::Text,
                        Box::new(e),
                    )
                })?,
                seq: Seq(r.get::<_, i64>(2)? as u64),
                stream: r.get(3)?,
                body: Bytes::from(r.get::<_, Vec<u8>>(4)?),
                expires_ms: r.get(5)?,
                no_retry: r.get(6)?,
                attempts: r.get(7)?,
            })
        },
    )?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Dead-letters up to `limit` stored messages whose ttl has passed by
/// `now` (store clock), wherever they are in their device's backlog, with
/// `reason`.
pub fn expire_due(
    tx: &Transaction<'_>,
    now: Now,
    limit: usize,
    reason: &str,
) -> Result<Vec<(DeviceId, MsgId, Moved)>> {
    let due: Vec<(String, String, u32)> = tx
        .prepare_cached(
            "SELECT device, msg_id, attempts FROM uplink
             WHERE state = 'stored' AND expires_ms IS NOT NULL AND expires_ms <= ?1 LIMIT ?2",
        )?
        .query_map(params![now.store_ms, limit as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut out = Vec::with_capacity(due.len());
    for (device, msg_id, attempts) in due {
        // Only valid ids are ever stored; a bad one would be a hand edit.
        let (Ok(device), Ok(msg_id)) = (DeviceId::new(device), MsgId::new(msg_id)) else {
            continue;
        };
        let t = Transition {
            device: device.clone(),
            msg_id: msg_id.clone(),
            to: MessageState::Dead,
            attempts,
            reason: Some(reason.to_string()),
            at_ms: now.wall_ms,
        };
        if let Some(moved) = transition(tx, &t, now.store_ms)? {
            out.push((device, msg_id, moved));
        }
    }
    Ok(out)
}

pub fn pending_devices(tx: &Transaction<'_>) -> Result<Vec<DeviceId>> {
    let mut stmt =
        tx.prepare_cached("SELECT DISTINCT device FROM uplink WHERE state = 'stored'")?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    let mut out = Vec::new();
    for d in rows {
        // Only valid ids are ever stored; a bad one would be a hand edit.
        if let Ok(d) = DeviceId::new(d?) {
            out.push(d);
        }
    }
    Ok(out)
}

/// What the alerts look at at `now` (see [`super::figures::AlertScan`]).
pub fn alert_scan(
    tx: &Transaction<'_>,
    now: Now,
    after_dead: i64,
    limit: usize,
) -> Result<super::figures::AlertScan> {
    let oldest = super::figures::oldest(tx, now)?;
    let dead: Vec<super::figures::DeadSummary> = tx
        .prepare_cached(
            "SELECT id, direction, device, msg_id, reason FROM dead_letter
             WHERE id > ?1 ORDER BY id LIMIT ?2",
        )?
        .query_map(params![after_dead, limit as i64], |r| {
            Ok(super::figures::DeadSummary {
                id: r.get(0)?,
                direction: r.get(1)?,
                device: r.get(2)?,
                msg_id: r.get(3)?,
                reason: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    let max_dead_id: i64 = tx
        .prepare_cached("SELECT coalesce(max(id), 0) FROM dead_letter")?
        .query_row([], |r| r.get(0))?;
    let last_seen = dead.last().map_or(after_dead, |d| d.id);
    let more_dead: i64 = if dead.len() < limit {
        0
    } else {
        tx.prepare_cached("SELECT count(*) FROM dead_letter WHERE id > ?1")?
            .query_row([last_seen], |r| r.get(0))?
    };
    let dead_alerted: i64 = tx
        .prepare_cached("SELECT value FROM alert_mark WHERE name = 'dead_letters_alerted'")?
        .query_row([], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    Ok(super::figures::AlertScan {
        after_dead,
        dead_alerted,
        oldest_uplink_age: oldest.uplink,
        oldest_downlink_age: oldest.downlink,
        backlog: super::figures::backlog(tx)?,
        dead,
        more_dead: more_dead.max(0) as u64,
        max_dead_id,
        ..Default::default()
    })
}

/// Every dead letter up to `id` had its alert acknowledged (the mark never
/// moves back).
pub fn dead_alerted(tx: &Transaction<'_>, id: i64) -> Result<()> {
    tx.prepare_cached(
        "UPDATE alert_mark SET value = max(value, ?1) WHERE name = 'dead_letters_alerted'",
    )?
    .execute([id])?;
    Ok(())
}
