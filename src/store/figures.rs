//! The store's figures: backlogs and their oldest ages, and the dead
//! letters past a mark. Each is a seek per device or a read of a partial
//! index, never a pass over the deliveries or the uplinks kept for
//! retention: reading them on a store with a million undelivered uplinks
//! stays cheap (docs/BENCHMARKS.md). Ages are on the store clock (see
//! [`oldest`]). Plain connections: the writer's transactions and read-only
//! connections both use them.

use std::time::Duration;

use rusqlite::{params, Connection, Result};

use super::clock::Now;
use crate::dead_letter::Direction;

/// What waits to be delivered, counted for `STATUS=` (cheap: the uplink
/// count reads the partial index of stored rows, the downlink one sums
/// per-device cursors).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Stored uplinks not yet delivered or dead.
    pub uplinks: u64,
    /// Downlink queue entries past their device's confirm cursor.
    pub downlinks: u64,
}

/// What waits to be delivered in each direction.
pub fn backlog(conn: &Connection) -> Result<Backlog> {
    let uplinks: i64 = conn
        .prepare_cached("SELECT count(*) FROM uplink WHERE state = 'stored'")?
        .query_row([], |r| r.get(0))?;
    // A device's queue is seq 1..=down_seq; what is past its confirm
    // cursor is not yet delivered (expired and dead entries included,
    // which the cursor skips as it moves).
    let downlinks: i64 = conn
        .prepare_cached("SELECT coalesce(sum(max(down_seq - delivered_upto, 0)), 0) FROM devices")?
        .query_row([], |r| r.get(0))?;
    Ok(Backlog {
        uplinks: uplinks.max(0) as u64,
        downlinks: downlinks.max(0) as u64,
    })
}

/// How long the oldest undelivered message of each direction has waited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Oldest {
    pub uplink: Option<Duration>,
    pub downlink: Option<Duration>,
}

/// A row's age at `?1` (wall) / `?2` (store): on the store clock where it
/// has a store stamp, so a wall-clock step neither ages nor rejuvenates
/// it; on the wall clock for rows from before schema 13.
fn age(wall: &str, store: &str) -> String {
    format!("CASE WHEN {store} IS NULL THEN ?1 - {wall} ELSE ?2 - {store} END")
}

pub fn oldest(conn: &Connection, now: Now) -> Result<Oldest> {
    let now = params![now.wall_ms, now.store_ms];
    // Each device's first stored message, found by a seek in the partial
    // index of stored rows: one lookup per device, not a pass over the
    // backlog (seqs are assigned in stored order, so it is the oldest).
    let uplink: Option<i64> = conn
        .prepare_cached(&format!(
            "SELECT max((SELECT {} FROM uplink u
                         WHERE u.device = v.device AND u.state = 'stored'
                         ORDER BY u.seq LIMIT 1))
             FROM devices v",
            age("u.stored_ms", "u.stored_store_ms")
        ))?
        .query_row(now, |r| r.get(0))?;
    // The delivery at each device's cursor, by primary key: one row per
    // device, not a scan of the queues (CROSS JOIN keeps `devices` the
    // outer loop, which the planner would otherwise swap).
    let downlink: Option<i64> = conn
        .prepare_cached(&format!(
            "SELECT max({}) FROM devices v CROSS JOIN down_delivery d
                 ON d.device = v.device AND d.seq = v.delivered_upto + 1
             WHERE d.state = 'stored'",
            age("d.at_ms", "d.at_store_ms")
        ))?
        .query_row(now, |r| r.get(0))?;
    // A row stamped after now (a wall step back, for an old row) is new.
    let dur = |ms: Option<i64>| ms.map(|ms| Duration::from_millis(ms.max(0) as u64));
    Ok(Oldest {
        uplink: dur(uplink),
        downlink: dur(downlink),
    })
}

/// The `top` devices with the most downlink queue entries past their
/// confirm cursor, most first: (device, entries).
pub fn downlink_top(conn: &Connection, top: usize) -> Result<Vec<(String, i64)>> {
    conn.prepare_cached(
        "SELECT device, down_seq - delivered_upto AS n FROM devices
         WHERE n > 0 ORDER BY n DESC, device LIMIT ?1",
    )?
    // Saturated, not cast: a `usize` past i64::MAX must not wrap.
    .query_map(params![i64::try_from(top).unwrap_or(i64::MAX)], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })?
    .collect()
}

