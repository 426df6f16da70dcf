//! The durable store: one SQLite database in WAL mode, owned by one thread.
//!
//! Invariants:
//! - Only the writer thread touches the connection. Everyone else holds a
//!   [`Store`] handle and sends owned [`Op`]s over a bounded channel.
//! - Ops are group-committed: the writer takes everything queued (up to
//!   `store.max_batch`), applies it in one transaction, commits (one fsync
//!   with `synchronous=FULL`) and only then answers any of them. A reply is
//!   therefore proof of a commit.
//! - A commit that fails for a passing reason (disk full, I/O error, a lock)
//!   is tried again, the same batch, until it succeeds: nobody is answered
//!   meanwhile, the queue fills and intake stops, so the broker holds the
//!   devices back. Nothing is lost and nothing waits for a reconnect.
//! - A database that turns out corrupt stops the writer; every asker, and
//!   the gateway's exit, names the cause.
//! - Per-device sequence numbers are assigned inside the same transaction
//!   as the message they number.

pub mod downlink;
mod schema;
mod uplink;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Instant;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::info;

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
    #[error("the database {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("the store stopped: {0}")]
    Stopped(String),
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
    /// Why the writer stopped, once it has.
    stopped: Arc<OnceLock<String>>,
    /// Its sender lives as long as the writer thread, connection included.
    exited: watch::Receiver<()>,
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
        check(&conn, &data_dir.join(DB_FILE))?;
        schema::migrate(&mut conn)?;

        let (tx, rx) = mpsc::channel(cfg.max_batch * 4);
        let max_batch = cfg.max_batch;
        let stopped = Arc::new(OnceLock::new());
        let writer = writer::Writer::new(conn, stopped.clone());
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
        Ok(Store {
            tx,
            stopped,
            exited,
        })
    }

    /// Resolves once the writer thread has exited: after the last handle
    /// is dropped it commits everything queued, closes the database and
    /// exits (or it stopped earlier on a damaged database). The future
    /// holds no handle itself.
    pub fn exited(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut exited = self.exited.clone();
        async move { while exited.changed().await.is_ok() {} }
    }

    async fn send(&self, op: Op) -> Result<(), StoreError> {
        self.tx.send(op).await.map_err(|_| self.closed())
    }

    /// Why nothing more can be asked: the writer's cause, if it gave one.
    fn closed(&self) -> StoreError {
        match self.stopped.get() {
            Some(cause) => StoreError::Stopped(cause.clone()),
            None => StoreError::Closed,
        }
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
        rx.await.map_err(|_| self.closed())?
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
        rx.await.map_err(|_| self.closed())?
    }
}

/// Refuses a database SQLite finds damaged, naming what is wrong: it is
/// found at start, not by the first message that touches a bad page.
fn check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let started = Instant::now();
    let corrupt = |detail: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let problems: Vec<String> = conn
        .prepare("PRAGMA quick_check(5)")
        .and_then(|mut stmt| {
            stmt.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                corrupt(e.to_string())
            }
            _ => StoreError::Sqlite(e),
        })?;
    if problems != ["ok"] {
        let found = problems.join("; ").replace('\n', " ");
        return Err(corrupt(format!(
            "database disk image is malformed ({found})"
        )));
    }
    info!(
        took_ms = started.elapsed().as_millis() as u64,
        "store checked"
    );
    Ok(())
}

#[cfg(test)]
mod tests;
