//! The writer thread: the only user of the SQLite connection.
//!
//! It takes what is queued (up to `store.max_batch` ops), applies it in one
//! transaction and commits; only then are the ops answered, in order. A
//! batch is applied from borrowed ops, so a commit that fails for a passing
//! reason (disk full, I/O error, busy) is simply applied and committed again
//! after a pause, until it goes through. A corrupt database stops the
//! writer: every op is answered with the cause, which the handles keep. An
//! op refused on its own (an illegal move, an unreadable row) is answered
//! with its error and the batch goes on.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, Transaction};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::budget::{self, Budget, Change};
use super::clock::{self, StoreClock};
use super::{prune, uplink, DownOp, Op, Reply, StoreError};
use crate::health::Heartbeat;
use crate::metrics::{self, Count};
use crate::store::record::uplink::EXPIRED_REASON;
use down::apply_down;

mod down;

/// Pauses between attempts at a batch whose commit failed for a passing
/// reason: 100 ms doubling to 5 s.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// A failing store is reported again this often while it lasts.
const REPORT_EVERY: Duration = Duration::from_secs(30);

/// Answers one op (consumed) with the value its application produced.
type Answer = Box<dyn FnOnce(Op) + Send>;

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
                    fail(op, &StoreError::Stopped(cause.clone()));
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
                Ok(answers) => {
                    crate::metrics::commit_took(started.elapsed());
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
                    let pruned = ROWS_PRUNED.with(|p| p.replace(false)) && self.budget.over();
                    for (op, answer) in batch.drain(..).zip(answers) {
                        answer(op);
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
                                fail(op, &StoreError::Stopped(cause.clone()));
                            }
                            return false;
                        }
                        Failure::Batch => {
                            error!(event = "store_commit_failed", error = %e, batch = batch.len(), "store commit failed; nothing in the batch is announced");
                            for op in batch.drain(..) {
                                fail(op, &StoreError::Sqlite(clone_err(&e)));
                            }
                            return true;
                        }
                    }
                }
            }
        }
    }

    /// Applies every op in one transaction and commits it.
    fn apply(&mut self, batch: &[Op]) -> rusqlite::Result<Vec<Answer>> {
        let tx = self.conn.transaction()?;
        let mut answers = Vec::with_capacity(batch.len());
        // The store stamp of every row the batch writes (see schema 13).
        let store_ms = self.clock.0.store_ms();
        for op in batch {
            // Reads are answered after the commit too, so nobody acts on a
            // row that a failed commit would take back.
            answers.push(apply_one(&tx, &mut self.seqs, &self.clock, store_ms, op)?);
        }
        self.seqs.flush(&tx)?;
        tx.commit()?;
        Ok(answers)
    }
}

/// An op's own outcome: a SQLite error fails the whole batch (it is
/// classified and retried or failed as one), any other error is this op's
/// answer alone.
fn settle<T>(r: Result<T, StoreError>) -> rusqlite::Result<Result<T, StoreError>> {
    match r {
        Err(StoreError::Sqlite(e)) => Err(e),
        other => Ok(other),
    }
}

/// An answer that takes the reply out of the op it was made for.
fn answer<T: Send + 'static>(
    r: Result<T, StoreError>,
    take: fn(Op) -> Option<Reply<T>>,
) -> rusqlite::Result<Answer> {
    let v = settle(r)?;
    Ok(Box::new(move |op| {
        if let Some(reply) = take(op) {
            let _ = reply.send(v);
        }
    }))
}

