//! The writer thread: the only user of the SQLite connection.
//!
//! It takes what is queued (up to `store.max_batch` requests), applies it
//! in one transaction and commits; only then are the requests answered, in
//! order. A batch is applied from borrowed requests, each keeping its
//! outcome until the commit (see [`super::op`]), so a commit that fails for
//! a passing reason (disk full, I/O error, busy) is simply applied and
//! committed again after a pause, until it goes through. A corrupt database
//! stops the writer: every request is answered with the cause, which the
//! handles keep. A request refused on its own (an illegal move, an
//! unreadable row) is answered with its error and the batch goes on.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::budget::{self, Budget, Change};
use super::clock::{self, StoreClock};
use super::error::StoreError;
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

/// What a failed commit means.
enum Failure {
    /// Disk full, I/O, locks: try the same batch again later.
    Passing,
    /// The database is damaged: stop.
    Fatal,
    /// Anything else (a bug in a statement): the batch fails.
    Batch,
}

fn classify(e: &rusqlite::Error) -> Failure {
    match e.sqlite_error_code() {
        Some(
            ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::OutOfMemory
            | ErrorCode::CannotOpen,
        ) => Failure::Passing,
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => Failure::Fatal,
        _ => Failure::Batch,
    }
}

pub(super) struct Writer {
    conn: Connection,
    seqs: uplink::SeqCache,
    stopped: Arc<OnceLock<String>>,
    beat: Heartbeat,
    budget: Budget,
    /// The WAL file, measured with the database against the budget.
    wal: PathBuf,
    measured: Instant,
    /// The store clock and this boot's id, for its marks.
    clock: (StoreClock, String),
    /// Set by a prune that deleted rows in the batch being committed; read
    /// and cleared after the commit.
    rows_pruned: bool,
}

impl Writer {
    pub(super) fn new(
        conn: Connection,
        stopped: Arc<OnceLock<String>>,
        beat: Heartbeat,
        budget: Budget,
        wal: PathBuf,
        clock: (StoreClock, String),
    ) -> Writer {
        let mut w = Writer {
            conn,
            seqs: uplink::SeqCache::default(),
            stopped,
            beat,
            budget,
            wal,
            measured: Instant::now(),
            clock,
            rows_pruned: false,
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
        match self.budget.record(used) {
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
                // Answer whatever is still queued with the cause, then stop.
                rx.close();
                let cause = self.stopped.get().cloned().unwrap_or_default();
                while let Ok(op) = rx.try_recv() {
                    op.fail(&StoreError::Stopped(cause.clone()));
                }
                return;
            }
        }
        // A clean close: the clock as it stands, so a restart after a
        // reboot loses none of this run.
        let (clock, boot_id) = &self.clock;
        if let Err(e) = clock::save(&self.conn, &clock::mark(clock, boot_id)) {
            warn!(event = "store_clock_not_saved", error = %e, "the store clock was not saved at close; a restart resumes from its last mark");
        }
        debug!("store writer stopped: every handle dropped");
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
                        if let Err(e) =
                            self.conn
                                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                        {
                            debug!(error = %e, "WAL not truncated after a prune");
                        }
                    }
                    if pruned || self.measured.elapsed() >= budget::MEASURE_EVERY {
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
                        Failure::Fatal => {
                            let cause = format!("the database is damaged: {e}");
                            error!(event = "store_damaged", error = %e, "store stopped: the database is damaged");
                            let _ = self.stopped.set(cause.clone());
                            for op in batch.drain(..) {
                                op.fail(&StoreError::Stopped(cause.clone()));
                            }
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
