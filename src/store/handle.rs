//! The handle everyone holds: a cheap clone that queues requests for the
//! writer thread (each request itself is written in `requests`) and sees
//! why the writer stopped, once it has.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot, watch};

use super::budget::Budget;
use super::clock::{Now, StoreClock};
use super::error::StoreError;
use super::op::{Asked, Cx, Op, Timing, Told};
use crate::config::RefusalShares;
use crate::health::Heartbeat;

/// A cheap, cloneable handle to the writer thread.
#[derive(Clone)]
pub struct Store {
    pub(super) tx: mpsc::UnboundedSender<Op>,
    /// Why the writer stopped, once it has.
    pub(super) stopped: Arc<OnceLock<String>>,
    /// True from the moment the writer begins to stop on an error (before
    /// it saves what it holds, when its files went).
    pub(super) stopping: watch::Receiver<bool>,
    /// Its sender lives as long as the writer thread, connection included.
    pub(super) exited: watch::Receiver<()>,
    /// Bumped by the writer at every commit attempt, retries included.
    pub(super) beat: Heartbeat,
    pub(super) budget: Budget,
    pub(super) clock: StoreClock,
    /// What refusals at the door may fill (`store::refusal`); `systemctl
    /// reload` may change it ([`Store::set_budget`]).
    pub(super) refusals: Arc<watch::Sender<RefusalShares>>,
    /// The highest uplink row whose `stored` receipt intake has handed on
    /// (or that was stored before this run): a refill reads no newer one
    /// ([`Store::refill`]), so the engine never sends a message north,
    /// and so never answers `delivered` for it, before its `stored` went
    /// out (docs/PROTOCOL.md: receipts in state order).
    pub(super) receipted: Arc<std::sync::atomic::AtomicI64>,
}

impl Store {
    /// A new disk budget and refusal shares (`systemctl reload`), in force
    /// for what is admitted next (see [`Budget::set_limit`]). The WAL's
    /// checkpoint bounds stay those of the budget at open.
    pub fn set_budget(&self, max_db_bytes: u64, refusals: RefusalShares) {
        self.budget.set_limit(max_db_bytes);
        self.refusals.send_replace(refusals);
    }

    /// Intake handed on the `stored` receipt of uplink row `id` (and of
    /// every earlier one: it answers in commit order).
    pub fn receipted(&self, id: i64) {
        self.receipted
            .fetch_max(id, std::sync::atomic::Ordering::AcqRel);
    }

    /// The store clock of this run.
    pub fn clock(&self) -> StoreClock {
        self.clock
    }

    /// Now on the wall clock and the store clock.
    pub fn now(&self) -> Now {
        self.clock.now()
    }

    /// Resolves once the writer thread has exited: after the last handle
    /// is dropped it commits everything queued, closes the database and
    /// exits (`None`), or it stopped earlier on an error (a damaged
    /// database, a failed fsync, its files gone: `Some(cause)`). The
    /// future holds no handle itself.
    pub fn exited(&self) -> impl Future<Output = Option<String>> + Send + 'static {
        let mut exited = self.exited.clone();
        let stopped = self.stopped.clone();
        async move {
            while exited.changed().await.is_ok() {}
            stopped.get().cloned()
        }
    }

    /// Resolves once the writer begins to stop on an error: from then on
    /// nothing more is answered `stored`, and [`Store::exited`] follows
    /// once what the store holds is saved. Pending forever on a store that
    /// closes normally. The future holds no handle itself.
    pub fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.clone();
        async move {
            if stopping.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
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
    pub(super) fn call<T: Send + 'static>(
        &self,
        apply: impl FnMut(&mut Cx<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let timed = self.call_timed(apply);
        async move { timed.await.map(|(value, _)| value) }
    }

    /// [`Store::call`], resolving also to the request's [`Timing`]
    /// through the writer.
    pub(super) fn call_timed<T: Send + 'static>(
        &self,
        apply: impl FnMut(&mut Cx<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> impl Future<Output = Result<(T, Timing), StoreError>> + Send + 'static {
        let (reply, rx) = oneshot::channel();
        // A refused send drops the request and its reply: the wait below fails.
        let _ = self.tx.send(Box::new(Asked {
            apply,
            reply,
            outcome: None,
            queued: std::time::Instant::now(),
        }));
        let stopped = self.stopped.clone();
        async move { rx.await.unwrap_or_else(|_| Err(closed(&stopped))) }
    }

    /// Queues a request nobody waits for; refused only once the writer
    /// has stopped.
    pub(super) fn tell(
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
