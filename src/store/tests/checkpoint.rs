//! The WAL's checkpoint, off the commit path (`store::checkpoint`): the
//! checkpoint thread copies what is committed into `ferry.db` by itself,
//! the WAL starts over, and a clean close still leaves no WAL behind.

use std::path::Path;
use std::time::Duration;

use super::*;

/// The uplinks `ferry.db` itself holds (not its WAL), read from a copy of
/// the file alone; `None` while the copy cannot be read.
fn uplinks_in_db_file(db: &Path) -> Option<i64> {
    let copy = tempfile::tempdir().unwrap();
    let alone = copy.path().join("alone.db");
    std::fs::copy(db, &alone).ok()?;
    rusqlite::Connection::open(&alone)
        .ok()?
        .query_row("SELECT COUNT(*) FROM uplink", [], |r| r.get(0))
        .ok()
}

#[tokio::test]
async fn the_checkpoint_thread_copies_the_wal_into_the_database_and_it_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    // A roomy budget: SQLite's 1,000-page threshold.
    let c = cfg();
    let db = dir.path().join(DB_FILE);
    let wal = dir.path().join(format!("{DB_FILE}-wal"));
    let store = Store::open(dir.path(), &c).unwrap();
    // Just past half the threshold (where the thread starts), far below
    // it (where the writer would copy it all itself), and then no commit:
    // what reaches ferry.db now, the thread copied.
    let mut n = 0;
    while std::fs::metadata(&wal).map_or(0, |m| m.len()) < 505 * 4120 {
        put(&store, "a", &format!("m{n}")).await;
        n += 1;
        assert!(n < 400, "the WAL grew slower than expected: {n} commits");
    }
    let mut copied = None;
    for _ in 0..500 {
        copied = uplinks_in_db_file(&db).filter(|&rows| rows > 0);
        if copied.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        copied.is_some(),
        "nothing of {n} committed messages reached ferry.db: no checkpoint ran"
    );
    // Many more commits: the WAL starts over rather than growing with them.
    for i in 0..600 {
        put(&store, "b", &format!("m{i}")).await;
    }
    let wal_bytes = std::fs::metadata(&wal).unwrap().len();
    assert!(
        wal_bytes < 1500 * 4120,
        "the WAL holds {wal_bytes} bytes after 600 more commits: it did not start over"
    );
    assert_eq!(store.exited_when_dropped().await, None);
    assert!(
        !wal.exists(),
        "a clean close leaves no WAL (the checkpoint thread's connection closes first)"
    );
    assert_eq!(uplinks_in_db_file(&db), Some(n + 600));
}
