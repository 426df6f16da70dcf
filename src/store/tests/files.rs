//! The store's files deleted or replaced under it: nothing more is
//! answered, the store stops with the cause, and what its connection held
//! is saved where a restart (or the operator) finds it.

use std::path::Path;
use std::time::Duration;

use super::*;

/// The uplinks in the database at `path`, read from a copy (so no
/// descriptor of the store's own files is opened and closed here).
fn uplinks_in(path: &Path) -> i64 {
    let copy = tempfile::tempdir().unwrap();
    let db = copy.path().join(DB_FILE);
    std::fs::copy(path, &db).unwrap();
    rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM uplink", [], |r| r.get(0))
        .unwrap()
}

/// A store in `data` (inside a temp dir of its own) holding `n` uplinks.
async fn store_with(data: &Path, n: usize) -> Store {
    let store = Store::open(data, &cfg()).unwrap();
    for i in 0..n {
        put(&store, "a", &format!("m{i}")).await;
    }
    store
}

#[tokio::test]
async fn a_deleted_data_dir_is_answered_with_the_cause_and_saved_back_at_its_name() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let store = store_with(&data, 5).await;
    std::fs::remove_dir_all(&data).unwrap();
    let err = store.intake(intake("a", "late")).await.unwrap_err();
    assert!(err.is_fatal(), "{err}");
    let cause = err.to_string();
    assert!(
        cause.contains("ferry.db was deleted") && cause.contains("saved to"),
        "{cause}"
    );
    // Nothing more is taken, and the handle's waiters see why.
    let again = store.intake(intake("a", "later")).await.unwrap_err();
    assert!(again.to_string().contains("was deleted"), "{again}");
    let exited = store.exited_when_dropped().await;
    assert!(exited.is_some_and(|c| c.contains("was deleted")));
    // The backup is at the database's own name: all five, and the one
    // committed but never answered.
    assert_eq!(uplinks_in(&data.join(DB_FILE)), 6);
    assert!(!data.join("ferry.db-wal").exists());
    let reopened = Store::open(&data, &cfg()).unwrap();
    assert!(matches!(
        put(&reopened, "a", "m0").await,
        IntakeOutcome::Duplicate(_)
    ));
}

#[tokio::test]
async fn a_deleted_wal_is_checkpointed_into_the_database_before_the_store_stops() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 5).await;
    std::fs::remove_file(dir.path().join("ferry.db-wal")).unwrap();
    let err = store.intake(intake("a", "late")).await.unwrap_err();
    assert!(
        err.to_string().contains("ferry.db-wal was deleted")
            && err.to_string().contains("everything committed is in"),
        "{err}"
    );
    assert_eq!(uplinks_in(&dir.path().join(DB_FILE)), 6);
}

#[tokio::test]
async fn a_database_replaced_by_another_file_is_saved_beside_it_and_the_other_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 5).await;
    let other = dir.path().join("other");
    std::fs::write(&other, b"not ferry's").unwrap();
    std::fs::rename(&other, dir.path().join(DB_FILE)).unwrap();
    let err = store.intake(intake("a", "late")).await.unwrap_err();
    let cause = err.to_string();
    assert!(cause.contains("was replaced by another file"), "{cause}");
    let rescued: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("ferry.db.rescued-"))
        .collect();
    assert_eq!(rescued.len(), 1, "{rescued:?}");
    assert!(cause.contains(&rescued[0].display().to_string()), "{cause}");
    assert_eq!(uplinks_in(&rescued[0]), 6);
    assert_eq!(
        std::fs::read(dir.path().join(DB_FILE)).unwrap(),
        b"not ferry's"
    );
    assert!(
        !dir.path().join("ferry.db-wal").exists(),
        "the old WAL is never read with the new file"
    );
}

#[tokio::test]
async fn an_idle_store_notices_its_files_gone_within_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 3).await;
    let exited = store.exited();
    std::fs::remove_file(dir.path().join("ferry.db-wal")).unwrap();
    // Nothing is asked of it: the watcher wakes the writer.
    let cause = tokio::time::timeout(Duration::from_secs(5), exited)
        .await
        .expect("the store stopped on its own");
    assert!(cause.is_some_and(|c| c.contains("ferry.db-wal was deleted")));
    assert_eq!(uplinks_in(&dir.path().join(DB_FILE)), 3);
}
