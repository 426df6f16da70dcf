//! The durable store: one SQLite database in WAL mode, owned by one thread.
//!
//! Invariants:
//! - Only the writer thread touches the connection. Everyone else holds a
//!   [`Store`] handle, whose methods send owned requests to it.
//! - Ops are group-committed: the writer takes everything queued (up to
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

pub mod budget;
pub mod clock;
mod downlink;
pub mod figures;
pub use figures::{AlertScan, DeadSummary};
mod outbox;
pub mod prune;
pub mod record;
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
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::thread;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::{StoreConfig, SyncMode};
use crate::dead_letter::DeadLetter;
use crate::health::Heartbeat;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::receipt::NorthReceipt;
use crate::state::IllegalMove;
use crate::store::record::downlink::{
    BatchRead, CursorMove, Cursors, DownIntake, DownIntakeOutcome, OutboxReceipt, Rejected, Swept,
};
use crate::store::record::uplink::{
    AttemptRecord, Duplicate, Intake, IntakeOutcome, Moved, PendingMessage, Transition,
};
use budget::Budget;
use clock::{Now, StoreClock};

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

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A request to the writer thread, with the channel its answer goes to.
enum Op {
    Intake(Intake, Reply<IntakeOutcome>),
    Reject(DeadLetter, Reply<i64>),
    Transition(Transition, Reply<Option<Moved>>),
    Attempt(AttemptRecord),
    Pending {
        device: DeviceId,
        after: Seq,
        limit: usize,
        reply: Reply<Vec<PendingMessage>>,
    },
    PendingDevices(Reply<Vec<DeviceId>>),
    /// The current state of one message, in commit order with every write.
    Lookup {
        device: DeviceId,
        msg_id: MsgId,
        reply: Reply<Option<Duplicate>>,
    },
    /// Dead-letter stored uplinks whose ttl passed by `now`.
    ExpireDue {
        now: Now,
        reply: Reply<Vec<(DeviceId, MsgId, Moved)>>,
    },
    /// Persist the store clock (see [`clock`]).
    MarkClock,
    /// Replays the CLI asked for, to load whatever their seq.
    TakeReplays(Reply<Vec<PendingMessage>>),
    Down(DownOp),
    /// The watchdog's ping: answered, with the backlog, after the commit of
    /// the batch it lands in, so an answer proves the writer is turning.
    Ping(Reply<Backlog>),
    /// One batch of retention.
    Prune(prune::Cutoffs, Reply<prune::Pruned>),
    /// Every dead letter up to this id had its alert acknowledged.
    DeadAlerted(i64),
    /// What the alerts look at: dead letters after an id, backlog ages.
    AlertScan {
        after_dead: i64,
        limit: usize,
        reply: Reply<AlertScan>,
    },
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

/// Downlink requests (see [`downlink`]).
enum DownOp {
    Intake(DownIntake, Reply<DownIntakeOutcome>),
    Batch {
        device: DeviceId,
        after: Seq,
        limit: usize,
        now: Now,
        reply: Reply<BatchRead>,
    },
    Advance {
        device: DeviceId,
        upto: Seq,
        read: bool,
        now_ms: i64,
        reply: Reply<CursorMove>,
    },
    Nack {
        device: DeviceId,
        seq: Seq,
        reason: String,
        now_ms: i64,
        reply: Reply<CursorMove>,
    },
    Cursors {
        device: DeviceId,
        reply: Reply<Cursors>,
    },
    Sweep {
        now: Now,
        reply: Reply<Swept>,
    },
    /// A refused downlink's dead letter and its `rejected` receipt.
    Reject {
        dl: DeadLetter,
        receipt: NorthReceipt,
        reply: Reply<Rejected>,
    },
    /// A receipt alone: a downlink refused without a dead letter.
    Refuse {
        receipt: NorthReceipt,
        reply: Reply<OutboxReceipt>,
    },
    OutboxPage {
        from: i64,
        limit: usize,
        reply: Reply<Vec<OutboxReceipt>>,
    },
    /// Receipts the upstream acknowledged: out of the outbox.
    ReceiptsSent(Vec<i64>),
    /// A receipt the upstream never takes: out of the outbox, dead-lettered.
    ReceiptDead {
        id: i64,
        dl: DeadLetter,
        reply: Reply<i64>,
    },
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
        // The WAL counts against store.max_db_bytes: after a checkpoint
        // it is cut back to 64 MiB rather than kept at its high-water mark.
        conn.pragma_update(None, "journal_size_limit", 64i64 << 20)?;
        conn.set_prepared_statement_cache_capacity(64);
        schema::check(&conn, &data_dir.join(DB_FILE))?;
        schema::migrate(&mut conn)?;
        let (clock, boot_id) = clock::start(&conn)?;