/// The `top` devices with the most undelivered uplinks, most first:
/// (device, messages). Read from the partial index of stored rows.
pub fn uplink_top(conn: &Connection, top: usize) -> Result<Vec<(String, i64)>> {
    conn.prepare_cached(
        "SELECT device, count(*) AS n FROM uplink WHERE state = 'stored'
         GROUP BY device ORDER BY n DESC, device LIMIT ?1",
    )?
    .query_map(params![i64::try_from(top).unwrap_or(i64::MAX)], |r| {
        Ok((r.get(0)?, r.get(1)?))
    })?
    .collect()
}

/// One peer's share of the dead letters refused at the door
/// (`store::refusal`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ShareUse {
    /// `device:{id}`, `device:?` (publishers naming no valid device) or
    /// `backend`.
    pub share: String,
    pub rows: i64,
    pub bytes: i64,
    /// Its refusals summed in a summary, once its share was full.
    pub summarised: i64,
}

/// The `top` shares of the dead letters by bytes, most first.
pub fn dead_letter_top(conn: &Connection, top: usize) -> Result<Vec<ShareUse>> {
    conn.prepare_cached(
        "SELECT share, rows, bytes, summarised FROM dead_letter_share
         WHERE share != '*' AND (rows > 0 OR summarised > 0)
         ORDER BY bytes DESC, share LIMIT ?1",
    )?
    .query_map(params![i64::try_from(top).unwrap_or(i64::MAX)], |r| {
        Ok(ShareUse {
            share: r.get(0)?,
            rows: r.get(1)?,
            bytes: r.get(2)?,
            summarised: r.get(3)?,
        })
    })?
    .collect()
}

/// Whose data fills the store, for when it is at its disk budget: the
/// devices with the most undelivered messages each way, the delivered
/// uplinks kept (which the pruner deletes first), and the largest shares
/// of the dead letters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    pub uplinks: Vec<(String, i64)>,
    pub downlinks: Vec<(String, i64)>,
    pub delivered: i64,
    pub dead_letters: Vec<ShareUse>,
}

/// [`Holders`], `top` of each. A pass over the undelivered uplinks' index
/// and the delivered ones': read while the store is at its budget only.
pub fn holders(conn: &Connection, top: usize) -> Result<Holders> {
    Ok(Holders {
        uplinks: uplink_top(conn, top)?,
        downlinks: downlink_top(conn, top)?,
        delivered: conn
            .prepare_cached("SELECT count(*) FROM uplink WHERE state = 'delivered'")?
            .query_row([], |r| r.get(0))?,
        dead_letters: dead_letter_top(conn, top)?,
    })
}

impl std::fmt::Display for Holders {
    /// One line: `undelivered uplinks: press-7 (120000), ...; downlink
    /// queues: ...; delivered uplinks kept: N; dead letters: device:x
    /// (1000 rows, 1048576 bytes), ...`; a part with nothing says `none`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |items: Vec<String>| match items.is_empty() {
            true => "none".to_string(),
            false => items.join(", "),
        };
        let by_device =
            |v: &[(String, i64)]| list(v.iter().map(|(d, n)| format!("{d} ({n})")).collect());
        write!(
            f,
            "undelivered uplinks: {}; downlink queues: {}; delivered uplinks kept: {}; dead letters: {}",
            by_device(&self.uplinks),
            by_device(&self.downlinks),
            self.delivered,
            list(
                self.dead_letters
                    .iter()
                    .map(|s| format!("{} ({} rows, {} bytes)", s.share, s.rows, s.bytes))
                    .collect()
            )
        )
    }
}

/// Dead letters past a mark, the backlog's age and size, and the disk
/// budget: what warrants a warning, read in one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlertScan {
    /// How long the oldest stored uplink has waited ([`oldest`]).
    pub oldest_uplink_age: Option<Duration>,
    /// How long the oldest delivery waiting at a device's cursor has.
    pub oldest_downlink_age: Option<Duration>,
    pub backlog: Backlog,
    /// Dead letters with an id past the one asked, oldest first.
    pub dead: Vec<DeadSummary>,
    /// Dead letters past the ones in `dead`.
    pub more_dead: u64,
    /// The newest dead letter's id (0 if none).
    pub max_dead_id: i64,
    /// The id asked for: `dead` are past it.
    pub after_dead: i64,
    /// Every dead letter up to this id had its alert acknowledged by the
    /// upstream, in this run or an earlier one (`alert_mark`).
    pub dead_alerted: i64,
    /// Whose data fills the store: read only while it is at its budget.
    pub holders: Option<Holders>,
    /// Filled in from the budget, not by the writer.
    pub over_budget: bool,
    pub used_bytes: u64,
    pub max_db_bytes: u64,
}

/// A dead letter, as an alert names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadSummary {
    pub id: i64,
    pub direction: Direction,
    pub device: Option<String>,
    pub msg_id: Option<String>,
    pub reason: String,
}
