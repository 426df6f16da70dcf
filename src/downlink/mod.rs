//! The downlink pipeline: backend → store → device inbox, with confirms,
//! cursors and receipts north.
//!
//! One task owns the [`scheduler::DownScheduler`] and everything that
//! feeds it: downlink envelopes from the north session, device control
//! messages (`confirm`, `pull`, `read`, `nack`, `status`) from the south
//! intake, broker presence events, and timers. Every state change is
//! committed before anyone hears of it:
//! - a downlink is PUBACKed upstream and answered `stored` only after its
//!   commit (and the north session sends PUBACKs in receive order);
//! - a confirm's `delivered` receipts go north after the cursor commit;
//! - an inbox batch is built from committed rows only.
//!
//! Many devices' confirms land in the store's queue together and are
//! group-committed: a reconnect storm costs a few fsyncs, not thousands.

mod receipts;
pub mod record;
pub mod scheduler;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::config::DownlinkConfig;
use crate::dead_letter::DeadLetter;
use crate::ids::{DeviceId, MsgId};
use crate::north::{AckToken, NorthEvent, NorthSender, Tag};
use crate::protocol::control::{inbox_batch, parse_control, Control, ControlKind};
use crate::protocol::envelope::{parse_downlink, sniff_msg_id, RejectCode, Rejection};
use crate::protocol::now_ms;
use crate::protocol::receipt::NorthReceipt;
use crate::protocol::topics::Topics;
use crate::south::presence::BrokerEvent;
use crate::south::SouthSender;
use crate::store::{Store, StoreError};
use receipts::Receipts;
use record::{
    reason, BatchRead, CursorMove, Cursors, DeliveryEvent, DownIntake, DownIntakeOutcome,
};
use scheduler::{DownAction, DownConfig, DownScheduler, Verdict};

/// A device the broker saw connect is taken as online after this, unless it
/// says so itself first (it may not have subscribed to its inbox yet).
const CONNECT_GRACE: Duration = Duration::from_millis(500);
/// How often deliveries of expired messages are swept for offline devices.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// Receipts held until the upstream acknowledges them; past it the oldest
/// go (they are in memory only).
const RECEIPTS_HELD: usize = 1_000_000;
/// A receipts message the session could not take is tried again after this.
const RECEIPTS_RETRY: Duration = Duration::from_millis(50);

/// Store requests in flight, at most: past it the task stops reading the
/// north session and device controls until answers come back (the store's
/// queue is unbounded; this is what holds the senders back).
const MAX_PENDING: usize = 4096;

/// A control message from a device.
#[derive(Debug, Clone)]
pub struct DeviceControl {
    pub device: DeviceId,
    pub kind: ControlKind,
    pub payload: Bytes,
}

pub struct DownlinkSettings {
    pub cfg: DownlinkConfig,
    pub groups: BTreeMap<String, Vec<DeviceId>>,
    pub max_payload_bytes: usize,
    /// Times a lone receipt may be refused by the upstream before it is
    /// dead-lettered (`retry.max_attempts`).
    pub max_attempts: u32,
}

enum Done {
    Intake {
        token: AckToken,
        result: Result<DownIntakeOutcome, StoreError>,
    },
    Rejected {
        token: AckToken,
        msg_id: Option<MsgId>,
        device: Option<String>,
        reason: String,
        result: Result<i64, StoreError>,
    },
    Cursors {
        device: DeviceId,
        result: Result<Cursors, StoreError>,
    },
    Read {
        device: DeviceId,
        gen: u64,
        reply_empty: bool,
        result: Result<BatchRead, StoreError>,
    },
    Moved {
        device: DeviceId,
        result: Result<CursorMove, StoreError>,
    },
    Swept(Result<Vec<DeliveryEvent>, StoreError>),
}

type DoneFuture = Pin<Box<dyn Future<Output = Done> + Send>>;

pub struct Downlink {
    settings: DownlinkSettings,
    scheduler: DownScheduler,
    store: Store,
    north: NorthSender,
    south: SouthSender,
    topics: Topics,
    pending: FuturesUnordered<DoneFuture>,
    /// Receipts north until the upstream acknowledges them.
    receipts: Receipts,
    /// The north connection receipts are sent on, while there is one.
    epoch: Option<u64>,
    /// When to try sending receipts again after the session was full.
    receipts_retry: Option<Instant>,
    /// Devices the broker saw connect, by when they count as online.
    grace: BTreeSet<(Instant, DeviceId)>,
    /// The live grace deadline per device; older entries in `grace` are void.
    grace_at: HashMap<DeviceId, Instant>,
}

