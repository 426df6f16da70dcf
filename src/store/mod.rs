//! The durable store: one SQLite database in WAL mode, owned by one thread.
//!
//! Invariants:
//! - Only the writer thread touches the connection. Everyone else holds a
//!   [`Store`] handle, whose methods send owned requests to it.
//! - Requests are group-committed: the writer takes everything queued (up to
//!   `store.max_batch`), applies it in one transaction, commits (one fsync
//!   with `synchronous=FULL`) and only then answers any of them. A reply is
//!   therefore proof of a commit.
//! - One gateway per store: the store holds an exclusive `flock` on the
//!   database file's inode for the writer's whole life ([`lock`]); a
//!   second gateway on the same store stops at its start, naming the
//!   first, whatever became of `ferry.pid`. A file system that gives no
//!   lock stops the start as well.
//! - A commit that fails for a passing reason (disk full, a lock held by
//!   a reader) is tried again, the same batch, until it succeeds: nobody
//!   is answered meanwhile, unanswered requests pile up to their callers'
//!   bounds and intake stops, so the broker holds the devices back.
//!   Nothing is lost and nothing waits for a reconnect.
//! - A failed fsync (any SQLite I/O error) is never retried on the same
//!   connection: after one, the kernel may have dropped the pages it did
//!   not write and cleared the error, so the next fsync's success proves
//!   nothing. The store stops, answering nothing of the failed batch, and
//!   the gateway exits; a restart reopens the store from its files. (The
//!   writer's module docs say why a full disk is different.)
//! - A database that turns out corrupt stops the writer; every asker, and
//!   the gateway's exit, names the cause.
//! - The store's files stay the ones its names give (`files`): after
//!   every commit, before anything is answered, and every second besides,
//!   `ferry.db`, its WAL and its index are checked by inode. One deleted
//!   or replaced stops the store the same way, after what the connection
//!   still holds is saved (to `ferry.db`, or beside a file that took its
//!   name), so nothing answered `stored` is missing after a restart.
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
//! - Every request that adds data (a message, a delivery, a dead letter) is
//!   admitted against the disk budget by its estimated size in the
//!   writer, before it writes ([`budget`]); at the budget a message the
//!   store knows is still answered as the duplicate it is, and only what
//!   is new is refused. Refusals at the door are held to their sender's
//!   share of the dead letters ([`refusal`]).
//! - An illegal state change or a row this build cannot read answers that
//!   one request with an error ([`StoreError::IllegalMove`],
//!   [`StoreError::CorruptRow`]); the rest of the batch commits.
//!
//! The parts, bottom up: `error` is the one error type; [`lock`] the
//! store's lock and [`files`] its watch on its files; [`clock`] the
//! store clock and [`budget`] the disk budget; [`record`] the records it
//! persists and hands back; `schema` the ordered migrations; `uplink`,
//! `downlink`, `outbox`, [`refusal`] (refusals at the door, bounded per
//! peer), [`prune`] and [`figures`] the SQL of each concern,
//! each run inside the writer's transaction; `op` is how the writer holds
//! a request (applied, answered or failed the same way for all); `writer`
//! the thread and its group commit, `checkpoint` the WAL's checkpoint off
//! its commit path; `handle` the [`Store`] everyone holds;
//! `requests` every request, each written once as a `Store` method whose
//! closure the writer applies; `open` opens the database and starts the
//! writer thread. Only this file names them all; none of them imports it.

pub mod budget;
mod checkpoint;
pub mod clock;
mod downlink;
mod error;
pub mod figures;
mod files;
mod handle;
mod keys;
pub mod lock;
mod op;
mod open;
mod outbox;
pub mod prune;
pub mod record;
pub mod refusal;
mod requests;
mod schema;
mod uplink;
mod writer;

pub use error::StoreError;
pub use figures::{AlertScan, Backlog, DeadSummary};
pub use handle::Store;
pub use lock::Holder;
pub use op::Timing;
pub use open::DB_FILE;

/// Who holds the lock of the store in `data_dir`: the running gateway's
/// pid, as far as `/proc/locks` shows (see [`lock`]). Never opens the
/// database file.
pub fn holder(data_dir: &std::path::Path) -> Holder {
    lock::holder(&data_dir.join(DB_FILE))
}

/// The schema version this build writes (`PRAGMA user_version`).
pub fn schema_version() -> usize {
    schema::latest()
}

/// For tests that build a store without the writer thread.
#[cfg(test)]
pub(crate) use schema::migrate;

#[cfg(test)]
mod tests;
