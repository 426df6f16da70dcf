//! Opening the store: the data directory, the store's lock (see
//! [`super::lock`]: taken before SQLite opens the file), the connection
//! and its pragmas, the schema check and migrations, the store clock, the
//! files' identities (see [`super::files`]), and the writer thread that
//! owns the connection (and then the lock) from then on, with the thread
//! that watches the files.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::thread;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, watch};

use super::budget::Budget;
use super::checkpoint::Checkpointer;
use super::error::StoreError;
use super::files::{self, Files};
use super::handle::Store;
use super::{clock, lock, schema, writer};
use crate::config::{StoreConfig, SyncMode};
use crate::health::Heartbeat;

/// The database file inside `gateway.data_dir`.
pub const DB_FILE: &str = "ferry.db";

impl Store {
    /// Opens (creating if needed) the database in `data_dir`, migrates it and
    /// starts the writer thread.
    pub fn open(data_dir: &Path, cfg: &StoreConfig) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let db = data_dir.join(DB_FILE);
        // Before SQLite opens the file: a second gateway stops here.
        let hold = lock::take(&db)?;
        let mut conn = Connection::open_with_flags(
            &db,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // 4 MiB of page cache (default 2 MiB): what a commit and a refill
        // touch now and again stays in memory; the rest is in the OS's
        // page cache. 16 MiB cost 13 MiB of RSS at 10,000 msgs/s for no
        // measurable gain (docs/BENCHMARKS.md, issue 32).
        conn.pragma_update(None, "cache_size", -4096)?;
        let sync = match cfg.sync {
            SyncMode::Full => "FULL",
            SyncMode::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        conn.pragma_update(None, "busy_timeout", 5000)?;
        // The WAL counts against store.max_db_bytes: it is checkpointed
        // (every 1,000 pages, or every 1/32 of a small budget) and then
        // cut back to 64 MiB (or 1/16 of a small budget) rather than kept
        // at its high-water mark, so on a small budget it is not the WAL
        // that fills it.
        // SQLite's own checkpoint until the writer starts, the migrations'
        // included; then it runs off the commit path ([`super::checkpoint`]).
        let (checkpoint_pages, wal_limit) = wal_bounds(cfg.max_db_bytes);
        conn.pragma_update(None, "wal_autocheckpoint", checkpoint_pages)?;
        conn.pragma_update(None, "journal_size_limit", wal_limit)?;
        conn.set_prepared_statement_cache_capacity(64);
        schema::check(&conn, &data_dir.join(DB_FILE))?;
        schema::migrate(&mut conn)?;
        let (clock, boot_id) = clock::start(&conn)?;
        // Whatever is stored now had its `stored` receipt in an earlier run
        // (or its device resends it, and is answered as a duplicate).
        let receipted: i64 =
            conn.query_row("SELECT coalesce(max(id), 0) FROM uplink", [], |r| r.get(0))?;
        // SQLite has its WAL and index open by now.
        let files = Arc::new(
            Files::record(&db, hold.id).map_err(|gone| StoreError::Open {
                path: db.clone(),
                source: std::io::Error::other(format!(
                    "{} was {:?} while the store was opened",
                    db.display(),
                    gone.how
                )),
            })?,
        );

        let (tx, rx) = mpsc::unbounded_channel();
        let max_batch = cfg.max_batch;
        let stopped = Arc::new(OnceLock::new());
        let (stopping_tx, stopping) = watch::channel(false);
        let beat = Heartbeat::default();
        let budget = Budget::new(cfg.max_db_bytes);
        let checkpoint = Checkpointer::start(&conn, &db, checkpoint_pages)?;
        let writer = writer::Writer::new(
            conn,
            checkpoint,
            stopped.clone(),
            beat.clone(),
            budget.clone(),
            files.path(files::Which::Wal).to_path_buf(),
            (clock, boot_id),
            writer::Held {
                hold,
                files: files.clone(),
                stopping: stopping_tx,
            },
        );
        let (exiting, exited) = watch::channel(());
        thread::Builder::new()
            .name("ferry-store".into())
            .spawn(move || {
                writer.run(rx, max_batch);
                // The connection is closed by now (`run` consumed it).
                drop(exiting);
            })
            .map_err(|e| StoreError::DataDir {
                path: data_dir.to_path_buf(),
                source: e,
            })?;
        let writer_queue = tx.downgrade();
        thread::Builder::new()
            .name("ferry-store-watch".into())
            .spawn(move || files::watch(files, writer_queue))
            .map_err(|e| StoreError::DataDir {
                path: data_dir.to_path_buf(),
                source: e,
            })?;
        Ok(Store {
            tx,
            stopped,
            stopping,
            exited,
            beat,
            budget,
            clock,
            refusals: Arc::new(watch::Sender::new(cfg.refusals)),
            receipted: Arc::new(std::sync::atomic::AtomicI64::new(receipted)),
        })
    }
}

/// The WAL's checkpoint threshold (pages) and size limit (bytes) for a
/// budget of `max_db_bytes`: SQLite's 1,000 pages and ferry's 64 MiB, or
/// less on a budget too small for them.
fn wal_bounds(max_db_bytes: u64) -> (i64, i64) {
    const PAGE: u64 = 4096;
    let pages = (max_db_bytes / 32 / PAGE).clamp(16, 1000);
    let limit = (max_db_bytes / 16).min(64 << 20);
    (pages as i64, limit as i64)
}

#[cfg(test)]
mod wal_tests {
    #[test]
    fn the_wal_is_held_to_a_small_share_of_a_small_budget_and_to_sqlites_default_otherwise() {
        assert_eq!(super::wal_bounds(8 << 30), (1000, 64 << 20));
        assert_eq!(super::wal_bounds(4 << 20), (32, 256 << 10));
        assert_eq!(super::wal_bounds(1 << 20), (16, 64 << 10));
    }
}
