//! Every request the store takes, each written once: a [`Store`] method
//! whose closure the writer applies in the batch's transaction (see
//! [`super::op`]). A method that returns a future queues its request when
//! it is called; one that returns `Result<(), StoreError>` is fire and
//! forget, refused only once the writer has stopped.

use std::future::Future;

use tracing::{debug, warn};

use super::clock::Now;
use super::error::StoreError;
use super::figures::Backlog;
use super::figures::{self, AlertScan};
use super::handle::Store;
use super::op::{settle, Timing};
use super::record::downlink::{
    BatchRead, CursorMove, Cursors, DownIntake, DownIntakeOutcome, OutboxReceipt, Rejected, Swept,
};
use super::record::uplink::{
    AttemptRecord, Duplicate, Intake, IntakeOutcome, Moved, PendingMessage, Transition,
    EXPIRED_REASON,
};
use super::refusal::{self, Kept, Refusal};
use super::{clock, downlink, outbox, prune, uplink};
use crate::dead_letter::DeadLetter;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::receipt::NorthReceipt;

/// Devices (and dead-letter shares) named per kind when the store is at
/// its budget.
const HOLDERS_TOP: usize = 3;

/// At most this many rows per call of the sweeps that take what is due
/// ([`Store::expire_due`], [`Store::take_replays`]).
const SWEEP_LIMIT: usize = 1000;

/// Uplinks.
impl Store {
    /// Stores an uplink message (or finds it a duplicate).
    pub fn intake(
        &self,
        msg: Intake,
    ) -> impl Future<Output = Result<IntakeOutcome, StoreError>> + Send + 'static {
        let timed = self.intake_timed(msg);
        async move { timed.await.map(|(outcome, _)| outcome) }
    }

    /// [`Store::intake`], with the request's way through the writer (for
    /// the uplink stage histograms).
    pub fn intake_timed(
        &self,
        msg: Intake,
    ) -> impl Future<Output = Result<(IntakeOutcome, Timing), StoreError>> + Send + 'static {
        let budget = self.budget.clone();
        self.call_timed(move |cx| uplink::intake(cx.tx, cx.seqs, &msg, &budget, cx.store_ms))
    }

    /// Files a message refused at the door as a dead letter against its
    /// sender's share (`store::refusal`): resolves to the row that holds
    /// it, or to [`Refusal::AtBudget`] if nothing could be written.
    pub fn reject(
        &self,
        dl: DeadLetter,
    ) -> impl Future<Output = Result<Refusal, StoreError>> + Send + 'static {
        let kept = Kept::of(dl);
        let (shares, budget) = (*self.refusals.borrow(), self.budget.clone());
        self.call(move |cx| Ok(refusal::file(cx.tx, &kept, &shares, &budget, cx.store_ms)?))
    }

    /// Moves a stored uplink to a final state; resolves to what moved
    /// (`None` if the message was not in a state that allows the move).
    pub fn transition(
        &self,
        t: Transition,
    ) -> impl Future<Output = Result<Option<Moved>, StoreError>> + Send + 'static {
        self.call(move |cx| uplink::transition(cx.tx, &t, cx.store_ms))
    }

    /// Moves several stored uplinks, in order, in one request: each
    /// resolves as [`Store::transition`] would. One request, not one per
    /// message, for the acks the engine applies in one turn.
    pub fn transitions(
        &self,
        ts: Vec<Transition>,
    ) -> impl Future<Output = Result<Vec<Result<Option<Moved>, StoreError>>, StoreError>> + Send + 'static
    {
        self.call(move |cx| {
            ts.iter()
                .map(|t| settle(uplink::transition(cx.tx, t, cx.store_ms)))
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(StoreError::Sqlite)
        })
    }

    /// Records a failed attempt (fire and forget: losing it in a crash only
    /// gives the message more attempts, never fewer).
    pub fn record_attempt(&self, rec: AttemptRecord) -> Result<(), StoreError> {
        self.tell(move |cx| {
            if let Err(e) = settle(uplink::record_attempt(cx.tx, &rec))? {
                warn!(event = "uplink_attempt_not_recorded", error = %e, "attempt not recorded");
            }
            Ok(())
        })
    }

    /// Up to `limit` stored messages of `device` with `seq > after`, in order.
    pub fn pending(
        &self,
        device: DeviceId,
        after: Seq,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingMessage>, StoreError>> + Send + 'static {
        self.call(move |cx| uplink::pending(cx.tx, &device, after, limit, i64::MAX))
    }

    /// [`Store::pending`] for the engine's refills: only messages whose
    /// `stored` receipts have gone out (see [`Store::receipted`]); a newer
    /// one comes to the engine from intake, after its receipt.
    pub fn refill(
        &self,
        device: DeviceId,
        after: Seq,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<PendingMessage>, StoreError>> + Send + 'static {
        let receipted = self.receipted.clone();
        self.call(move |cx| {
            let upto = receipted.load(std::sync::atomic::Ordering::Acquire);
            uplink::pending(cx.tx, &device, after, limit, upto)
        })
    }

    /// The message `(device, msg_id)` as it stands once every request made
    /// before this one is committed (`None` if it was never stored).
    pub fn lookup(
        &self,
        device: DeviceId,
        msg_id: MsgId,
    ) -> impl Future<Output = Result<Option<Duplicate>, StoreError>> + Send + 'static {
        self.call(move |cx| uplink::existing(cx.tx, &device, &msg_id))
    }

    /// Every device with at least one stored, undelivered message.
    pub fn pending_devices(
        &self,
    ) -> impl Future<Output = Result<Vec<DeviceId>, StoreError>> + Send + 'static {
        self.call(|cx| uplink::pending_devices(cx.tx))
    }

    /// Dead-letters stored uplinks whose ttl has passed by `now` (at most
    /// 1,000 per call); resolves to what moved.
    pub fn expire_due(
        &self,
        now: Now,
    ) -> impl Future<Output = Result<Vec<(DeviceId, MsgId, Moved)>, StoreError>> + Send + 'static
    {
        self.call(move |cx| uplink::expire_due(cx.tx, now, SWEEP_LIMIT, EXPIRED_REASON))
    }

    /// Takes the replays `ferry dlq replay` asked for (at most 1,000 per
    /// call); resolves to the messages still `stored`.
    pub fn take_replays(
        &self,
    ) -> impl Future<Output = Result<Vec<PendingMessage>, StoreError>> + Send + 'static {
        self.call(|cx| uplink::take_replays(cx.tx, SWEEP_LIMIT))
    }
}