        let (tx, rx) = mpsc::unbounded_channel();
        let max_batch = cfg.max_batch;
        let stopped = Arc::new(OnceLock::new());
        let beat = Heartbeat::default();
        let budget = Budget::new(cfg.max_db_bytes);
        let mut wal = data_dir.join(DB_FILE).into_os_string();
        wal.push("-wal");
        let writer = writer::Writer::new(
            conn,
            stopped.clone(),
            beat.clone(),
            budget.clone(),
            wal.into(),
            (clock, boot_id),
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
        Ok(Store {
            tx,
            stopped,
            exited,
            beat,
            budget,
            clock,
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

    /// Answers after the commit of the batch it lands in, with the backlog
    /// (the watchdog's liveness check and `STATUS=`).
    pub fn ping(&self) -> impl Future<Output = Result<Backlog, StoreError>> + Send + 'static {
        self.call(Op::Ping)
    }

    /// Bumped at every commit attempt: moving while pings go unanswered
    /// means the writer is retrying a failed commit, not wedged.
    pub fn writer_beat(&self) -> Heartbeat {
        self.beat.clone()
    }

    /// Deletes one batch of what is past its retention (see [`prune`]).
    pub fn prune(
        &self,
        cutoffs: prune::Cutoffs,
    ) -> impl Future<Output = Result<prune::Pruned, StoreError>> + Send + 'static {
        self.call(move |reply| Op::Prune(cutoffs, reply))
    }

    /// Records that every dead letter up to `id` had its alert
    /// acknowledged upstream (never moves back); fire and forget: lost in a
    /// crash, those alerts are only sent again.
    pub fn dead_alerted(&self, id: i64) -> Result<(), StoreError> {
        self.tx
            .send(Op::DeadAlerted(id))
            .map_err(|_| closed(&self.stopped))
    }

    /// Dead letters with an id past `after_dead` (at most `limit`), the
    /// backlog and its oldest messages, and the disk budget.
    pub fn alert_scan(
        &self,
        after_dead: i64,
        limit: usize,
    ) -> impl Future<Output = Result<AlertScan, StoreError>> + Send + 'static {
        let budget = self.budget.clone();
        let scan = self.call(move |reply| Op::AlertScan {
            after_dead,
            limit,
            reply,
        });
        async move {
            let mut scan = scan.await?;
            scan.over_budget = budget.over();
            scan.used_bytes = budget.used();
            scan.max_db_bytes = budget.limit();
            Ok(scan)
        }
    }

    /// The disk budget, as the writer last measured it.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Queues `op` now; the future resolves to its answer after the commit.
    fn call<T: Send + 'static>(
        &self,
        op: impl FnOnce(Reply<T>) -> Op,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        // A refused send drops the op and its reply: the wait below fails.
        let _ = self.tx.send(op(reply));
        let stopped = self.stopped.clone();
        async move { rx.await.unwrap_or_else(|_| Err(closed(&stopped))) }
    }

