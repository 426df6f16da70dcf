//! Retention: deleting what is finished and old, a small batch at a time.
//!
//! One call deletes at most `limit` rows of each kind, in the writer's
//! transaction like any other op, so pruning takes turns with the pipeline
//! instead of holding the database. What goes:
//! - delivered uplinks done before the retention cutoff, with their
//!   history (under disk-budget pressure: any delivered uplink, oldest
//!   first);
//! - downlink messages stored before the cutoff whose every delivery is
//!   finished (delivered, read, expired or dead) since before the cutoff,
//!   with those deliveries (under pressure: finished at all);
//! - dead letters older than the dead-letter retention, with the dead
//!   uplink row they refer to and its history (never early: a dead letter
//!   is not delivered data).
//!
//! - dedup keys (`uplink_key`, `down_key`) older than their cutoff.
//!
//! Under pressure a message goes at once, but its dedup key stays: a
//! device resending an uplink whose receipt it never got (or the backend
//! a downlink) is answered with the original seq, not stored a second
//! time. A key is a few dozen bytes where the message was its body and
//! history; keys go after `store.min_dedup_s` under pressure, after the
//! retention otherwise.
//!
//! Never: a stored (undelivered) uplink, a delivery still waiting for its
//! device, the `devices` rows (their sequence counters and cursors), or a
//! receipt in the outbox.
//!
//! "Before the cutoff" holds on both clocks: a row is old by its wall
//! stamp AND, if it has a store stamp (rows written since schema 13), by
//! that too. A forward wall-clock step, however large, thus prunes nothing
//! early; a reboot (the store clock does not count the time the box was
//! off) only keeps rows longer. Rows without a store stamp are judged on
//! the wall clock, as before.

use rusqlite::{params, Transaction};

use super::clock::Now;
use super::error::StoreError;

type Result<T> = std::result::Result<T, StoreError>;

/// What one call deletes before, on both clocks, and how much.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cutoffs {
    /// Delivered messages finished before this are deleted.
    pub delivered: Now,
    /// Dead letters written before this are deleted.
    pub dead: Now,
    /// Dedup keys of messages finished before this are deleted.
    pub keys: Now,
    /// Whether a deleted message leaves its dedup key (under pressure:
    /// it goes before its retention, and a resend must still be known).
    pub keep_keys: bool,
    /// Rows of each kind per call, at most.
    pub limit: usize,
}

/// What one call deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub uplinks: usize,
    pub downlinks: usize,
    pub dead_letters: usize,
    /// Dedup keys, of both directions.
    pub keys: usize,
}

impl Pruned {
    /// Whether some kind filled its batch: there may be more to delete.
    pub fn more(&self, limit: usize) -> bool {
        self.uplinks >= limit
            || self.downlinks >= limit
            || self.dead_letters >= limit
            || self.keys >= limit
    }

    pub fn any(&self) -> bool {
        self.uplinks + self.downlinks + self.dead_letters + self.keys > 0
    }
}

