//! The disk budget (`store.max_db_bytes`): how much of the disk the store
//! may use, and whether it is at it.
//!
//! The writer measures after its commits (at most every
//! [`MEASURE_EVERY`]): the database's pages in use (page count less free
//! pages, so space that pruning frees counts as free even though the file
//! keeps its size) plus the WAL file. At the budget the store is *over*:
//! intake refuses new uplinks and downlinks (nothing is written for them),
//! and the pruner deletes delivered messages before their retention. It is
//! not over again until the use falls below [`RESUME_AT`] of the budget,
//! so a store at the edge does not flap with every commit. Nothing
//! undelivered is ever deleted to make room.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The writer measures at most this often.
pub(super) const MEASURE_EVERY: Duration = Duration::from_millis(200);
/// Once over, the store takes new messages again below this share of the
/// budget (in percent).
pub const RESUME_AT: u64 = 95;

/// The budget and the writer's latest measure; cheap to clone, read by
/// anyone.
#[derive(Clone, Debug)]
pub struct Budget {
    limit: u64,
    used: Arc<AtomicU64>,
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
            limit,
            used: Arc::default(),
            over: Arc::default(),
        }
    }

    /// Whether new messages are refused.
    pub fn over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// Bytes in use at the latest measure.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Takes a measure; says whether the store just reached the budget or
    /// just came back under it.
    pub(super) fn record(&self, used: u64) -> Option<Change> {
        self.used.store(used, Ordering::Relaxed);
        let was = self.over();
        let now = if was {
            // Compared as used / limit >= 95 / 100, without overflow.
            u128::from(used) * 100 >= u128::from(self.limit) * u128::from(RESUME_AT)
        } else {
            used >= self.limit
        };
        if now == was {
            return None;
        }
        self.over.store(now, Ordering::Relaxed);
        Some(if now { Change::Reached } else { Change::Freed })
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
        assert_eq!(b.record(500), None);
        assert!(!b.over());
        assert_eq!(b.record(1000), Some(Change::Reached));
        assert!(b.over());
        assert_eq!(b.record(1200), None);
        // Pruning a little is not enough: no flapping at the edge.
        assert_eq!(b.record(960), None);
        assert!(b.over());
        assert_eq!(b.record(949), Some(Change::Freed));
        assert!(!b.over());
        assert_eq!(b.used(), 949);
        assert_eq!(b.record(999), None);
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