    fn down<T: Send + 'static>(
        &self,
        op: impl FnOnce(Reply<T>) -> DownOp,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        self.call(move |reply| Op::Down(op(reply)))
    }

    /// Stores an uplink message (or finds it a duplicate).
    pub fn intake(
        &self,
        msg: Intake,
    ) -> impl Future<Output = Result<IntakeOutcome, StoreError>> + Send + 'static {
        self.call(move |reply| Op::Intake(msg, reply))
    }

    /// Writes a dead letter for a rejected message; resolves to its id.
    pub fn reject(
        &self,
        dl: DeadLetter,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'static {
        self.call(move |reply| Op::Reject(dl, reply))
    }

    /// Moves a stored uplink to a final state; resolves to what moved
    /// (`None` if the message was not in a state that allows the move).
    pub fn transition(
        &self,
        t: Transition,
    ) -> impl Future<Output = Result<Option<Moved>, StoreError>> + Send + 'static {
        self.call(move |reply| Op::Transition(t, reply))
    }

    /// Records a failed attempt (fire and forget: losing it in a crash only
    /// gives the message more attempts, never fewer).
    pub fn record_attempt(&self, rec: AttemptRecord) -> Result<(), StoreError> {
        self.tx
            .send(Op::Attempt(rec))
            .map_err(|_| closed(&self.stopped))
    }

    /// Up to `limit` stored messages of `device` with `seq > after`, in order.
    pub fn pending(
        &self,
        device: DeviceId,
        after: Seq,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingMessage>, StoreError>> + Send + 'static {
        self.call(move |reply| Op::Pending {
            device,
            after,
            limit,
            reply,
        })
    }

    /// The message `(device, msg_id)` as it stands once every request made
    /// before this one is committed (`None` if it was never stored).
    pub fn lookup(
        &self,
        device: DeviceId,
        msg_id: MsgId,
    ) -> impl Future<Output = Result<Option<Duplicate>, StoreError>> + Send + 'static {
        self.call(move |reply| Op::Lookup {
            device,
            msg_id,
            reply,
        })
    }

    /// Every device with at least one stored, undelivered message.
    pub fn pending_devices(
        &self,
    ) -> impl Future<Output = Result<Vec<DeviceId>, StoreError>> + Send + 'static {
        self.call(Op::PendingDevices)
    }

    /// Dead-letters stored uplinks whose ttl has passed by `now` (at most
    /// 1,000 per call); resolves to what moved.
    pub fn expire_due(
        &self,
        now: Now,
    ) -> impl Future<Output = Result<Vec<(DeviceId, MsgId, Moved)>, StoreError>> + Send + 'static
    {
        self.call(move |reply| Op::ExpireDue { now, reply })
    }

    /// Takes the replays `ferry dlq replay` asked for (at most 1,000 per
    /// call); resolves to the messages still `stored`.
    pub fn take_replays(
        &self,
    ) -> impl Future<Output = Result<Vec<PendingMessage>, StoreError>> + Send + 'static {
        self.call(Op::TakeReplays)
    }

    /// Stores a downlink once and queues it for each addressed device.
    pub fn down_intake(
        &self,
        msg: DownIntake,
    ) -> impl Future<Output = Result<DownIntakeOutcome, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::Intake(msg, reply))
    }

    /// Reads up to `limit` queue entries of `device` after `after`,
    /// expiring those whose ttl passed by `now`.
    pub fn read_batch(
        &self,
        device: DeviceId,
        after: Seq,
        limit: usize,
        now: Now,
    ) -> impl Future<Output = Result<BatchRead, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::Batch {
            device,
            after,
            limit,
            now,
            reply,
        })
    }

    /// Moves the confirm cursor of `device` to `upto` (and with `read` the
    /// read cursor too).
    pub fn advance(
        &self,
        device: DeviceId,
        upto: Seq,
        read: bool,
        now_ms: i64,
    ) -> impl Future<Output = Result<CursorMove, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::Advance {
            device,
            upto,
            read,
            now_ms,
            reply,
        })
    }

    /// Dead-letters delivery `seq` of `device` with `reason` (as worded).
    pub fn nack(
        &self,
        device: DeviceId,
        seq: Seq,
        reason: String,
        now_ms: i64,
    ) -> impl Future<Output = Result<CursorMove, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::Nack {
            device,
            seq,
            reason,
            now_ms,
            reply,
        })
    }

    /// The downlink cursors of `device`.
    pub fn cursors(
        &self,
        device: DeviceId,
    ) -> impl Future<Output = Result<Cursors, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::Cursors { device, reply })
    }

    /// Expires stored deliveries of messages whose ttl passed by `now`.
    pub fn sweep_downlinks(
        &self,
        now: Now,
    ) -> impl Future<Output = Result<Swept, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::Sweep { now, reply })
    }

    /// Dead-letters a downlink refused at intake and commits its `rejected`
    /// receipt (`receipt` with the reason naming the dead letter).
    pub fn reject_downlink(
        &self,
        dl: DeadLetter,
        receipt: NorthReceipt,
    ) -> impl Future<Output = Result<Rejected, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::Reject { dl, receipt, reply })
    }

    /// Commits the `rejected` receipt of a downlink that is not stored
    /// (refused at the disk budget), with no dead letter.
    pub fn refuse_downlink(
        &self,
        receipt: NorthReceipt,
    ) -> impl Future<Output = Result<OutboxReceipt, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::Refuse { receipt, reply })
    }

    /// Up to `limit` receipts of the outbox with `id >= from`, in id order.
    pub fn outbox_page(
        &self,
        from: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxReceipt>, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::OutboxPage { from, limit, reply })
    }

    /// The upstream acknowledged these receipts: they leave the outbox
    /// (fire and forget: losing it in a crash only sends them again).
    pub fn receipts_sent(&self, ids: Vec<i64>) -> Result<(), StoreError> {
        self.tx
            .send(Op::Down(DownOp::ReceiptsSent(ids)))
            .map_err(|_| closed(&self.stopped))
    }

    /// Moves a receipt the upstream never takes from the outbox to the dead
    /// letters, in one transaction; resolves to the dead letter's id.
    pub fn receipt_dead(
        &self,
        id: i64,
        dl: DeadLetter,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'static {
        self.down(move |reply| DownOp::ReceiptDead { id, dl, reply })
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
