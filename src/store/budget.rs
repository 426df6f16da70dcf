//! The disk budget (`store.max_db_bytes`): how much of the disk the store
//! may use, and whether it is at it.
//!
//! The writer measures after its commits: the database's pages in use
//! (page count less free pages, so space that pruning frees counts as free
//! even though the file keeps its size) plus the WAL file. Far from the
//! budget at most every [`MEASURE_EVERY`], within [`NEAR_PERCENT`] of it
//! after every commit. Between measures every request that adds a
//! message or a dead letter is [`Budget::admit`]ted by its estimated
//! cost, inside the writer, so the store does not overshoot the budget
//! by what arrives between two measures: at most by one batch's misjudged
//! cost (pages a row did not fill). Near the budget a cost counts twice,
//! for the pages and the WAL frames that both hold it until a checkpoint.
//! At the budget the store is *over*: new uplinks and downlinks and new
//! dead letters are refused (a resend of a message the store knows is
//! still answered, as the duplicate it is), and the pruner deletes
//! delivered messages before their retention. It is not over again until the use falls below
//! [`RESUME_AT`] of the budget, so a store at the edge does not flap with
//! every commit. Nothing undelivered is ever deleted to make room.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Far from the budget, the writer measures at most this often.
pub(super) const MEASURE_EVERY: Duration = Duration::from_millis(200);
/// From this share of the budget (in percent) on, the writer measures
/// after every commit.
pub(super) const NEAR_PERCENT: u64 = 75;
/// Once over, the store takes new messages again below this share of the
/// budget (in percent).
pub const RESUME_AT: u64 = 95;

/// The budget and the writer's latest measure; cheap to clone, read by
/// anyone.
#[derive(Clone, Debug)]
pub struct Budget {
    /// `store.max_db_bytes`, which `systemctl reload` may change.
    limit: Arc<AtomicU64>,
    used: Arc<AtomicU64>,
    /// Estimated bytes admitted since the latest measure.
    added: Arc<AtomicU64>,
    over: Arc<AtomicBool>,
}

/// A change [`Budget::record`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Reached,
    Freed,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget {
            limit: Arc::new(AtomicU64::new(limit)),
            used: Arc::default(),
            added: Arc::default(),
            over: Arc::default(),
        }
    }

    /// Whether new messages are refused.
    pub fn over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// Bytes in use: the latest measure, and what was admitted since.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed) + self.added.load(Ordering::Relaxed)
    }

    /// Whether something of `cost` bytes may be written: false at the
    /// budget, or when it would reach it (the store is then over, until a
    /// measure finds it below [`RESUME_AT`] again). Called by the writer
    /// only, for each request that adds data, before it writes it.
    pub(super) fn admit(&self, cost: u64) -> bool {
        if self.over() {
            return false;
        }
        // Near the budget, what a commit adds counts twice until the WAL is
        // checkpointed and starts over: in the pages it fills and in the
        // WAL's frames, both of which a measure reads. A reader that holds
        // the WAL (an admin request, a CLI) keeps it from starting over,
        // and a batch admitted by its bytes once then overshot by itself
        // (4.67 MB against 4 MiB in a loaded CI run).
        let cost = if self.near() {
            cost.saturating_mul(2)
        } else {
            cost
        };
        if self.used().saturating_add(cost) >= self.limit() {
            self.over.store(true, Ordering::Relaxed);
            return false;
        }
        self.added.fetch_add(cost, Ordering::Relaxed);
        true
    }

    /// Whether the writer should measure after every commit: within
    /// [`NEAR_PERCENT`] of the budget, or over it.
    pub(super) fn near(&self) -> bool {
        u128::from(self.used()) * 100 >= u128::from(self.limit()) * u128::from(NEAR_PERCENT)
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// A new budget (`systemctl reload`): admits judge by it at once; the
    /// writer's next measure says whether the store is over it (a lower
    /// budget than the use refuses new messages from then on, a higher one
    /// takes them again below [`RESUME_AT`] of it).
    pub(super) fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Why something is refused at the budget, for a `disk_budget` reason
    /// (after its code).
    pub fn refusal_detail(&self) -> String {
        format!(
            "the store is at store.max_db_bytes ({} of {} bytes); resend later",
            self.used(),
            self.limit()
        )
    }

    /// Takes a measure; says whether the store reached the budget or came
    /// back under it since `announced` (whether it was over when last
    /// said). Once over (by a measure, or by an [`Budget::admit`] that
    /// would have reached it), it stays over until the use is below
    /// [`RESUME_AT`] of the budget.
    pub(super) fn record(&self, used: u64, announced: bool) -> Option<Change> {
        self.used.store(used, Ordering::Relaxed);
        self.added.store(0, Ordering::Relaxed);
        let now = if self.over() {
            // Compared as used / limit >= 95 / 100, without overflow.
            u128::from(used) * 100 >= u128::from(self.limit()) * u128::from(RESUME_AT)
        } else {
            used >= self.limit()
        };
        self.over.store(now, Ordering::Relaxed);
        match (announced, now) {
            (false, true) => Some(Change::Reached),
            (true, false) => Some(Change::Freed),
            _ => None,
        }
    }
}

