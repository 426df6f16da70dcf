//! The uplink pipeline: device → store → backend, with receipts both ways.
//!
//! Two tasks, joined by one channel:
//! - the device door's intake ([`crate::south::door::intake`]) judges
//!   device publishes, sends them to the store and, in commit order,
//!   answers each device (`stored`, its current receipt for a duplicate,
//!   or `rejected`) before handing new messages to
//! - the engine ([`run_engine`]), which owns the [`scheduler::Scheduler`],
//!   publishes north, applies backend acks and timers, commits each final
//!   state, and only then tells the device (`delivered` / `failed`).
//!
//! Because the `stored` receipt is queued to the south sender before the
//! engine ever sees a message, and the `delivered`/`failed` receipts only
//! after the engine's commit, a device always sees receipts in state order.
//!
//! In a shutdown intake stops first and answers what it took; the engine,
//! once its input closes, publishes what it holds ready, applies the
//! backend acks that come and commits them, until nothing is in flight or
//! the flush deadline passes. It reads no more backlog: what is not
//! delivered stays stored for the next run.

pub mod backend;
pub mod batch;
mod done;
pub mod scheduler;
mod send;

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::clip;
use crate::dead_letter::Direction;
use crate::deadlines::sleep_until;
use crate::health::Probed;
use crate::ids::{DeviceId, MsgId};
use crate::metrics::{self, Stage};
use crate::north::{Link, NorthSender, UplinkEvent};
use crate::protocol::ack::{parse_acks, BackendAck};
use crate::protocol::now_ms;
use crate::protocol::receipt::Receipt;
use crate::protocol::topics::Topics;
use crate::shutdown::{Phase, Shutdown};
use crate::south::SouthSender;
use crate::state::MessageState;
use crate::status_file::LiveSender;
use crate::store::record::uplink::{
    AttemptRecord, Duplicate, Moved, PendingMessage, ToEngine, Transition,
};
use crate::store::{Store, StoreError};
use scheduler::{Action, Scheduler, SchedulerConfig};

/// What the engine waits on from the store.
enum Done {
    Moved {
        device: DeviceId,
        msg_id: MsgId,
        to: MessageState,
        reason: Option<String>,
        result: Result<Option<Moved>, StoreError>,
    },
    /// Acked messages moved to `delivered` in one request, each with its
    /// own answer (a refused one does not hold back the rest).
    Delivered {
        moved: Vec<(DeviceId, MsgId)>,
        result: Result<Vec<Result<Option<Moved>, StoreError>>, StoreError>,
    },
    Loaded {
        device: DeviceId,
        limit: usize,
        result: Result<Vec<PendingMessage>, StoreError>,
    },
    Expired(Result<Vec<(DeviceId, MsgId, Moved)>, StoreError>),
    /// Messages `ferry dlq replay` set back to `stored`.
    Replayed(Result<Vec<PendingMessage>, StoreError>),
    /// A duplicate's current state, read after every earlier commit.
    LookedUp {
        device: DeviceId,
        result: Result<Option<Duplicate>, StoreError>,
    },
}

/// How often stored messages whose ttl passed are swept, wherever they are
/// in a backlog (the ones in memory expire on their own timers).
const EXPIRY_SWEEP: std::time::Duration = std::time::Duration::from_secs(5);
/// How often the engine takes the replays `ferry dlq replay` asked for:
/// the longest a replay waits before it is sent (with the link up).
pub const REPLAY_POLL: std::time::Duration = std::time::Duration::from_secs(1);
/// Backend acks applied per turn of the loop: a huge ack array is worked
/// off in pieces, with everything else getting its turn in between.
const ACK_CHUNK: usize = 1024;
/// Store requests in flight, at most: past it queued acks wait (the store's
/// queue is unbounded; this is what bounds the engine's share).
const MAX_PENDING: usize = 16_384;

type DoneFuture = Pin<Box<dyn Future<Output = Done> + Send>>;

