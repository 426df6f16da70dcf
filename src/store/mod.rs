//! The durable store: one SQLite database in WAL mode, owned by one thread.
//!
//! Invariants:
//! - Only the writer thread touches the connection. Everyone else holds a
//!   [`Store`] handle, whose methods send owned requests to it.
//! - Requests are group-committed: the writer takes everything queued (up to
//!   `store.max_batch`), applies it in one transaction, commits (one fsync
//!   with `synchronous=FULL`) and only then answers any of them. A reply is
//!   therefore proof of a commit.
//! - A commit that fails for a passing reason (disk full, I/O error, a lock)
//!   is tried again, the same batch, until it succeeds: nobody is answered
//!   meanwhile, unanswered requests pile up to their callers' bounds and
//!   intake stops, so the broker holds the devices back. Nothing is lost and
//!   nothing waits for a reconnect.
//! - A database that turns out corrupt stops the writer; every asker, and
//!   the gateway's exit, names the cause.
//! - Per-device sequence numbers are assigned inside the same transaction
//!   as the message they number, and every receipt for the backend is
//!   committed in the outbox (`receipt_outbox`) with the change it reports.
//! - Every call is one future resolving to `Result<T, StoreError>` after
//!   the commit of the batch it landed in. The request is queued when the
//!   method is called, not when the future is first polled: requests reach
//!   the writer in call order, and a caller may keep many futures pending
//!   (a `FuturesUnordered`) without waiting on any. The queue itself is
//!   unbounded; each caller bounds what it has outstanding (intake: 16,384
//!   messages or 32 MiB; the downlink task: 4,096 requests; the uplink
//!   engine: 16,384 before it applies more backend acks), so a stalled store still holds the
//!   devices back.
//! - An illegal state change or a row this build cannot read answers that
//!   one request with an error ([`StoreError::IllegalMove`],
//!   [`StoreError::CorruptRow`]); the rest of the batch commits.
//!
//! The parts: `open` opens the database and starts the writer thread;
//! `requests` is every request, each written once as a [`Store`] method
//! whose closure the writer applies in its transaction; `op` is how the
//! writer holds a request (applied, answered or failed the same way for
//! all); `writer` is the thread and its group commit; `schema` the ordered
//! migrations; `uplink`, `downlink`, `outbox`, [`prune`] and [`figures`]
//! the SQL of each concern; [`record`] the records it persists and hands
//! back; [`clock`] the store clock; [`budget`] the disk budget.

pub mod budget;
pub mod clock;
mod downlink;
pub mod figures;
pub use figures::{AlertScan, DeadSummary};
mod op;
mod open;
mod outbox;
pub mod prune;
pub mod record;
mod requests;
mod schema;
mod uplink;
mod writer;

/// The schema version this build writes (`PRAGMA user_version`).
pub fn schema_version() -> usize {
    schema::latest()
}

/// For tests that build a store without the writer thread.
#[cfg(test)]
pub(crate) use schema::migrate;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot, watch};

use crate::health::Heartbeat;
use crate::state::IllegalMove;
use budget::Budget;
use clock::StoreClock;
use op::{Asked, Cx, Op, Told};

/// The database file inside `gateway.data_dir`.
pub const DB_FILE: &str = "ferry.db";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the database {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    /// A row holds what this build cannot read (an unknown state name, a bad
    /// id): written by a newer ferry or by hand. Only the request that read
    /// it fails.
    #[error("a row of {table} cannot be read: {detail}")]
    CorruptRow { table: &'static str, detail: String },
    /// The request asked for a move the state machine forbids; nothing of it
    /// was written.
    #[error("refused: {0}")]
    IllegalMove(#[from] IllegalMove),
    #[error("the store stopped: {0}")]
    Stopped(String),
    #[error("the store writer has stopped")]
    Closed,
}

impl StoreError {
    /// Whether the store is gone for good (stopped, or its writer ended):
    /// nothing more can be asked of it, and the gateway stops with the cause.
    pub fn is_fatal(&self) -> bool {
        matches!(self, StoreError::Stopped(_) | StoreError::Closed)
    }
}

/// What waits to be delivered, counted for `STATUS=` (cheap: the uplink
/// count reads the partial index of stored rows, the downlink one sums
/// per-device cursors).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Stored uplinks not yet delivered or dead.
    pub uplinks: u64,
    /// Downlink queue entries past their device's confirm cursor.
    pub downlinks: u64,
}

/// A cheap, cloneable handle to the writer thread.
#[derive(Clone)]
pub struct Store {
    tx: mpsc::UnboundedSender<Op>,
    /// Why the writer stopped, once it has.
    stopped: Arc<OnceLock<String>>,
    /// Its sender lives as long as the writer thread, connection included.
    exited: watch::Receiver<()>,
    /// Bumped by the writer at every commit attempt, retries included.
    beat: Heartbeat,
    budget: Budget,
    clock: StoreClock,
}

impl Store {
    /// Resolves once the writer thread has exited: after the last handle
    /// is dropped it commits everything queued, closes the database and
    /// exits (or it stopped earlier on a damaged database). The future
    /// holds no handle itself.
    pub fn exited(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut exited = self.exited.clone();
        async move { while exited.changed().await.is_ok() {} }
    }

    /// Bumped at every commit attempt: moving while pings go unanswered
    /// means the writer is retrying a failed commit, not wedged.
    pub fn writer_beat(&self) -> Heartbeat {
        self.beat.clone()
    }

    /// The disk budget, as the writer last measured it.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Queues a request now: `apply` runs in the transaction of the batch
    /// it lands in (again, should that commit be retried); the future
    /// resolves to its outcome after the commit.
    fn call<T: Send + 'static>(
        &self,
        apply: impl FnMut(&mut Cx<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        // A refused send drops the request and its reply: the wait below fails.
        let _ = self.tx.send(Box::new(Asked {
            apply,
            reply,
            outcome: None,
        }));
        let stopped = self.stopped.clone();
        async move { rx.await.unwrap_or_else(|_| Err(closed(&stopped))) }
    }

    /// Queues a request nobody waits for; refused only once the writer
    /// has stopped.
    fn tell(
        &self,
        apply: impl FnMut(&mut Cx<'_>) -> rusqlite::Result<()> + Send + 'static,
    ) -> Result<(), StoreError> {
        self.tx
            .send(Box::new(Told(apply)))
            .map_err(|_| closed(&self.stopped))
    }
}

/// Why nothing more can be asked: the writer's cause, if it gave one.
fn closed(stopped: &OnceLock<String>) -> StoreError {
    match stopped.get() {
        Some(cause) => StoreError::Stopped(cause.clone()),
        None => StoreError::Closed,
    }
}

#[cfg(test)]
mod tests;