pub fn prune(tx: &Transaction<'_>, c: &Cutoffs) -> Result<Pruned> {
    let limit = c.limit as i64;
    // Keys first: one a message leaves below is judged from the next pass.
    let old_keys = prune_keys(tx, c)?;
    let mut keys = Vec::new();
    // Each kind in two seeks of its index: the rows without a store stamp
    // by their wall stamp, then the others by their store stamp.
    let uplinks: Vec<i64> = tx
        .prepare_cached(
            "DELETE FROM uplink WHERE id IN (
                 SELECT id FROM (SELECT id FROM uplink
                     WHERE state = 'delivered' AND done_store_ms IS NULL AND done_ms < ?1
                     ORDER BY done_ms LIMIT ?3)
                 UNION ALL
                 SELECT id FROM (SELECT id FROM uplink
                     WHERE state = 'delivered' AND done_store_ms < ?2 AND done_ms < ?1
                     ORDER BY done_store_ms LIMIT ?3)
                 LIMIT ?3)
             RETURNING id, device, msg_id, seq, coalesce(done_ms, stored_ms), done_store_ms",
        )?
        .query_map(
            params![c.delivered.wall_ms, c.delivered.store_ms, limit],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    (
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, i64>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, Option<i64>>(5)?,
                    ),
                ))
            },
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?
        .into_iter()
        .map(|(id, key)| {
            keys.push(key);
            id
        })
        .collect();
    delete_history(tx, &uplinks)?;
    if c.keep_keys {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO uplink_key (device, msg_id, seq, done_ms, done_store_ms)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
        )?;
        for (device, msg_id, seq, done_ms, done_store_ms) in &keys {
            stmt.execute(params![device, msg_id, seq, done_ms, done_store_ms])?;
        }
    }

    // A message goes once every delivery of it is finished since before
    // the cutoff (a delivery's NULL store stamp compares as not after it).
    let messages: Vec<i64> = tx
        .prepare_cached(
            "WITH old (id) AS (
                 SELECT id FROM (SELECT id FROM down_message
                     WHERE stored_store_ms IS NULL AND stored_ms < ?1 ORDER BY stored_ms)
                 UNION ALL
                 SELECT id FROM (SELECT id FROM down_message
                     WHERE stored_store_ms < ?2 AND stored_ms < ?1 ORDER BY stored_store_ms))
             SELECT id FROM old m WHERE NOT EXISTS (
                 SELECT 1 FROM down_delivery d WHERE d.message_id = m.id
                 AND (d.state = 'stored' OR d.at_ms >= ?1 OR d.at_store_ms >= ?2))
             LIMIT ?3",
        )?
        .query_map(
            params![c.delivered.wall_ms, c.delivered.store_ms, limit],
            |r| r.get(0),
        )?
        .collect::<rusqlite::Result<_>>()?;
    {
        // Their history (`ferry trace`) goes with them.
        let mut history = tx.prepare_cached(
            "DELETE FROM down_history WHERE (device, seq) IN
                 (SELECT device, seq FROM down_delivery WHERE message_id = ?1)",
        )?;
        let mut deliveries =
            tx.prepare_cached("DELETE FROM down_delivery WHERE message_id = ?1")?;
        let mut message = tx.prepare_cached("DELETE FROM down_message WHERE id = ?1")?;
        let mut keep = tx.prepare_cached(
            "INSERT INTO down_key (msg_id, device, seq, state, done_ms, done_store_ms)
             SELECT m.msg_id, d.device, d.seq, d.state, d.at_ms, d.at_store_ms
             FROM down_delivery d JOIN down_message m ON m.id = d.message_id
             WHERE d.message_id = ?1 ON CONFLICT DO NOTHING",
        )?;
        for id in &messages {
            if c.keep_keys {
                keep.execute([id])?;
            }
            history.execute([id])?;
            deliveries.execute([id])?;
            message.execute([id])?;
        }
    }

    let dead: Vec<Option<i64>> = tx
        .prepare_cached(
            "DELETE FROM dead_letter WHERE id IN (
                 SELECT id FROM (SELECT id FROM dead_letter
                     WHERE at_store_ms IS NULL AND at_ms < ?1 ORDER BY at_ms LIMIT ?3)
                 UNION ALL
                 SELECT id FROM (SELECT id FROM dead_letter
                     WHERE at_store_ms < ?2 AND at_ms < ?1 ORDER BY at_store_ms LIMIT ?3)
                 LIMIT ?3)
             RETURNING uplink_id",
        )?
        .query_map(params![c.dead.wall_ms, c.dead.store_ms, limit], |r| {
            r.get(0)
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut dead_uplinks = Vec::new();
    {
        // Only a dead row: a replayed one (back in `stored`) is kept, with
        // its history.
        let mut stmt = tx.prepare_cached("DELETE FROM uplink WHERE id = ?1 AND state = 'dead'")?;
        for id in dead.iter().flatten() {
            if stmt.execute([id])? > 0 {
                dead_uplinks.push(*id);
            }
        }
    }
    delete_history(tx, &dead_uplinks)?;

    Ok(Pruned {
        uplinks: uplinks.len(),
        downlinks: messages.len(),
        dead_letters: dead.len(),
        keys: old_keys,
    })
}

/// Deletes up to `c.limit` dedup keys of each direction finished before
/// `c.keys`, oldest first, by the same two seeks as the messages.
fn prune_keys(tx: &Transaction<'_>, c: &Cutoffs) -> Result<usize> {
    let mut n = 0;
    for (table, columns) in [
        ("uplink_key", "device, msg_id"),
        ("down_key", "msg_id, device"),
    ] {
        n += tx
            .prepare_cached(&format!(
                "DELETE FROM {table} WHERE ({columns}) IN (
                     SELECT {columns} FROM (SELECT {columns} FROM {table}
                         WHERE done_store_ms IS NULL AND done_ms < ?1
                         ORDER BY done_ms LIMIT ?3)
                     UNION ALL
                     SELECT {columns} FROM (SELECT {columns} FROM {table}
                         WHERE done_store_ms < ?2 AND done_ms < ?1
                         ORDER BY done_store_ms LIMIT ?3)
                     LIMIT ?3)"
            ))?
            .execute(params![c.keys.wall_ms, c.keys.store_ms, c.limit as i64])?;
    }
    Ok(n)
}

fn delete_history(tx: &Transaction<'_>, ids: &[i64]) -> Result<()> {
    let mut stmt = tx.prepare_cached("DELETE FROM uplink_history WHERE uplink_id = ?1")?;
    for id in ids {
        stmt.execute([id])?;
    }
    Ok(())
}