/// Everything the engine talks to.
pub struct Engine {
    pub scheduler: Scheduler,
    pub store: Store,
    pub north: NorthSender,
    pub south: SouthSender,
    pub topics: Topics,
    /// The north connection publishes are made for, while there is one.
    pub link: Link,
    /// Parsed backend acks not yet applied.
    pub acks: std::collections::VecDeque<BackendAck>,
    /// Where whether the backend is there is reported.
    pub backend: backend::BackendReport,
    /// The north batch being gathered (`north.batch_max` > 1).
    pub batcher: batch::Batcher,
    /// `north.ack_timeout_ms`, `north.max_inflight` and the retry backoff
    /// again when they change while running (`None`: they do not).
    pub settings: Option<tokio::sync::watch::Receiver<SchedulerConfig>>,
}

impl Engine {
    /// The engine, and the watch on whether the backend is silent (since
    /// when) that its backend report keeps.
    pub fn new(
        cfg: SchedulerConfig,
        batch: batch::BatchConfig,
        store: Store,
        north: NorthSender,
        south: SouthSender,
        topics: Topics,
        status: LiveSender,
    ) -> (Engine, backend::Silence) {
        let (backend, silence) = backend::BackendReport::new(status);
        let engine = Engine {
            scheduler: Scheduler::new(cfg),
            store,
            north,
            south,
            topics,
            link: Link::Down,
            acks: Default::default(),
            backend,
            batcher: batch::Batcher::new(batch),
            settings: None,
        };
        (engine, silence)
    }
}

