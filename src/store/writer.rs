//! The writer thread: the only user of the SQLite connection.
//!
//! It takes what is queued (up to `store.max_batch` requests), applies it
//! in one transaction and commits; then it checks that the store's files
//! are still the ones it has open (see [`super::files`]), and only then
//! are the requests answered, in order. A batch is applied from borrowed
//! requests, each keeping its outcome until the commit (see
//! [`super::op`]), so a commit that fails for a passing reason is simply
//! applied and committed again after a pause, until it goes through.
//! A request refused on its own (an illegal move, an unreadable row) is
//! answered with its error and the batch goes on.
//!
//! What a failed commit means ([`classify`]):
//! - `SQLITE_BUSY`, `SQLITE_LOCKED` (a CLI connection holds a lock), out
//!   of memory, `SQLITE_CANTOPEN`: passing; the same batch again.
//! - `SQLITE_FULL` (disk full): passing too. SQLite reports it when a
//!   `write` or `ftruncate` itself returns `ENOSPC`: the kernel refused
//!   the bytes, so no page it took was dropped behind SQLite's back, and
//!   SQLite rolled the transaction back; the retry writes it whole again.
//!   (Space refused only at writeback, as on a thin or network volume,
//!   fails the fsync instead, and is treated as below.)
//! - Any `SQLITE_IOERR` (`IOERR_FSYNC`, `IOERR_WRITE`, `IOERR_DIR_FSYNC`,
//!   `IOERR_READ`, ...): the store stops, never retried on this
//!   connection. After a failed fsync the kernel may have dropped the
//!   dirty pages and cleared the error (PostgreSQL's "fsyncgate", 2018),
//!   so a later fsync that succeeds proves nothing about them; what this
//!   connection believes is on disk may not be. Nothing of the failed
//!   batch is answered; every request is answered with the cause, the
//!   connection is left unclosed (no checkpoint runs on a disk that
//!   failed), the gateway exits, and a restart opens the store afresh:
//!   SQLite rebuilds its view from the files, the integrity check runs,
//!   and devices resend what was not answered (their ids make a resend
//!   of a stored message a duplicate, answered with its seq). What was
//!   answered `stored` before the failure had its fsync succeed.
//! - `SQLITE_CORRUPT`, `SQLITE_NOTADB`: the database is damaged; the
//!   store stops the same way.
//! - Anything else (a bug in a statement): the batch fails, the store
//!   goes on.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode};
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

use super::budget::{self, Budget, Change};
use super::checkpoint::Checkpointer;
use super::clock::{self, StoreClock};
use super::error::{io_words, StoreError};
use super::files::{self, Files};
use super::lock::Hold;
use super::op::{clone_err, Batch, Cx, Op};
use super::uplink;
use crate::health::Heartbeat;
use crate::metrics::{self, Count};

/// Pauses between attempts at a batch whose commit failed for a passing
/// reason: 100 ms doubling to 5 s.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// A failing store is reported again this often while it lasts.
const REPORT_EVERY: Duration = Duration::from_secs(30);

/// What a failed commit means (see the module docs).
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// Disk full, locks, memory: try the same batch again later.
    Passing,
    /// An I/O error (a failed fsync, write or read): stop, never retry on
    /// this connection.
    Poisoned,
    /// The database is damaged: stop.
    Fatal,
    /// Anything else (a bug in a statement): the batch fails.
    Batch,
}

fn classify(e: &rusqlite::Error) -> Failure {
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DiskFull
            | ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::OutOfMemory
            | ErrorCode::CannotOpen,
        ) => Failure::Passing,
        Some(ErrorCode::SystemIoFailure) => Failure::Poisoned,
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => Failure::Fatal,
        _ => Failure::Batch,
    }
}

/// What the writer holds besides its connection: the store's lock (let
/// go only after the connection is closed), the files it watches, and
/// where it says, first thing, that it is stopping on an error (so the
/// gateway is unready while what the store holds is being saved).
pub(super) struct Held {
    pub hold: Hold,
    pub files: Arc<Files>,
    pub stopping: watch::Sender<bool>,
}