/// Inputs of the downlink task.
pub struct DownlinkInputs {
    pub north: mpsc::Receiver<NorthEvent>,
    pub controls: mpsc::Receiver<DeviceControl>,
    pub broker: Option<mpsc::UnboundedReceiver<BrokerEvent>>,
}

impl Downlink {
    pub fn new(
        settings: DownlinkSettings,
        store: Store,
        north: NorthSender,
        south: SouthSender,
        topics: Topics,
    ) -> Downlink {
        let scheduler = DownScheduler::new(DownConfig {
            batch_size: settings.cfg.batch_size,
            confirm_timeout: settings.cfg.confirm_timeout,
        });
        Downlink {
            settings,
            scheduler,
            store,
            north,
            south,
            topics,
            pending: FuturesUnordered::new(),
            receipts: Receipts::new(RECEIPTS_HELD),
            epoch: None,
            receipts_retry: None,
            grace: BTreeSet::new(),
            grace_at: HashMap::new(),
        }
    }

    /// Runs until its inputs close or the store stops.
    pub async fn run(mut self, mut inputs: DownlinkInputs) -> Result<(), StoreError> {
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut broker = inputs.broker.take();
        loop {
            let deadline = [
                self.scheduler.next_deadline(),
                self.grace.first().map(|(at, _)| *at),
                self.receipts_retry,
            ]
            .into_iter()
            .flatten()
            .min();
            let timer = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let broker_event = async {
                match &mut broker {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            let room = self.pending.len() < MAX_PENDING;
            tokio::select! {
                ev = inputs.north.recv(), if room => match ev {
                    Some(NorthEvent::Up(epoch)) => {
                        self.epoch = Some(epoch);
                        self.flush_receipts();
                    }
                    Some(NorthEvent::Down) => {
                        self.epoch = None;
                        self.receipts.link_down();
                    }
                    Some(NorthEvent::Downlink { topic, payload, token, oversize }) => self.on_downlink(&topic, payload, token, oversize).await?,
                    Some(NorthEvent::Published(Tag::Receipts(id))) => {
                        self.receipts.published(id);
                        self.flush_receipts();
                    }
                    Some(NorthEvent::Refused(Tag::Receipts(id))) => self.on_receipts_refused(id).await?,
                    Some(_) => {}
                    None => return Ok(()),
                },
                c = inputs.controls.recv(), if room => match c {
                    Some(c) => self.on_control(c).await?,
                    None => return Ok(()),
                },
                Some(ev) = broker_event => self.on_broker(ev).await?,
                Some(done) = self.pending.next(), if !self.pending.is_empty() => self.on_done(done).await?,
                _ = timer => self.on_timer().await?,
                _ = sweep.tick() => {
                    let swept = self.store.sweep_downlinks(now_ms());
                    self.pending.push(Box::pin(async move { Done::Swept(swept.await) }));
                }
            }
        }
    }

    async fn on_downlink(
        &mut self,
        topic: &str,
        payload: Bytes,
        token: AckToken,
        oversize: Option<usize>,
    ) -> Result<(), StoreError> {
        let stored_ms = now_ms();
        let parsed = match oversize {
            // Only its head was kept: too large, by name if it can be read.
            Some(size) => Err(Rejection {
                code: RejectCode::TooLarge,
                detail: format!("{size} bytes > north.max_packet_bytes"),
                msg_id: sniff_msg_id(&payload),
            }),
            None => parse_downlink(&payload, self.settings.max_payload_bytes, stored_ms),
        }
        .and_then(|env| {
            let to = match self.topics.parse_north_down(topic) {
                Some(Some(device)) => vec![device.to_string()],
                _ => env.to.clone(),
            };
            let to = self.resolve(&to).map_err(|detail| Rejection {
                code: RejectCode::Malformed,
                detail,
                msg_id: Some(env.msg_id.clone()),
            })?;
            Ok((env, to))
        });
        match parsed {
            Ok((env, to)) => {
                let msg = DownIntake {
                    msg_id: env.msg_id,
                    body: Bytes::from(env.entry),
                    stored_ms,
                    expires_ms: env
                        .ttl
                        .map(|t| stored_ms.saturating_add(t.as_millis() as i64)),
                    to,
                    queue_cap: self.settings.cfg.queue_cap,
                };
                let stored = self.store.down_intake(msg);
                self.pending.push(Box::pin(async move {
                    Done::Intake {
                        token,
                        result: stored.await,
                    }
                }));
            }
            Err(rejection) => {
                let reason = rejection.reason();
                warn!(topic, reason = %reason, "downlink rejected");
                let dl = DeadLetter {
                    direction: "down",
                    device: self
                        .topics
                        .parse_north_down(topic)
                        .flatten()
                        .map(str::to_string),
                    msg_id: rejection.msg_id.as_ref().map(MsgId::to_string),
                    topic: topic.to_string(),
                    reason: reason.clone(),
                    raw: payload,
                    at_ms: stored_ms,
                };
                let device = dl.device.clone();
                let dead_letter = self.store.reject(dl);
                let msg_id = rejection.msg_id;
                self.pending.push(Box::pin(async move {
                    Done::Rejected {
                        token,
                        msg_id,
                        device,
                        reason,
                        result: dead_letter.await,
                    }
                }));
            }
        }
        Ok(())
    }

    /// Device ids and `@group`s → distinct devices, in first-named order.
    fn resolve(&self, to: &[String]) -> Result<Vec<DeviceId>, String> {
        let mut out: Vec<DeviceId> = Vec::new();
        for name in to {
            let members = match name.strip_prefix('@') {
                Some(group) => self
                    .settings
                    .groups
                    .get(group)
                    .cloned()
                    .ok_or_else(|| format!("unknown group {name:?}"))?,
                None => vec![DeviceId::new(name.as_str())
                    .map_err(|e| format!("bad device id {name:?}: {e}"))?],
            };
            for m in members {
                if !out.contains(&m) {
                    out.push(m);
                }
            }
        }
        if out.is_empty() {
            return Err("no recipient".into());
        }
        Ok(out)
    }

    async fn on_control(&mut self, c: DeviceControl) -> Result<(), StoreError> {
        let control = match parse_control(c.kind, &c.payload) {
            Ok(control) => control,
            Err(e) => {
                warn!(device = %c.device, error = %e, "ignoring a malformed control message");
                return Ok(());
            }
        };
        let device = c.device;
        let now = now_ms();
        let actions = match control {
            Control::Status { online: true } => self.scheduler.on_online(&device),
            Control::Status { online: false } => {
                self.scheduler.on_offline(&device);
                Vec::new()
            }
            Control::Pull { after, limit } => {
                self.scheduler
                    .on_pull(&device, after, limit, Instant::now())
            }
            Control::Confirm { upto } => {
                let moved = self.store.advance(device.clone(), upto, false, now);
                self.commit_move(&device, moved);
                // A confirm also says the device is there.
                self.scheduler.on_online(&device)
            }
            Control::Read { upto } => {
                let moved = self.store.advance(device.clone(), upto, true, now);
                self.commit_move(&device, moved);
                Vec::new()
            }
            Control::Nack { seq, reason: why } => {
                let moved = self
                    .store
                    .nack(device.clone(), seq, reason::nacked(&why), now);
                self.commit_move(&device, moved);
                Vec::new()
            }
        };
        self.execute(actions).await
    }

    /// Waits for a cursor-moving request; its outcome arrives as `Done::Moved`.
    fn commit_move(
        &mut self,
        device: &DeviceId,
        moved: impl Future<Output = Result<CursorMove, StoreError>> + Send + 'static,
    ) {
        let device = device.clone();
        self.pending.push(Box::pin(async move {
            Done::Moved {
                device,
                result: moved.await,
            }
        }));
    }

    async fn on_broker(&mut self, ev: BrokerEvent) -> Result<(), StoreError> {
        match ev {
            BrokerEvent::Connected(client) => {
                if let Ok(device) = DeviceId::new(client) {
                    // One grace timer per device, for its latest connection.
                    let at = Instant::now() + CONNECT_GRACE;
                    self.grace_at.insert(device.clone(), at);
                    self.grace.insert((at, device));
                }
            }
            BrokerEvent::Disconnected(client) => {
                if let Ok(device) = DeviceId::new(client) {
                    self.grace_at.remove(&device);
                    self.scheduler.on_offline(&device);
                }
            }
            BrokerEvent::Subscribed { client_id, filter } => {
                if let Ok(device) = DeviceId::new(client_id) {
                    if filter == self.topics.device_inbox(&device) {
                        self.grace_at.remove(&device);
                        let actions = self.scheduler.on_subscribed(&device, Instant::now());
                        self.execute(actions).await?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn on_timer(&mut self) -> Result<(), StoreError> {
        let now = Instant::now();
        if self.receipts_retry.is_some_and(|at| at <= now) {
            self.flush_receipts();
        }
        while let Some((at, device)) = self.grace.first().cloned() {
            if at > now {
                break;
            }
            self.grace.pop_first();
            if self.grace_at.get(&device) == Some(&at) {
                self.grace_at.remove(&device);
                let actions = self.scheduler.on_online(&device);
                self.execute(actions).await?;
            }
        }
        for (device, o, actions) in self.scheduler.on_tick(now) {
            warn!(device = %device, first_seq = o.first.0, last_seq = o.last.0, size = o.size, resends = o.resends + 1, "downlink batch not confirmed in time; resending");
            self.execute(actions).await?;
        }
        Ok(())
    }

    async fn execute(&mut self, actions: Vec<DownAction>) -> Result<(), StoreError> {
        for action in actions {
            match action {
                DownAction::LoadCursors(device) => {
                    let cursors = self.store.cursors(device.clone());
                    self.pending.push(Box::pin(async move {
                        Done::Cursors {
                            device,
                            result: cursors.await,
                        }
                    }));
                }
                DownAction::Read {
                    device,
                    after,
                    limit,
                    gen,
                    reply_empty,
                } => {
                    let read = self
                        .store
                        .read_batch(device.clone(), after, limit, now_ms());
                    self.pending.push(Box::pin(async move {
                        Done::Read {
                            device,
                            gen,
                            reply_empty,
                            result: read.await,
                        }
                    }));
                }
            }
        }
        Ok(())
    }

    /// Applies a store answer; an error only once the store is gone.
    async fn on_done(&mut self, done: Done) -> Result<(), StoreError> {
        let done = match done {
            Done::Intake { result: Err(e), .. }
            | Done::Rejected { result: Err(e), .. }
            | Done::Cursors { result: Err(e), .. }
            | Done::Read { result: Err(e), .. }
            | Done::Moved { result: Err(e), .. }
            | Done::Swept(Err(e))
                if e.is_fatal() =>
            {
                return Err(e)
            }
            done => done,
        };
        match done {
            Done::Intake {
                token,
                result: Ok(out),
            } => {
                self.north.ack(token);
                let ts = now_ms();
                let mut actions = Vec::new();
                for (event, new) in &out.queued {
                    if *new {
                        actions.extend(self.scheduler.on_queued(&event.device, event.seq));
                    }
                }
                let queued = out.queued.iter().map(|(e, _)| e);
                self.send_receipts(queued.chain(&out.expired).map(|e| NorthReceipt::of(e, ts)));
                self.execute(actions).await?;
            }
            Done::Intake { result: Err(e), .. } => {
                warn!(error = %e, "downlink not stored; left unacknowledged for the backend to resend");
            }
            Done::Rejected {
                token,
                msg_id,
                device,
                reason,
                result,
            } => {
                self.north.ack(token);
                let dead_letter = result.ok();
                self.send_receipts([NorthReceipt {
                    msg_id: msg_id.map(|m| m.to_string()),
                    device,
                    status: "rejected",
                    seq: None,
                    ts: now_ms(),
                    reason: Some(match dead_letter {
                        Some(id) => reason::rejected(&reason, id),
                        None => reason,
                    }),
                }]);
            }
            Done::Cursors {
                device,
                result: Ok(c),
            } => {
                let actions = self.scheduler.on_cursors(&device, c);
                self.execute(actions).await?;
            }
            Done::Read {
                device,
                gen,
                reply_empty,
                result: Ok(read),
            } => {
                let ts = now_ms();
                self.send_receipts(read.expired.iter().map(|e| NorthReceipt::of(e, ts)));
                let span = match (read.entries.first(), read.entries.last()) {
                    (Some(f), Some(l)) => Some((f.seq, l.seq, read.entries.len())),
                    _ => None,
                };
                if let Verdict::Send { more } = self.scheduler.on_read(
                    &device,
                    gen,
                    span,
                    read.head,
                    reply_empty,
                    Instant::now(),
                ) {
                    let body = inbox_batch(&read.entries, more);
                    if let Some((first, last, size)) = span {
                        info!(device = %device, first_seq = first.0, last_seq = last.0, size, bytes = body.len(), more, "downlink batch sent");
                    }
                    self.south
                        .publish(&device, self.topics.device_inbox(&device), body)
                        .await;
                }
            }
            Done::Moved {
                device,
                result: Ok(moved),
            } => {
                let ts = now_ms();
                self.send_receipts(moved.events.iter().map(|e| NorthReceipt::of(e, ts)));
                let (released, actions) = self.scheduler.on_cursor_moved(&device, moved.cursors);
                if let Some(o) = released {
                    info!(
                        device = %device,
                        first_seq = o.first.0,
                        last_seq = o.last.0,
                        size = o.size,
                        cursor = moved.cursors.delivered_upto.0,
                        resends = o.resends,
                        confirm_ms = o.sent_at.elapsed().as_millis() as u64,
                        "downlink batch confirmed"
                    );
                }
                self.execute(actions).await?;
            }
            Done::Swept(Ok(events)) => {
                if !events.is_empty() {
                    info!(count = events.len(), "downlink deliveries expired (ttl)");
                }
                let ts = now_ms();
                self.send_receipts(events.iter().map(|e| NorthReceipt::of(e, ts)));
            }
            Done::Cursors {
                device,
                result: Err(e),
            }
            | Done::Read {
                device,
                result: Err(e),
                ..
            }
            | Done::Moved {
                device,
                result: Err(e),
            } => {
                warn!(device = %device, error = %e, "downlink store request failed; the device is treated as offline until it returns");
                self.scheduler.on_offline(&device);
            }
            Done::Swept(Err(e)) => warn!(error = %e, "downlink expiry sweep failed"),
        }
        Ok(())
    }

    /// Queues receipts north and sends what the link can take.
    fn send_receipts(&mut self, receipts: impl IntoIterator<Item = NorthReceipt>) {
        let dropped = self.receipts.extend(receipts);
        if dropped > 0 {
            warn!(
                dropped,
                total_dropped = self.receipts.dropped,
                held = self.receipts.held(),
                "receipts north held past their cap; the oldest were dropped"
            );
        }
        self.flush_receipts();
    }

    /// Hands receipts to the north session while the link is up.
    fn flush_receipts(&mut self) {
        self.receipts_retry = None;
        let Some(epoch) = self.epoch else { return };
        let topic = self.topics.north_receipts();
        while let Some((id, body)) = self.receipts.next_message() {
            if !self
                .north
                .publish(topic.clone(), body, Tag::Receipts(id), epoch)
            {
                // The session's queue is full; try again shortly.
                self.receipts.unsend(id);
                self.receipts_retry = Some(Instant::now() + RECEIPTS_RETRY);
                return;
            }
        }
    }

    /// The upstream dropped the link on a receipts message.
    async fn on_receipts_refused(&mut self, id: u64) -> Result<(), StoreError> {
        let Some(r) = self.receipts.refused(id, self.settings.max_attempts) else {
            return Ok(());
        };
        let raw = Bytes::from(serde_json::to_vec(&r).expect("a receipt serializes"));
        let reason = reason::receipt_undeliverable(self.settings.max_attempts);
        error!(msg_id = ?r.msg_id, device = ?r.device, status = r.status, reason = %reason, "receipt north dead-lettered");
        let dl = DeadLetter {
            direction: "down",
            device: r.device,
            msg_id: r.msg_id,
            topic: self.topics.north_receipts(),
            reason,
            raw,
            at_ms: now_ms(),
        };
        // Fire and forget: the row commits with the next batch.
        drop(self.store.reject(dl));
        Ok(())
    }
}