/// Runs until the store stops, or the intake side closes: then, in a
/// shutdown, it first flushes what is due north (see `Engine::flushed`).
pub async fn run_engine(
    mut engine: Engine,
    mut stored: mpsc::Receiver<ToEngine>,
    mut north_events: mpsc::Receiver<UplinkEvent>,
    shutdown: Shutdown,
    mut probed: Probed,
) -> Result<(), StoreError> {
    for device in engine.store.pending_devices().await? {
        engine.scheduler.on_backlog(device);
    }
    let mut pending: FuturesUnordered<DoneFuture> = FuturesUnordered::new();
    let mut sweep = tokio::time::interval(EXPIRY_SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut replays = tokio::time::interval(REPLAY_POLL);
    replays.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Flushing once intake is gone in a shutdown.
    let mut phase = Phase::Running;
    loop {
        let deadline = engine.scheduler.next_deadline();
        let sleep = sleep_until(deadline);
        let flush_over = sleep_until(phase.until());
        let actions = tokio::select! {
            msg = stored.recv(), if phase.is_running() => match msg {
                Some(msg) => {
                    engine.on_intake(msg, &mut pending).await;
                    // Take whatever else is queued before polling: one pass
                    // over the dirty devices per burst, not per message.
                    while let Ok(msg) = stored.try_recv() {
                        engine.on_intake(msg, &mut pending).await;
                    }
                    Vec::new()
                }
                None => match shutdown.flush_by() {
                    Some(at) => {
                        info!(event = "uplink_flush_started", in_flight = engine.scheduler.in_flight(), in_memory = engine.scheduler.in_memory(), "uplink engine flushing north");
                        phase = Phase::Flushing { until: at };
                        Vec::new()
                    }
                    None => return Ok(()),
                },
            },
            cfg = crate::live::next(&mut engine.settings) => {
                engine.scheduler.set_config(cfg);
                Vec::new()
            }
            ev = north_events.recv() => match ev {
                Some(UplinkEvent::Link(Link::Up(epoch))) => {
                    info!(event = "north_link_up", epoch, in_memory = engine.scheduler.in_memory(), "north link up: sending");
                    engine.link = Link::Up(epoch);
                    engine.batcher.drop_open();
                    engine.scheduler.on_link_up(epoch);
                    Vec::new()
                }
                Some(UplinkEvent::Link(Link::Down)) => {
                    warn!(event = "north_link_down", "north link down: holding messages until it returns");
                    engine.link = Link::Down;
                    engine.batcher.drop_open();
                    engine.scheduler.on_link_down();
                    Vec::new()
                }
                Some(UplinkEvent::Ack(payload)) => {
                    let now = Instant::now();
                    engine.scheduler.on_backend_heard(now);
                    engine.backend.heard(now);
                    engine.parse_acks(&payload);
                    Vec::new()
                }
                Some(UplinkEvent::Refused { device, seq }) => {
                    engine.scheduler.on_refused(&device, seq, Instant::now())
                }
                Some(UplinkEvent::RefusedBatch(batch)) => engine.batch_refused(batch),
                Some(UplinkEvent::SparkplugHold(held)) => engine.scheduler.hold_sparkplug(held),
                None => return Ok(()),
            },
            _ = std::future::ready(()), if !engine.acks.is_empty() && pending.len() < MAX_PENDING => engine.apply_acks(),
            Some(done) = pending.next(), if !pending.is_empty() => {
                engine.on_done(done).await?;
                Vec::new()
            }
            _ = sleep => engine.scheduler.on_tick(Instant::now()),
            _ = sleep_until(engine.batcher.due()) => Vec::new(),
            // The watchdog's ping: answered from the loop, so an answer
            // proves the loop turns.
            ack = probed.recv() => {
                let _ = ack.send(());
                Vec::new()
            }
            _ = sweep.tick(), if phase.is_running() => {
                let expired = engine.store.expire_due(engine.store.now());
                pending.push(Box::pin(async move { Done::Expired(expired.await) }));
                Vec::new()
            }
            _ = replays.tick(), if phase.is_running() => {
                let taken = engine.store.take_replays();
                pending.push(Box::pin(async move { Done::Replayed(taken.await) }));
                Vec::new()
            }
            _ = flush_over => {
                info!(event = "uplink_flush_timed_out", in_flight = engine.scheduler.in_flight(), "uplink flush time is up; what is in flight stays stored and is sent after the restart");
                return Ok(());
            }
        };
        let mut actions = actions;
        actions.extend(engine.scheduler.poll(Instant::now()));
        // The acks of one turn go to the store as one request.
        let mut delivers = Vec::new();
        for action in actions {
            if !phase.is_running() && matches!(action, Action::Refill { .. }) {
                // The backlog stays in the store for the next run.
                continue;
            }
            if let Action::Deliver {
                device,
                msg_id,
                attempts,
                sent,
            } = action
            {
                backend_acked(sent);
                delivers.push((device, msg_id, attempts));
                continue;
            }
            if let Some(fut) = engine.execute(action).await? {
                pending.push(fut);
            }
        }
        if !delivers.is_empty() {
            pending.push(engine.deliver(delivers));
        }
        // A batch goes out at its linger; in a shutdown, at once.
        engine.flush_batch(!phase.is_running());
        let now = Instant::now();
        engine
            .backend
            .follow(engine.scheduler.backend_silent_since(), now);
        engine.backend.behind(engine.scheduler.take_behind(), now);
        if !phase.is_running() && engine.flushed(&pending) {
            info!(event = "uplink_flushed", "uplink engine flushed");
            return Ok(());
        }
    }
}

/// The backend's ack of a message sent at `sent` (if it was timed) is
/// applied now.
fn backend_acked(sent: Option<Instant>) {
    if let Some(sent) = sent {
        metrics::stage_took(Stage::BackendAck, sent.elapsed());
    }
}

impl Engine {
    /// A message intake stored, or a duplicate for the engine to answer.
    async fn on_intake(&mut self, msg: ToEngine, pending: &mut FuturesUnordered<DoneFuture>) {
        match msg {
            ToEngine::Stored { msg, committed } => {
                let clock = self.store.clock();
                let committed = Some(Instant::from_std(committed));
                self.scheduler
                    .on_stored(msg, committed, Instant::now(), clock.store_ms())
            }
            // Not acked yet: its final receipt comes later, from here.
            ToEngine::Duplicate {
                device,
                msg_id,
                seq,
            } if self.scheduler.holds(&device, seq) => {
                self.send_receipt(&device, Receipt::stored(&msg_id, seq))
                    .await
            }
            // Acked (its final receipt may be out), or not read back yet:
            // its state as of now, read after the commit of that receipt.
            ToEngine::Duplicate { device, msg_id, .. } => {
                let looked = self.store.lookup(device.clone(), msg_id);
                pending.push(Box::pin(async move {
                    Done::LookedUp {
                        device,
                        result: looked.await,
                    }
                }));
            }
        }
    }

    /// Nothing left to wait for in a shutdown: no message in flight north,
    /// no backend ack unapplied, no commit (and its receipt) outstanding.
    /// Messages only in the store, or backing off, wait for the next run.
    fn flushed(&self, pending: &FuturesUnordered<DoneFuture>) -> bool {
        self.scheduler.in_flight() == 0 && self.acks.is_empty() && pending.is_empty()
    }

    async fn send_receipt(&self, device: &DeviceId, receipt: Receipt) {
        let body = Bytes::from(receipt.to_bytes());
        self.south
            .publish(device, self.topics.device_ack(device), body)
            .await;
    }

    /// Queues the acks of one message; malformed elements are logged.
    fn parse_acks(&mut self, payload: &Bytes) {
        let mut malformed = 0usize;
        let mut first_error = None;
        for ack in parse_acks(payload) {
            match ack {
                Ok(ack) => self.acks.push_back(ack),
                Err(e) => {
                    malformed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(error) = first_error {
            warn!(event = "backend_acks_malformed", error = %clip::display(&error), malformed, "ignoring malformed backend acks");
        }
    }

    /// Applies the next [`ACK_CHUNK`] queued acks.
    fn apply_acks(&mut self) -> Vec<Action> {
        let now = Instant::now();
        let mut actions = Vec::new();
        let n = self.acks.len().min(ACK_CHUNK);
        for ack in self.acks.drain(..n) {
            actions.extend(
                self.scheduler
                    .on_ack(&ack.device, &ack.msg_id, ack.verdict, now),
            );
        }
        actions
    }

    /// Carries out one action; returns what to wait for, if anything.
    async fn execute(&mut self, action: Action) -> Result<Option<DoneFuture>, StoreError> {
        match action {
            Action::Publish { msg, committed } => {
                self.publish(msg, committed);
                Ok(None)
            }
            Action::Deliver {
                device,
                msg_id,
                attempts,
                sent,
            } => {
                backend_acked(sent);
                Ok(Some(self.deliver(vec![(device, msg_id, attempts)])))
            }
            Action::Kill {
                device,
                msg_id,
                attempts,
                reason,
            } => self
                .transition(device, msg_id, MessageState::Dead, attempts, Some(reason))
                .await
                .map(Some),
            Action::RecordAttempt {
                id,
                attempts,
                retry_in,
                error,
            } => {
                debug!(uplink_id = id, attempts, retry_in_ms = retry_in.as_millis() as u64, error = %clip::display(&error), "uplink attempt failed");
                metrics::retried(Direction::Up, 1);
                let rec = AttemptRecord {
                    id,
                    attempts,
                    next_attempt_ms: now_ms() + retry_in.as_millis() as i64,
                    error,
                    at_ms: now_ms(),
                };
                self.store.record_attempt(rec)?;
                Ok(None)
            }
            Action::Refill {
                device,
                after,
                limit,
            } => {
                let read = self.store.refill(device.clone(), after, limit);
                Ok(Some(Box::pin(async move {
                    let result = read.await;
                    Done::Loaded {
                        device,
                        limit,
                        result,
                    }
                })))
            }
        }
    }

    /// Moves acked messages to `delivered`, in one store request.
    fn deliver(&mut self, acked: Vec<(DeviceId, MsgId, u32)>) -> DoneFuture {
        let at_ms = now_ms();
        let mut moved = Vec::with_capacity(acked.len());
        let ts = acked
            .into_iter()
            .map(|(device, msg_id, attempts)| {
                moved.push((device.clone(), msg_id.clone()));
                Transition {
                    device,
                    msg_id,
                    to: MessageState::Delivered,
                    attempts,
                    reason: None,
                    at_ms,
                }
            })
            .collect();
        let result = self.store.transitions(ts);
        Box::pin(async move {
            Done::Delivered {
                moved,
                result: result.await,
            }
        })
    }

    async fn transition(
        &mut self,
        device: DeviceId,
        msg_id: MsgId,
        to: MessageState,
        attempts: u32,
        reason: Option<String>,
    ) -> Result<DoneFuture, StoreError> {
        let t = Transition {
            device: device.clone(),
            msg_id: msg_id.clone(),
            to,
            attempts,
            reason: reason.clone(),
            at_ms: now_ms(),
        };
        let moved = self.store.transition(t);
        Ok(Box::pin(async move {
            let result = moved.await;
            Done::Moved {
                device,
                msg_id,
                to,
                reason,
                result,
            }
        }))
    }
}