fn apply_one(
    tx: &Transaction<'_>,
    seqs: &mut uplink::SeqCache,
    (clock, boot_id): &(StoreClock, String),
    store_ms: i64,
    op: &Op,
) -> rusqlite::Result<Answer> {
    match op {
        Op::MarkClock => {
            clock::save(tx, &clock::mark(clock, boot_id))?;
            Ok(Box::new(|_| {}))
        }
        Op::Intake(msg, _) => answer(uplink::intake(tx, seqs, msg, store_ms), |op| match op {
            Op::Intake(_, reply) => Some(reply),
            _ => None,
        }),
        Op::Reject(dl, _) => answer(uplink::dead_letter(tx, dl, store_ms), |op| match op {
            Op::Reject(_, reply) => Some(reply),
            _ => None,
        }),
        Op::Transition(t, _) => answer(uplink::transition(tx, t, store_ms), |op| match op {
            Op::Transition(_, reply) => Some(reply),
            _ => None,
        }),
        Op::DeadAlerted(id) => {
            if let Err(e) = settle(uplink::dead_alerted(tx, *id))? {
                debug!(error = %e, "alert mark not moved; those alerts go again after a restart");
            }
            Ok(Box::new(|_| {}))
        }
        Op::Attempt(rec) => {
            if let Err(e) = settle(uplink::record_attempt(tx, rec))? {
                warn!(event = "uplink_attempt_not_recorded", error = %e, "attempt not recorded");
            }
            Ok(Box::new(|_| {}))
        }
        Op::Pending {
            device,
            after,
            limit,
            ..
        } => answer(uplink::pending(tx, device, *after, *limit), |op| match op {
            Op::Pending { reply, .. } => Some(reply),
            _ => None,
        }),
        Op::PendingDevices(_) => answer(uplink::pending_devices(tx), |op| match op {
            Op::PendingDevices(reply) => Some(reply),
            _ => None,
        }),
        Op::Lookup { device, msg_id, .. } => {
            answer(uplink::existing(tx, device, msg_id), |op| match op {
                Op::Lookup { reply, .. } => Some(reply),
                _ => None,
            })
        }
        Op::ExpireDue { now, .. } => answer(
            uplink::expire_due(tx, *now, 1000, EXPIRED_REASON),
            |op| match op {
                Op::ExpireDue { reply, .. } => Some(reply),
                _ => None,
            },
        ),
        Op::TakeReplays(_) => answer(uplink::take_replays(tx, 1000), |op| match op {
            Op::TakeReplays(reply) => Some(reply),
            _ => None,
        }),
        Op::Down(down) => apply_down(tx, down, store_ms),
        Op::Ping(_) => answer(
            super::figures::backlog(tx).map_err(StoreError::from),
            |op| match op {
                Op::Ping(reply) => Some(reply),
                _ => None,
            },
        ),
        Op::AlertScan {
            after_dead, limit, ..
        } => answer(
            uplink::alert_scan(tx, clock.now(), *after_dead, *limit),
            |op| match op {
                Op::AlertScan { reply, .. } => Some(reply),
                _ => None,
            },
        ),
        Op::Prune(cutoffs, _) => {
            let pruned = prune::prune(tx, cutoffs);
            if matches!(&pruned, Ok(p) if p.any()) {
                ROWS_PRUNED.with(|p| p.set(true));
            }
            answer(pruned, |op| match op {
                Op::Prune(_, reply) => Some(reply),
                _ => None,
            })
        }
    }
}

thread_local! {
    /// Set by a prune that deleted rows in the batch being committed (the
    /// writer is one thread); read and cleared after the commit.
    static ROWS_PRUNED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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

/// Answers `op` with an error.
fn fail(op: Op, e: &StoreError) {
    fn err<T>(reply: Reply<T>, e: &StoreError) {
        let _ = reply.send(Err(copy(e)));
    }
    match op {
        Op::Intake(_, r) => err(r, e),
        Op::Reject(_, r) => err(r, e),
        Op::Transition(_, r) => err(r, e),
        Op::Attempt(_) | Op::DeadAlerted(_) | Op::MarkClock => {}
        Op::Pending { reply, .. } => err(reply, e),
        Op::PendingDevices(r) => err(r, e),
        Op::Lookup { reply, .. } => err(reply, e),
        Op::ExpireDue { reply, .. } => err(reply, e),
        Op::TakeReplays(r) => err(r, e),
        Op::Ping(reply) => err(reply, e),
        Op::Prune(_, reply) => err(reply, e),
        Op::AlertScan { reply, .. } => err(reply, e),
        Op::Down(down) => match down {
            DownOp::Intake(_, r) => err(r, e),
            DownOp::Batch { reply, .. } => err(reply, e),
            DownOp::Advance { reply, .. } => err(reply, e),
            DownOp::Nack { reply, .. } => err(reply, e),
            DownOp::Cursors { reply, .. } => err(reply, e),
            DownOp::Sweep { reply, .. } => err(reply, e),
            DownOp::Reject { reply, .. } => err(reply, e),
            DownOp::Refuse { reply, .. } => err(reply, e),
            DownOp::OutboxPage { reply, .. } => err(reply, e),
            DownOp::ReceiptsSent(_) => {}
            DownOp::ReceiptDead { reply, .. } => err(reply, e),
        },
    }
}

/// The errors the writer answers with, copied for each asker.
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Sqlite(e) => StoreError::Sqlite(clone_err(e)),
        StoreError::Stopped(cause) => StoreError::Stopped(cause.clone()),
        StoreError::IllegalMove(m) => StoreError::IllegalMove(*m),
        StoreError::CorruptRow { table, detail } => StoreError::CorruptRow {
            table,
            detail: detail.clone(),
        },
        other => StoreError::Stopped(other.to_string()),
    }
}

fn clone_err(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            rusqlite::Error::SqliteFailure(*code, msg.clone())
        }
        other => rusqlite::Error::InvalidParameterName(other.to_string()),
    }
}