/// The store's use in bytes: pages in use, plus the WAL file beside it.
pub(super) fn measure(conn: &rusqlite::Connection, wal: &std::path::Path) -> rusqlite::Result<u64> {
    let pragma = |name: &str| -> rusqlite::Result<u64> {
        conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
            .map(|v| v.max(0) as u64)
    };
    let pages = pragma("page_count")?.saturating_sub(pragma("freelist_count")?);
    let wal = std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0);
    Ok(pages * pragma("page_size")? + wal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_reached_at_its_limit_and_freed_only_below_95_percent() {
        let b = Budget::new(1000);
        assert_eq!(b.record(500, false), None);
        assert!(!b.over());
        assert_eq!(b.record(1000, false), Some(Change::Reached));
        assert!(b.over());
        assert_eq!(b.record(1200, true), None);
        // Pruning a little is not enough: no flapping at the edge.
        assert_eq!(b.record(960, true), None);
        assert!(b.over());
        assert_eq!(b.record(949, true), Some(Change::Freed));
        assert!(!b.over());
        assert_eq!(b.used(), 949);
        assert_eq!(b.record(999, false), None);
    }

    #[test]
    fn a_new_budget_judges_admits_at_once_and_measures_after() {
        let b = Budget::new(1000);
        assert_eq!(b.record(600, false), None);
        b.clone().set_limit(500);
        assert!(!b.admit(1), "over the lower budget: refused");
        assert_eq!(b.record(600, true), None, "still over");
        b.set_limit(2000);
        assert_eq!(b.record(600, true), Some(Change::Freed));
        assert!(b.admit(100));
    }

    #[test]
    fn what_is_admitted_between_measures_counts_and_what_would_reach_the_budget_is_not() {
        let b = Budget::new(1000);
        assert_eq!(b.record(600, false), None);
        assert!(!b.near());
        assert!(b.admit(200));
        assert_eq!(b.used(), 800);
        assert!(b.near(), "within 75% of the budget");
        // 800 + 200 would reach it: refused, and the store is over now,
        // for everything, small or not.
        assert!(!b.admit(200));
        assert!(b.over());
        assert!(!b.admit(1));
        // The next measure finds 960 in use: reached (it was not said
        // before), and it stays over above 95%.
        assert_eq!(b.record(960, false), Some(Change::Reached));
        assert!(b.over());
        assert_eq!(b.used(), 960, "a measure replaces the estimate");
        assert_eq!(b.record(940, true), Some(Change::Freed));
        assert!(b.admit(10));
    }

    #[test]
    fn an_admit_that_would_reach_the_budget_holds_until_a_measure_is_below_95_percent() {
        let b = Budget::new(1000);
        assert_eq!(b.record(900, false), None);
        assert!(!b.admit(150));
        // Measured under the limit but above 95%: still over, and said so.
        assert_eq!(b.record(970, false), Some(Change::Reached));
        assert!(b.over());
        // Below 95% from the start: over by the estimate only, freed
        // without having been said to be reached.
        let c = Budget::new(1000);
        assert_eq!(c.record(900, false), None);
        assert!(!c.admit(150));
        assert_eq!(c.record(900, false), None);
        assert!(!c.over());
    }

    #[test]
    fn a_measure_counts_pages_in_use_and_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "journal_mode", "WAL").unwrap();
        let wal = dir.path().join("m.db-wal");
        conn.execute_batch("CREATE TABLE t (b BLOB)").unwrap();
        assert!(measure(&conn, &wal).unwrap() > 4096, "the WAL counts");
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        let empty = measure(&conn, &wal).unwrap();
        conn.execute("INSERT INTO t VALUES (zeroblob(200000))", [])
            .unwrap();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        let full = measure(&conn, &wal).unwrap();
        assert!(full >= empty + 190_000, "{empty} -> {full}");
        // Deleted rows free pages: the file keeps its size, the use drops.
        conn.execute("DELETE FROM t", []).unwrap();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        let freed = measure(&conn, &wal).unwrap();
        assert!(freed < empty + 50_000, "{full} -> {freed}");
    }
}