/// Downlinks, and the receipts north committed with their changes.
impl Store {
    /// Stores a downlink once and queues it for each addressed device.
    pub fn down_intake(
        &self,
        msg: DownIntake,
    ) -> impl Future<Output = Result<DownIntakeOutcome, StoreError>> + Send + 'static {
        let budget = self.budget.clone();
        self.call(move |cx| downlink::intake(cx.tx, &msg, &budget, cx.store_ms))
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
        self.call(move |cx| downlink::read_batch(cx.tx, &device, after, limit, now))
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
        self.call(move |cx| {
            let now = Now {
                wall_ms: now_ms,
                store_ms: cx.store_ms,
            };
            downlink::advance(cx.tx, &device, upto, read, now)
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
        self.call(move |cx| {
            let now = Now {
                wall_ms: now_ms,
                store_ms: cx.store_ms,
            };
            downlink::nack(cx.tx, &device, seq, &reason, now)
        })
    }

    /// The downlink cursors of `device`.
    pub fn cursors(
        &self,
        device: DeviceId,
    ) -> impl Future<Output = Result<Cursors, StoreError>> + Send + 'static {
        self.call(move |cx| downlink::cursors(cx.tx, &device))
    }

    /// Expires stored deliveries of messages whose ttl passed by `now`.
    pub fn sweep_downlinks(
        &self,
        now: Now,
    ) -> impl Future<Output = Result<Swept, StoreError>> + Send + 'static {
        self.call(move |cx| downlink::sweep_expired(cx.tx, now))
    }

    /// Dead-letters a downlink refused at intake against the backend's
    /// share and commits its `rejected` receipt (`receipt` with the reason
    /// naming the dead letter; `disk_budget` if none could be written).
    pub fn reject_downlink(
        &self,
        dl: DeadLetter,
        receipt: NorthReceipt,
    ) -> impl Future<Output = Result<Rejected, StoreError>> + Send + 'static {
        let kept = Kept::of(dl);
        let (shares, budget) = (*self.refusals.borrow(), self.budget.clone());
        self.call(move |cx| outbox::reject(cx.tx, &kept, &receipt, &shares, &budget, cx.store_ms))
    }

    /// Up to `limit` receipts of the outbox with `id >= from`, in id order.
    pub fn outbox_page(
        &self,
        from: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxReceipt>, StoreError>> + Send + 'static {
        self.call(move |cx| outbox::page(cx.tx, from, limit))
    }

    /// The upstream acknowledged these receipts: they leave the outbox
    /// (fire and forget: losing it in a crash only sends them again).
    pub fn receipts_sent(&self, ids: Vec<i64>) -> Result<(), StoreError> {
        self.tell(move |cx| {
            if let Err(e) = settle(outbox::delete(cx.tx, &ids))? {
                warn!(event = "receipts_not_deleted", error = %e, "acknowledged receipts not deleted; they will be sent again");
            }
            Ok(())
        })
    }

    /// Moves a receipt the upstream never takes from the outbox to the dead
    /// letters, in one transaction; resolves to the dead letter's id.
    pub fn receipt_dead(
        &self,
        id: i64,
        dl: DeadLetter,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'static {
        let kept = Kept::of(dl);
        self.call(move |cx| outbox::dead_letter(cx.tx, id, &kept, cx.store_ms))
    }
}

