//! The durable store: one SQLite database in WAL mode, owned by one thread.
//!
//! Invariants:
//! - Only the writer thread touches the connection. Everyone else holds a
//!   [`Store`] handle and sends owned [`Op`]s over a bounded channel.
//! - Ops are group-committed: the writer takes everything queued (up to
//!   `store.max_batch`), applies it in one transaction, commits (one fsync
//!   with `synchronous=FULL`) and only then answers any of them. A reply is
//!   therefore proof of a commit; a failed commit answers every op in the
//!   batch with an error and nothing is announced.
//! - Per-device sequence numbers are assigned inside the same transaction
//!   as the message they number.

pub mod downlink;
mod schema;
mod uplink;

use std::path::{Path, PathBuf};
use std::thread;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error};

use crate::config::{StoreConfig, SyncMode};
use crate::ids::{DeviceId, Seq};

pub use uplink::{
    AttemptRecord, DeadLetter, Duplicate, Intake, IntakeOutcome, Moved, PendingMessage, Transition,
    EXPIRED_REASON,
};

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
    #[error("the store writer has stopped")]
    Closed,
}

/// A request to the writer thread, with the channel its answer goes to.
pub enum Op {
    Intake(Intake, oneshot::Sender<Result<IntakeOutcome, StoreError>>),
    Reject(DeadLetter, oneshot::Sender<Result<i64, StoreError>>),
    Transition(
        Transition,
        oneshot::Sender<Result<Option<uplink::Moved>, StoreError>>,
    ),
    Attempt(uplink::AttemptRecord),
    Pending {
        device: DeviceId,
        after: Seq,
        limit: usize,
        reply: oneshot::Sender<Result<Vec<PendingMessage>, StoreError>>,
    },
    PendingDevices(oneshot::Sender<Result<Vec<crate::ids::DeviceId>, StoreError>>),
    /// Dead-letter stored uplinks whose ttl passed by `now_ms`.
    ExpireDue {
        now_ms: i64,
        reply: Reply<Vec<(DeviceId, crate::ids::MsgId, Moved)>>,
    },
    Down(DownOp),
}

pub type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// Downlink requests (see [`downlink`]).
pub enum DownOp {
    Intake(downlink::DownIntake, Reply<downlink::DownIntakeOutcome>),
    Batch {
        device: DeviceId,
        after: Seq,
        limit: usize,
        now_ms: i64,
        reply: Reply<downlink::BatchRead>,
    },
    Advance {
        device: DeviceId,
        upto: Seq,
        read: bool,
        now_ms: i64,
        reply: Reply<downlink::CursorMove>,
    },
    Nack {
        device: DeviceId,
        seq: Seq,
        reason: String,
        now_ms: i64,
        reply: Reply<downlink::CursorMove>,
    },
    Cursors {
        device: DeviceId,
        reply: Reply<downlink::Cursors>,
    },
    Sweep {
        now_ms: i64,
        reply: Reply<Vec<downlink::DeliveryEvent>>,
    },
}

/// A cheap, cloneable handle to the writer thread.
#[derive(Clone)]
pub struct Store {
    tx: mpsc::Sender<Op>,
}

impl Store {
    /// Opens (creating if needed) the database in `data_dir`, migrates it and
    /// starts the writer thread.
    pub fn open(data_dir: &Path, cfg: &StoreConfig) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let mut conn = Connection::open_with_flags(
            data_dir.join(DB_FILE),
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // 16 MiB of page cache (default 2 MiB): the index pages of every
        // active device stay in memory.
        conn.pragma_update(None, "cache_size", -16384)?;
        let sync = match cfg.sync {
            SyncMode::Full => "FULL",
            SyncMode::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        conn.pragma_update(None, "busy_timeout", 5000)?;
        conn.set_prepared_statement_cache_capacity(64);
        schema::migrate(&mut conn)?;

        let (tx, rx) = mpsc::channel(cfg.max_batch * 4);
        let max_batch = cfg.max_batch;
        thread::Builder::new()
            .name("ferry-store".into())
            .spawn(move || Writer::new(conn).run(rx, max_batch))
            .map_err(|e| StoreError::DataDir {
                path: data_dir.to_path_buf(),
                source: e,
            })?;
        Ok(Store { tx })
    }

    async fn send(&self, op: Op) -> Result<(), StoreError> {
        self.tx.send(op).await.map_err(|_| StoreError::Closed)
    }

    /// Queues an uplink message; the receiver resolves after its commit.
    pub async fn intake(
        &self,
        msg: Intake,
    ) -> Result<oneshot::Receiver<Result<IntakeOutcome, StoreError>>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(Op::Intake(msg, reply)).await?;
        Ok(rx)
    }

