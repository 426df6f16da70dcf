//! A request as the writer holds it: what to apply in the batch's
//! transaction and where its answer goes, behind one object-safe trait, so
//! applying, answering and failing are written once for every request.
//!
//! What must hold:
//! - [`Queued::apply`] borrows the request: a batch whose commit fails for
//!   a passing reason is applied again, op by op, from the same requests.
//!   Each keeps its outcome until the commit went through; only then is it
//!   sent ([`Queued::answer`]). A reply is therefore proof of a commit.
//! - A SQLite error from a request fails the whole batch (it is classified
//!   and retried or failed as one); any other error is that request's
//!   answer alone ([`settle`]).
//! - A request told without a reply (fire and forget) says nothing when
//!   its batch fails: it is lost, as a crash would lose it.

use std::time::Instant;

use rusqlite::Transaction;
use tokio::sync::oneshot;

use super::clock::StoreClock;
use super::error::StoreError;
use super::uplink::SeqCache;

/// A request to the writer thread, with the channel its answer goes to.
pub(super) type Op = Box<dyn Queued>;

/// What a request sees while its batch is applied.
pub(super) struct Cx<'a> {
    pub tx: &'a Transaction<'a>,
    /// Per-device uplink seqs, flushed with the batch.
    pub seqs: &'a mut SeqCache,
    pub clock: &'a StoreClock,
    /// This boot's id, for the clock's marks.
    pub boot_id: &'a str,
    /// The store stamp of every row the batch writes (see schema 13).
    pub store_ms: i64,
    /// Set by a prune that deleted rows; read and cleared by the writer
    /// after the commit.
    pub pruned: &'a mut bool,
}

/// When the batch that committed a request began (its attempt that
/// committed) and when its commit returned, on the monotonic clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batch {
    pub started: Instant,
    pub committed: Instant,
}

/// A request's way through the writer, on the monotonic clock: when it was
/// queued, when the batch that committed it began, when that commit
/// returned (for the stage histograms, `crate::metrics::Stage`).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub queued: Instant,
    pub started: Instant,
    pub committed: Instant,
}

/// One queued request, whatever its answer's type.
pub(super) trait Queued: Send {
    /// Applies the request in the batch's transaction and keeps its
    /// outcome; an `Err` fails the batch.
    fn apply(&mut self, cx: &mut Cx<'_>) -> rusqlite::Result<()>;
    /// Sends the kept outcome: called after the commit of `batch`, in
    /// queue order.
    fn answer(self: Box<Self>, batch: Batch);
    /// Answers with `e` instead: the batch failed or the store stopped.
    fn fail(self: Box<Self>, e: &StoreError);
}

/// A request whose caller waits for its answer (and its [`Timing`]).
pub(super) struct Asked<F, T> {
    pub apply: F,
    pub reply: oneshot::Sender<Result<(T, Timing), StoreError>>,
    pub outcome: Option<Result<T, StoreError>>,
    /// When it was queued.
    pub queued: Instant,
}

impl<F, T> Queued for Asked<F, T>
where
    F: FnMut(&mut Cx<'_>) -> Result<T, StoreError> + Send,
    T: Send,
{
    fn apply(&mut self, cx: &mut Cx<'_>) -> rusqlite::Result<()> {
        // Reads are answered after the commit too, so nobody acts on a row
        // that a failed commit would take back.
        self.outcome = Some(settle((self.apply)(cx))?);
        Ok(())
    }

    fn answer(self: Box<Self>, batch: Batch) {
        if let Some(outcome) = self.outcome {
            let timing = Timing {
                queued: self.queued,
                started: batch.started,
                committed: batch.committed,
            };
            let _ = self.reply.send(outcome.map(|value| (value, timing)));
        }
    }

    fn fail(self: Box<Self>, e: &StoreError) {
        let _ = self.reply.send(Err(copy(e)));
    }
}

/// A request nobody waits for (fire and forget).
pub(super) struct Told<F>(pub F);

impl<F> Queued for Told<F>
where
    F: FnMut(&mut Cx<'_>) -> rusqlite::Result<()> + Send,
{
    fn apply(&mut self, cx: &mut Cx<'_>) -> rusqlite::Result<()> {
        (self.0)(cx)
    }

    fn answer(self: Box<Self>, _: Batch) {}

    fn fail(self: Box<Self>, _: &StoreError) {}
}

/// A request's own outcome: a SQLite error fails the whole batch (it is
/// classified and retried or failed as one), any other error is this
/// request's answer alone.
pub(super) fn settle<T>(r: Result<T, StoreError>) -> rusqlite::Result<Result<T, StoreError>> {
    match r {
        Err(StoreError::Sqlite(e)) => Err(e),
        other => Ok(other),
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

pub(super) fn clone_err(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            rusqlite::Error::SqliteFailure(*code, msg.clone())
        }
        other => rusqlite::Error::InvalidParameterName(other.to_string()),
    }
}