/// The writer's pulse, the store clock, pruning, and what warrants a
/// warning.
impl Store {
    /// Answers after the commit of the batch it lands in, with the backlog
    /// (the watchdog's liveness check and `STATUS=`): an answer proves the
    /// writer is turning.
    pub fn ping(&self) -> impl Future<Output = Result<Backlog, StoreError>> + Send + 'static {
        self.call(|cx| figures::backlog(cx.tx).map_err(StoreError::from))
    }

    /// Deletes one batch of what is past its retention (see [`prune`]).
    pub fn prune(
        &self,
        cutoffs: prune::Cutoffs,
    ) -> impl Future<Output = Result<prune::Pruned, StoreError>> + Send + 'static {
        self.call(move |cx| {
            let pruned = prune::prune(cx.tx, &cutoffs);
            if matches!(&pruned, Ok(p) if p.any()) {
                *cx.pruned = true;
            }
            pruned
        })
    }

    /// Records that every dead letter up to `id` had its alert
    /// acknowledged upstream (never moves back); fire and forget: lost in a
    /// crash, those alerts are only sent again.
    pub fn dead_alerted(&self, id: i64) -> Result<(), StoreError> {
        self.tell(move |cx| {
            if let Err(e) = settle(uplink::dead_alerted(cx.tx, id))? {
                debug!(error = %e, "alert mark not moved; those alerts go again after a restart");
            }
            Ok(())
        })
    }

    /// Dead letters with an id past `after_dead` (at most `limit`), the
    /// backlog and its oldest messages, and the disk budget.
    pub fn alert_scan(
        &self,
        after_dead: i64,
        limit: usize,
    ) -> impl Future<Output = Result<AlertScan, StoreError>> + Send + 'static {
        let budget = self.budget.clone();
        let over = budget.clone();
        let scan = self.call(move |cx| {
            let mut scan = uplink::alert_scan(cx.tx, cx.clock.now(), after_dead, limit)?;
            if over.over() {
                scan.holders = Some(figures::holders(cx.tx, HOLDERS_TOP)?);
            }
            Ok(scan)
        });
        async move {
            let mut scan = scan.await?;
            scan.over_budget = budget.over();
            scan.used_bytes = budget.used();
            scan.max_db_bytes = budget.limit();
            Ok(scan)
        }
    }

    /// Persists the clock every [`clock::MARK_EVERY`] until the store stops (the
    /// writer persists it once more when it closes).
    pub async fn keep_clock(self) {
        let mut every = tokio::time::interval(clock::MARK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let marked = self.tell(|cx| clock::save(cx.tx, &clock::mark(cx.clock, cx.boot_id)));
            if marked.is_err() {
                return;
            }
        }
    }
}