    /// Queues a dead letter for a rejected message; resolves to its id after commit.
    pub async fn reject(
        &self,
        dl: DeadLetter,
    ) -> Result<oneshot::Receiver<Result<i64, StoreError>>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(Op::Reject(dl, reply)).await?;
        Ok(rx)
    }

    /// Queues a state transition; resolves after commit to what moved
    /// (`None` if the message was not in a state that allows the move).
    pub async fn transition(
        &self,
        t: Transition,
    ) -> Result<oneshot::Receiver<Result<Option<uplink::Moved>, StoreError>>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(Op::Transition(t, reply)).await?;
        Ok(rx)
    }

    /// Records a failed attempt (fire and forget: losing it in a crash only
    /// gives the message more attempts, never fewer).
    pub async fn record_attempt(&self, rec: uplink::AttemptRecord) -> Result<(), StoreError> {
        self.send(Op::Attempt(rec)).await
    }

    /// Up to `limit` stored messages of `device` with `seq > after`, in order.
    pub async fn pending(
        &self,
        device: crate::ids::DeviceId,
        after: crate::ids::Seq,
        limit: usize,
    ) -> Result<Vec<PendingMessage>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(Op::Pending {
            device,
            after,
            limit,
            reply,
        })
        .await?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Sends a downlink request built around its reply channel; the
    /// receiver resolves after the batch it lands in commits.
    pub async fn down<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> DownOp,
    ) -> Result<oneshot::Receiver<Result<T, StoreError>>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(Op::Down(make(reply))).await?;
        Ok(rx)
    }

    /// Dead-letters stored uplinks whose ttl has passed (at most 1,000 per
    /// call); resolves after the commit to what moved.
    pub async fn expire_due(
        &self,
        now_ms: i64,
    ) -> Result<
        oneshot::Receiver<Result<Vec<(DeviceId, crate::ids::MsgId, Moved)>, StoreError>>,
        StoreError,
    > {
        let (reply, rx) = oneshot::channel();
        self.send(Op::ExpireDue { now_ms, reply }).await?;
        Ok(rx)
    }

    /// Every device with at least one stored, undelivered message.
    pub async fn pending_devices(&self) -> Result<Vec<crate::ids::DeviceId>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.send(Op::PendingDevices(reply)).await?;
        rx.await.map_err(|_| StoreError::Closed)?
    }
}

/// A reply held back until its batch commits: it gets the commit's error,
/// if any, and answers its asker with the value or the error.
type Deferred = Box<dyn FnOnce(Option<&rusqlite::Error>) + Send>;

fn defer<T: Send + 'static>(reply: oneshot::Sender<Result<T, StoreError>>, value: T) -> Deferred {
    Box::new(move |err| {
        // A dropped receiver means its asker went away; the commit stands.
        let _ = reply.send(match err {
            None => Ok(value),
            Some(e) => Err(StoreError::Sqlite(clone_err(e))),
        });
    })
}

fn clone_err(e: &rusqlite::Error) -> rusqlite::Error {
    match e {
        rusqlite::Error::SqliteFailure(code, msg) => {
            rusqlite::Error::SqliteFailure(*code, msg.clone())
        }
        other => rusqlite::Error::InvalidParameterName(other.to_string()),
    }
}

struct Writer {
    conn: Connection,
    seqs: uplink::SeqCache,
}

impl Writer {
    fn new(conn: Connection) -> Writer {
        Writer {
            conn,
            seqs: uplink::SeqCache::default(),
        }
    }

    fn run(mut self, mut rx: mpsc::Receiver<Op>, max_batch: usize) {
        let mut batch = Vec::with_capacity(max_batch);
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            while batch.len() < max_batch {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.commit_batch(&mut batch);
        }
        debug!("store writer stopped: every handle dropped");
    }

    /// Applies `batch` in one transaction; answers only after the commit.
    fn commit_batch(&mut self, batch: &mut Vec<Op>) {
        let size = batch.len();
        let mut replies = Vec::with_capacity(size);
        let result = (|| -> rusqlite::Result<()> {
            let tx = self.conn.transaction()?;
            for op in batch.drain(..) {
                // Reads are answered after the commit too, so nobody acts on
                // a row that a failed commit would take back.
                let deferred = match op {
                    Op::Intake(msg, reply) => {
                        defer(reply, uplink::intake(&tx, &mut self.seqs, msg)?)
                    }
                    Op::Reject(dl, reply) => defer(reply, uplink::dead_letter(&tx, &dl)?),
                    Op::Transition(t, reply) => defer(reply, uplink::transition(&tx, &t)?),
                    Op::Attempt(rec) => {
                        uplink::record_attempt(&tx, &rec)?;
                        continue;
                    }
                    Op::Pending {
                        device,
                        after,
                        limit,
                        reply,
                    } => defer(reply, uplink::pending(&tx, &device, after, limit)?),
                    Op::PendingDevices(reply) => defer(reply, uplink::pending_devices(&tx)?),
                    Op::ExpireDue { now_ms, reply } => {
                        defer(reply, uplink::expire_due(&tx, now_ms, 1000)?)
                    }
                    Op::Down(op) => match op {
                        DownOp::Intake(msg, reply) => defer(reply, downlink::intake(&tx, &msg)?),
                        DownOp::Batch {
                            device,
                            after,
                            limit,
                            now_ms,
                            reply,
                        } => defer(
                            reply,
                            downlink::read_batch(&tx, &device, after, limit, now_ms)?,
                        ),
                        DownOp::Advance {
                            device,
                            upto,
                            read,
                            now_ms,
                            reply,
                        } => defer(reply, downlink::advance(&tx, &device, upto, read, now_ms)?),
                        DownOp::Nack {
                            device,
                            seq,
                            reason,
                            now_ms,
                            reply,
                        } => defer(reply, downlink::nack(&tx, &device, seq, &reason, now_ms)?),
                        DownOp::Cursors { device, reply } => {
                            defer(reply, downlink::cursors(&tx, &device)?)
                        }
                        DownOp::Sweep { now_ms, reply } => {
                            defer(reply, downlink::sweep_expired(&tx, now_ms)?)
                        }
                    },
                };
                replies.push(deferred);
            }
            self.seqs.flush(&tx)?;
            tx.commit()
        })();
        match result {
            Ok(()) => {
                self.seqs.committed();
                replies.into_iter().for_each(|r| r(None));
            }
            Err(e) => {
                error!(error = %e, batch = size, "store commit failed; nothing in the batch is announced");
                self.seqs.rolled_back();
                // Ops not yet applied when the error struck are dropped with
                // their reply channels, which their askers see as a failure.
                batch.clear();
                replies.into_iter().for_each(|r| r(Some(&e)));
            }
        }
    }
}

#[cfg(test)]
mod tests;