pub(super) struct Writer {
    conn: Connection,
    /// The WAL's checkpoint, off the commit path; `None` once stopped.
    checkpoint: Option<Checkpointer>,
    seqs: uplink::SeqCache,
    stopped: Arc<OnceLock<String>>,
    beat: Heartbeat,
    budget: Budget,
    /// The WAL file, measured with the database against the budget.
    wal: PathBuf,
    measured: Instant,
    /// Whether the store was over its budget when last said (logged).
    announced_over: bool,
    /// The store clock and this boot's id, for its marks.
    clock: (StoreClock, String),
    /// Set by a prune that deleted rows in the batch being committed; read
    /// and cleared after the commit.
    rows_pruned: bool,
    held: Held,
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        conn: Connection,
        checkpoint: Checkpointer,
        stopped: Arc<OnceLock<String>>,
        beat: Heartbeat,
        budget: Budget,
        wal: PathBuf,
        clock: (StoreClock, String),
        held: Held,
    ) -> Writer {
        let mut w = Writer {
            conn,
            checkpoint: Some(checkpoint),
            seqs: uplink::SeqCache::default(),
            stopped,
            beat,
            budget,
            wal,
            measured: Instant::now(),
            announced_over: false,
            clock,
            rows_pruned: false,
            held,
        };
        // A store opened at its budget refuses from the first message.
        w.measure_budget();
        w
    }

    /// Measures the store against its budget and says when that changes.
    fn measure_budget(&mut self) {
        self.measured = Instant::now();
        let used = match budget::measure(&self.conn, &self.wal) {
            Ok(used) => used,
            Err(e) => {
                debug!(error = %e, "store size not measured");
                return;
            }
        };
        let change = self.budget.record(used, self.announced_over);
        self.announced_over = self.budget.over();
        match change {
            Some(Change::Reached) => warn!(
                event = "disk_budget_reached",
                used_bytes = used,
                max_db_bytes = self.budget.limit(),
                total = metrics::count(Count::DiskBudgetReached),
                "disk budget reached: new uplinks and downlinks are refused until delivered messages are pruned; nothing undelivered is deleted"
            ),
            Some(Change::Freed) => info!(
                event = "disk_budget_freed",
                used_bytes = used,
                max_db_bytes = self.budget.limit(),
                "disk budget: space freed, new messages are taken again"
            ),
            None => {}
        }
    }

    pub(super) fn run(mut self, mut rx: mpsc::UnboundedReceiver<Op>, max_batch: usize) {
        let wedge_at = test_wedge();
        let mut batch = Vec::with_capacity(max_batch);
        while let Some(first) = rx.blocking_recv() {
            if let Some(at) = wedge_at {
                if Instant::now() >= at {
                    wedge();
                }
            }
            batch.push(first);
            while batch.len() < max_batch {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            if !self.commit_batch(&mut batch) {
                self.end_checkpoints(false);
                // Answer whatever is still queued with the cause, then stop.
                rx.close();
                let cause = self.stopped.get().cloned().unwrap_or_default();
                while let Ok(op) = rx.try_recv() {
                    op.fail(&StoreError::Stopped(cause.clone()));
                }
                // Left as they are, unclosed until the process ends: a
                // close would checkpoint (on a disk that failed, or into
                // files no longer at their names) and, closing the lock's
                // descriptor, drop SQLite's locks with it.
                std::mem::forget(self.conn);
                std::mem::forget(self.held.hold);
                return;
            }
        }
        // The checkpoint thread's connection first, so that the writer's
        // is the last and its close checkpoints and removes the WAL.
        self.end_checkpoints(true);
        // A clean close: the clock as it stands, so a restart after a
        // reboot loses none of this run.
        let (clock, boot_id) = &self.clock;
        if let Err(e) = clock::save(&self.conn, &clock::mark(clock, boot_id)) {
            warn!(event = "store_clock_not_saved", error = %e, "the store clock was not saved at close; a restart resumes from its last mark");
        }
        // The connection first: the lock's descriptor closes after it.
        drop(self.conn);
        drop(self.held.hold);
        debug!("store writer stopped: every handle dropped");
    }

    /// Stops the checkpoint thread: `close` drops its connection, else it
    /// is left unclosed (the store stopped on an error).
    fn end_checkpoints(&mut self, close: bool) {
        if let Some(c) = self.checkpoint.take() {
            c.stop(&self.conn, close);
        }
    }

    /// Stops the store with `cause`: every request of `batch`, and every
    /// later one, is answered with it.
    fn stop(&mut self, cause: String, batch: &mut Vec<Op>) {
        self.held.stopping.send_replace(true);
        let _ = self.stopped.set(cause.clone());
        for op in batch.drain(..) {
            op.fail(&StoreError::Stopped(cause.clone()));
        }
    }

    /// An I/O error in words, with the OS error behind it.
    fn io_failure(&self, e: &rusqlite::Error) -> String {
        // SAFETY: the connection's handle, open, on its own thread.
        let errno = unsafe { rusqlite::ffi::sqlite3_system_errno(self.conn.handle()) };
        io_words(e, errno)
    }

    /// Stops on an I/O error (see the module docs); `batch` is what it
    /// leaves unanswered.
    fn poisoned(&mut self, e: &rusqlite::Error, batch: &mut Vec<Op>) {
        let what = self.io_failure(e);
        error!(
            event = "store_io_failed",
            error = %what,
            batch = batch.len(),
            "store stopped: an I/O error on the store's disk: {what}. Nothing of the failed batch was answered and it is not retried on this connection (after a failed fsync the disk may not hold what the kernel said it would); ferry exits, and a restart reopens the store from its files. If it happens again, the disk or its file system is failing: see the kernel log (dmesg) and move gateway.data_dir to a healthy disk"
        );
        self.stop(
            format!("an I/O error on the store's disk: {what}; restart ferry (it reopens the store), and if it happens again, check the disk"),
            batch,
        );
    }

    /// Commits `batch` (emptying it) and answers it; false if the store
    /// must stop.
    fn commit_batch(&mut self, batch: &mut Vec<Op>) -> bool {
        let mut pause = RETRY_FIRST;
        let mut failing_since: Option<Instant> = None;
        let mut reported = Instant::now();
        loop {
            self.beat.bump();
            let started = Instant::now();
            match self.apply(batch) {
                Ok(()) => {
                    let done = Batch {
                        started,
                        committed: Instant::now(),
                    };
                    crate::metrics::commit_took(done.committed - started);
                    self.seqs.committed();
                    // Committed, but to the files the names still give?
                    if let Err(gone) = self.held.files.check() {
                        self.held.stopping.send_replace(true);
                        // No checkpoint beside the rescue's own.
                        self.end_checkpoints(false);
                        let cause = files::stop(&self.conn, &self.held.files, gone, &self.beat);
                        self.stop(cause, batch);
                        return false;
                    }
                    if let Some(since) = failing_since {
                        info!(
                            event = "store_commits_again",
                            failed_for_ms = since.elapsed().as_millis() as u64,
                            batch = batch.len(),
                            "store commits again"
                        );
                    }
                    // The WAL file keeps its largest size after a
                    // checkpoint, so at the budget the space a prune frees
                    // might never show: after a prune that deleted rows, the WAL is
                    // checkpointed and truncated, and measured at once (a
                    // reader mid-read leaves it as it is; the next prune
                    // tries again).
                    let pruned = std::mem::take(&mut self.rows_pruned) && self.budget.over();
                    for op in batch.drain(..) {
                        op.answer(done);
                    }
                    if pruned {
                        // A round of the checkpoint thread would make it busy.
                        if let Some(c) = &self.checkpoint {
                            c.wait_for_round();
                        }
                        if let Err(e) =
                            self.conn
                                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                        {
                            if classify(&e) == Failure::Poisoned {
                                self.poisoned(&e, &mut Vec::new());
                                return false;
                            }
                            debug!(error = %e, "WAL not truncated after a prune");
                        }
                    } else if let Some(c) = &self.checkpoint {
                        c.after_commit(&self.conn);
                    }
                    // Near the budget every commit is measured, so what
                    // was admitted by estimate is soon replaced by what
                    // the files hold.
                    if pruned
                        || self.budget.near()
                        || self.measured.elapsed() >= budget::MEASURE_EVERY
                    {
                        self.measure_budget();
                    }
                    return true;
                }
                Err(e) => {
                    self.seqs.rolled_back();
                    match classify(&e) {
                        Failure::Passing => {
                            let now = Instant::now();
                            if failing_since.is_none() || reported.elapsed() >= REPORT_EVERY {
                                warn!(event = "store_commit_retrying", error = %e, batch = batch.len(), retry_in_ms = pause.as_millis() as u64, "store commit failed; the batch is held and tried again, nothing is answered meanwhile");
                                reported = now;
                            }
                            failing_since.get_or_insert(now);
                            std::thread::sleep(pause);
                            pause = (pause * 2).min(RETRY_MAX);
                        }
                        Failure::Poisoned => {
                            self.poisoned(&e, batch);
                            return false;
                        }
                        Failure::Fatal => {
                            error!(event = "store_damaged", error = %e, "store stopped: the database is damaged");
                            self.stop(format!("the database is damaged: {e}"), batch);
                            return false;
                        }
                        Failure::Batch => {
                            error!(event = "store_commit_failed", error = %e, batch = batch.len(), "store commit failed; nothing in the batch is announced");
                            for op in batch.drain(..) {
                                op.fail(&StoreError::Sqlite(clone_err(&e)));
                            }
                            return true;
                        }
                    }
                }
            }
        }
    }

    /// Applies every request in one transaction and commits it.
    fn apply(&mut self, batch: &mut [Op]) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        let (clock, boot_id) = &self.clock;
        let mut cx = Cx {
            tx: &tx,
            seqs: &mut self.seqs,
            clock,
            boot_id,
            store_ms: clock.store_ms(),
            pruned: &mut self.rows_pruned,
        };
        for op in batch.iter_mut() {
            op.apply(&mut cx)?;
        }
        self.seqs.flush(&tx)?;
        tx.commit()
    }
}

/// The test hook behind the watchdog test: in debug builds only,
/// `TEST_FERRY_WEDGE_WRITER_AFTER_MS=N` (not `FERRY_*`: those are config
/// keys to the loader) makes the writer stop for good at
/// the first request it takes N ms after it started, as a writer stuck in
/// a system call would. Release builds never read it.
fn test_wedge() -> Option<Instant> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let ms: u64 = std::env::var("TEST_FERRY_WEDGE_WRITER_AFTER_MS")
        .ok()?
        .parse()
        .ok()?;
    Some(Instant::now() + Duration::from_millis(ms))
}

fn wedge() -> ! {
    warn!(
        event = "store_writer_wedged",
        "store writer wedged on purpose (TEST_FERRY_WEDGE_WRITER_AFTER_MS)"
    );
    loop {
        std::thread::park();
    }
}
