//! The WAL checkpoint, off the commit path.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its
//! threshold: that commit copies the WAL's pages into `ferry.db` and
//! fsyncs it before it returns, and every request queued behind it waits
//! (at 10,000 msgs/s about one commit in fifty, and the messages of the
//! next few milliseconds with it; docs/BENCHMARKS.md, issue 32). Here the
//! writer's connection has no automatic checkpoint. Instead:
//! - after each commit SQLite tells the writer how many frames the WAL
//!   holds (a WAL hook); past half the threshold ([`super::open`]'s
//!   `wal_bounds`, where SQLite's own checkpoint would run), the
//!   checkpoint thread is woken;
//! - the checkpoint thread, on a connection of its own, runs a `PASSIVE`
//!   checkpoint: it copies what is committed into `ferry.db` while the
//!   writer goes on committing (a WAL lets one checkpoint run beside one
//!   writer), and never waits for a lock;
//! - the WAL starts over from its beginning only once every frame in it
//!   is copied, and only the writer appends: so once the thread has copied
//!   a round, the writer copies the few frames committed meanwhile itself
//!   (between two batches), and its next transaction starts the WAL over.
//!   Should the thread fall behind or fail, the writer copies everything
//!   itself once the WAL reaches the threshold, as SQLite would have: the
//!   WAL (which counts against the disk budget) is never held longer.
//!
//! What must hold: a checkpoint copies only committed frames and a WAL
//! frame is reused only after it is copied and synced (SQLite's own
//! rules, unchanged by who runs it). A checkpoint that fails (a read,
//! write or fsync error) leaves the WAL as it was: the frames stay, and
//! the next checkpoint copies them again, so it is logged and not fatal;
//! a failing disk stops the store at the writer's next commit.

use std::ffi::{c_char, c_int, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};

use rusqlite::{Connection, OpenFlags};
use tracing::{debug, info, warn};

use super::error::StoreError;

/// A round's phases: nothing to do; the thread is copying; the thread
/// has copied, and the writer is to copy the rest.
const IDLE: u8 = 0;
const COPYING: u8 = 1;
const COPIED: u8 = 2;

/// The checkpoint's state, shared by the writer (and its WAL hook) and
/// the checkpoint thread.
pub(super) struct Wal {
    /// The WAL's bound in frames: the thread is woken at half of it, the
    /// writer copies everything itself at it.
    threshold: i64,
    /// Frames in the WAL after the latest commit.
    frames: AtomicI64,
    /// Where the round is: [`IDLE`], [`COPYING`] or [`COPIED`].
    phase: AtomicU8,
    /// Wake-ups for the thread.
    wake: Mutex<Wake>,
    bell: Condvar,
}

#[derive(Default)]
struct Wake {
    /// A round is due.
    due: bool,
    /// Stop: `Some(true)` closing its connection, `Some(false)` leaving
    /// it unclosed.
    stop: Option<bool>,
}

/// The checkpoint thread, held by the writer.
pub(super) struct Checkpointer {
    wal: Arc<Wal>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Takes the automatic checkpoint off `conn` (the writer's) and starts
    /// the thread on a connection of its own to `db`; `threshold` in frames.
    pub(super) fn start(
        conn: &Connection,
        db: &Path,
        threshold: i64,
    ) -> Result<Checkpointer, StoreError> {
        let wal = Arc::new(Wal {
            threshold,
            frames: AtomicI64::new(0),
            phase: AtomicU8::new(IDLE),
            wake: Mutex::new(Wake::default()),
            bell: Condvar::new(),
        });
        let own = Connection::open_with_flags(
            db,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        // Setting it (even to 0) replaces the hook, so this comes first.
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        // SAFETY: `conn` is open and only this thread (the writer's) uses
        // it. The hook's context is `Arc::as_ptr` of `wal`, which the
        // writer keeps (in this `Checkpointer`) for as long as it commits
        // on `conn`; `stop` unhooks it before the connection is closed, and
        // a connection left unclosed commits no more.
        unsafe {
            rusqlite::ffi::sqlite3_wal_hook(
                conn.handle(),
                Some(wal_hook),
                Arc::as_ptr(&wal) as *mut c_void,
            );
        }
        let shared = wal.clone();
        let thread = thread::Builder::new()
            .name("ferry-checkpoint".into())
            .spawn(move || run(own, &shared))
            .map_err(|source| StoreError::DataDir {
                path: db.to_path_buf(),
                source,
            })?;
        Ok(Checkpointer {
            wal,
            thread: Some(thread),
        })
    }

    /// Between batches: copies what the thread's round left (or all of it,
    /// if the WAL has reached the threshold), so the next
    /// transaction can start the WAL over. Busy (the thread is copying) is
    /// no failure: the next batch tries again.
    pub(super) fn after_commit(&self, conn: &Connection) {
        let behind = self.wal.frames.load(Ordering::Relaxed) >= self.wal.threshold;
        let copied = self
            .wal
            .phase
            .compare_exchange(COPIED, IDLE, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if !(copied || behind) {
            return;
        }
        if behind {
            // The thread's round would make it busy, and the WAL would
            // grow past its bound meanwhile.
            self.wait_for_round();
        }
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            debug!(error = %e, "the writer's checkpoint did not run");
        }
    }

    /// Waits (at most a second) for a round of the thread to end: only one
    /// checkpoint runs at a time, and the writer's `TRUNCATE` after a
    /// prune would be refused beside it. No round starts meanwhile: only
    /// the writer's commits start one.
    pub(super) fn wait_for_round(&self) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while self.wal.phase.load(Ordering::Acquire) == COPYING && std::time::Instant::now() < until
        {
            thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Stops the thread and waits for it: `close` drops its connection (a
    /// clean close, so that the writer's is the last and SQLite checkpoints
    /// and removes the WAL); otherwise it is left unclosed, as the writer's
    /// is when the store stops on an error.
    pub(super) fn stop(mut self, conn: &Connection, close: bool) {
        // SAFETY: as in `start`; no hook after this, so the context may go.
        unsafe {
            rusqlite::ffi::sqlite3_wal_hook(conn.handle(), None, std::ptr::null_mut());
        }
        {
            let mut wake = self.wal.wake.lock().unwrap_or_else(|p| p.into_inner());
            wake.stop = Some(close);
        }
        self.wal.bell.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// SQLite's WAL hook, called on the writer's thread after each commit
/// with the frames the WAL now holds.
unsafe extern "C" fn wal_hook(
    ctx: *mut c_void,
    _db: *mut rusqlite::ffi::sqlite3,
    _name: *const c_char,
    frames: c_int,
) -> c_int {
    // SAFETY: `ctx` is the `Wal` the writer keeps alive while hooked.
    let wal = unsafe { &*(ctx as *const Wal) };
    wal.frames.store(frames as i64, Ordering::Relaxed);
    if 2 * frames as i64 >= wal.threshold
        && wal
            .phase
            .compare_exchange(IDLE, COPYING, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        let mut wake = wal.wake.lock().unwrap_or_else(|p| p.into_inner());
        wake.due = true;
        wal.bell.notify_one();
    }
    rusqlite::ffi::SQLITE_OK
}

/// The thread: a `PASSIVE` checkpoint each time the WAL passes half the
/// threshold, until stopped.
fn run(conn: Connection, wal: &Wal) {
    let mut failing = false;
    loop {
        let close = {
            let mut wake = wal.wake.lock().unwrap_or_else(|p| p.into_inner());
            while !wake.due && wake.stop.is_none() {
                wake = wal.bell.wait(wake).unwrap_or_else(|p| p.into_inner());
            }
            wake.due = false;
            wake.stop
        };
        if let Some(close) = close {
            if !close {
                // Left as the writer's is: closing it would checkpoint
                // nothing (it is not the last), but nothing should touch
                // files the store stopped on.
                std::mem::forget(conn);
            }
            return;
        }
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            Ok(()) => {
                if failing {
                    info!(
                        event = "store_checkpoint_again",
                        "the store's WAL is checkpointed again"
                    );
                    failing = false;
                }
                wal.phase.store(COPIED, Ordering::Release);
            }
            Err(e) => {
                // The next commit past the threshold starts another round.
                wal.phase.store(IDLE, Ordering::Release);
                if !failing {
                    warn!(
                        event = "store_checkpoint_failed",
                        error = %e,
                        "the store's WAL checkpoint failed: its frames stay in the WAL and are copied again at the next one (the writer copies them itself when the WAL reaches its bound); if it repeats, check the disk"
                    );
                    failing = true;
                }
            }
        }
    }
}
