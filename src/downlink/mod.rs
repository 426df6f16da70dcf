//! The downlink pipeline: backend → store → device inbox, with confirms,
//! cursors and receipts north.
//!
//! One task owns the [`scheduler::DownScheduler`] and everything that
//! feeds it: downlink envelopes from the north session, device control
//! messages (`confirm`, `pull`, `read`, `nack`, `status`) from the south
//! intake, presence from the south broker, and timers. Every state change is
//! committed before anyone hears of it:
//! - a downlink is PUBACKed upstream and answered `stored` only after its
//!   commit (and the north session sends PUBACKs in receive order);
//! - a confirm's `delivered` receipts go north after the cursor commit;
//! - an inbox batch is built from committed rows only;
//! - a receipt north is committed in the outbox in the same transaction as
//!   the change it reports, and deleted only once the upstream PUBACKs the
//!   message carrying it: a crash or an outage of any length loses none.
//!
//! Many devices' confirms land in the store's queue together and are
//! group-committed: a reconnect storm costs a few fsyncs, not thousands.
//!
//! This file is the task loop; each input has its own file: `intake.rs`
//! (north downlinks and groups), `controls.rs` (device controls),
//! `presence.rs` (what the south broker says), `receipts_north.rs` (receipts north, around the
//! pure `receipts.rs`), and [`scheduler`] decides which batch goes when.

mod controls;
mod intake;
mod plain;
mod presence;
mod receipts;
mod receipts_north;
pub mod scheduler;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::config::DownlinkConfig;
use crate::dead_letter::Direction;
use crate::deadlines::{sleep_until, Deadlines};
use crate::ids::{DeviceId, Seq};
use crate::metrics;
use crate::north::{AckToken, DownlinkEvent, Link, NorthSender};
use crate::protocol::control::inbox_batch;
use crate::protocol::topics::Topics;
use crate::shutdown::{Phase, Shutdown};
use crate::south::presence::Presence;
use crate::south::{DeviceControl, SouthSender};
use crate::state::DeliveryState;
use crate::store::record::downlink::{
    BatchEntry, BatchRead, CursorMove, Cursors, DeliveryEvent, DownIntakeOutcome, OutboxReceipt,
    Rejected, Swept,
};
use crate::store::{Store, StoreError};
use receipts::Receipts;

/// Receipts held in memory at most; the rest wait in the outbox table.
const RECEIPTS_HELD: usize = 20_000;
use scheduler::{DownAction, DownConfig, DownScheduler, Verdict};

/// How often deliveries of expired messages are swept for offline devices.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Store requests in flight, at most: past it the task stops reading the
/// north session and device controls until answers come back (the store's
/// queue is unbounded; this is what holds the senders back).
const MAX_PENDING: usize = 4096;

pub struct DownlinkSettings {
    pub cfg: DownlinkConfig,
    pub groups: BTreeMap<String, Vec<DeviceId>>,
    pub max_payload_bytes: usize,
    /// Times a lone receipt may be refused by the upstream before it is
    /// dead-lettered (`retry.max_attempts`).
    pub max_attempts: u32,
    /// `south.plain_down`: where plain devices take their downlinks.
    pub plain_down: Option<crate::protocol::plain_down::PlainDown>,
}

impl DownlinkSettings {
    /// `downlink`, `groups`, `south.max_payload_bytes` and
    /// `retry.max_attempts`.
    pub fn of(cfg: &crate::config::Config) -> DownlinkSettings {
        DownlinkSettings {
            cfg: cfg.downlink.clone(),
            groups: cfg.groups.clone(),
            max_payload_bytes: cfg.south.max_payload_bytes,
            max_attempts: cfg.retry.max_attempts,
            plain_down: cfg.south.plain_down.clone(),
        }
    }
}

enum Done {
    Intake {
        token: AckToken,
        result: Result<DownIntakeOutcome, StoreError>,
    },
    Rejected {
        token: AckToken,
        /// Why, for the metrics.
        code: crate::protocol::envelope::RejectCode,
        result: Result<Rejected, StoreError>,
    },
    Cursors {
        device: DeviceId,
        result: Result<Cursors, StoreError>,
    },
    Read {
        device: DeviceId,
        /// The seq the batch starts after (the device's cursor or pull).
        after: Seq,
        /// When the read was asked for: the batch line's `duration_ms`.
        asked: Instant,
        gen: u64,
        reply_empty: bool,
        result: Result<BatchRead, StoreError>,
    },
    Moved {
        device: DeviceId,
        result: Result<CursorMove, StoreError>,
    },
    Swept(Result<Swept, StoreError>),
    /// A page of the receipts outbox, asked for from `from`, `limit` long.
    ReceiptsPage {
        from: i64,
        limit: usize,
        result: Result<Vec<OutboxReceipt>, StoreError>,
    },
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
    link: Link,
    /// The task's own timers (the scheduler keeps the confirm deadlines).
    timers: Deadlines<Timer>,
}

/// What a timer of the task is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Timer {
    /// Try again to hand receipts to the north session, which was full.
    ReceiptsRetry,
}

/// Inputs of the downlink task.
pub struct DownlinkInputs {
    pub north: mpsc::Receiver<DownlinkEvent>,
    pub controls: mpsc::Receiver<DeviceControl>,
    /// Presence from the south broker (embedded mode only).
    pub presence: Option<mpsc::UnboundedReceiver<Presence>>,
    pub shutdown: Shutdown,
    /// The watchdog's pings ([`crate::health`]).
    pub probed: crate::health::Probed,
    /// `[downlink]` again when it changes while running (`None`: it does
    /// not).
    /// `[downlink]` and `retry.max_attempts`, as `systemctl reload` hands
    /// them over.
    pub settings: Option<tokio::sync::watch::Receiver<(DownlinkConfig, u32)>>,
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
            link: Link::Down,
            timers: Deadlines::new(),
        }
    }

    /// Runs until its inputs close or the store stops. When device
    /// controls close in a shutdown, it first flushes (see `flushed`):
    /// store requests already made are answered and their receipts
    /// published north, while new downlinks are left unacknowledged for the
    /// upstream to send again to the next session.
    pub async fn run(mut self, mut inputs: DownlinkInputs) -> Result<(), StoreError> {
        let mut sweep = tokio::time::interval(SWEEP_EVERY);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut presence = inputs.presence.take();
        // Flushing once intake is gone in a shutdown.
        let mut phase = Phase::Running;
        // Receipts a previous run left in the outbox go first.
        self.flush_receipts();
        loop {
            let deadline = match phase {
                // Only the receipts' retry matters while flushing.
                Phase::Flushing { .. } => self.timers.next(),
                Phase::Running => [self.scheduler.next_deadline(), self.timers.next()]
                    .into_iter()
                    .flatten()
                    .min(),
            };
            let timer = sleep_until(deadline);
            let flush_over = sleep_until(phase.until());
            let presence_event = async {
                match &mut presence {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            let room = self.pending.len() < MAX_PENDING;
            tokio::select! {
                ev = inputs.north.recv(), if room => match ev {
                    Some(DownlinkEvent::Link(Link::Up(epoch))) => {
                        self.link = Link::Up(epoch);
                        self.flush_receipts();
                    }
                    Some(DownlinkEvent::Link(Link::Down)) => {
                        self.link = Link::Down;
                        self.receipts.link_down();
                    }
                    Some(DownlinkEvent::Downlink(d)) if !phase.is_running() => {
                        debug!(topic = %crate::clip::Clip(&d.topic), "downlink left unacknowledged while shutting down; the upstream sends it again");
                    }
                    Some(DownlinkEvent::Downlink(d)) => self.on_downlink(&d.topic, d.payload, d.token, d.oversize, d.received_ms).await?,
                    Some(DownlinkEvent::Published(id)) => self.on_receipts_published(id)?,
                    Some(DownlinkEvent::Refused(id)) => self.on_receipts_refused(id),
                    None => return Ok(()),
                },
                c = inputs.controls.recv(), if room && phase.is_running() => match c {
                    Some(c) => self.on_control(c).await?,
                    None => match inputs.shutdown.flush_by() {
                        Some(at) => {
                            info!(event = "downlink_flush_started", pending = self.pending.len(), receipts = self.receipts.held(), "downlink flushing receipts north");
                            phase = Phase::Flushing { until: at };
                        }
                        None => return Ok(()),
                    },
                },
                Some(p) = presence_event, if phase.is_running() => self.on_presence(p).await?,
                Some(done) = self.pending.next(), if !self.pending.is_empty() => self.on_done(done).await?,
                _ = timer => match phase {
                    Phase::Flushing { .. } => self.flush_receipts(),
                    Phase::Running => self.on_timer().await?,
                },
                (cfg, max_attempts) = crate::live::next(&mut inputs.settings) => {
                    self.scheduler.set_config(DownConfig {
                        batch_size: cfg.batch_size,
                        confirm_timeout: cfg.confirm_timeout,
                    });
                    self.settings.cfg = cfg;
                    self.settings.max_attempts = max_attempts;
                }
                // The watchdog's ping, answered from the loop.
                ack = inputs.probed.recv() => {
                    let _ = ack.send(());
                }
                _ = sweep.tick(), if phase.is_running() => {
                    let swept = self.store.sweep_downlinks(self.store.now());
                    self.pending.push(Box::pin(async move { Done::Swept(swept.await) }));
                }
                _ = flush_over => {
                    warn!(event = "downlink_flush_timed_out", pending = self.pending.len(), receipts = self.receipts.held(), "downlink flush time is up; receipts not yet acknowledged upstream stay in the outbox for the next run");
                    return Ok(());
                }
            }
            if !phase.is_running() && self.flushed() {
                info!(event = "downlink_flushed", "downlink flushed");
                return Ok(());
            }
        }
    }

    /// Nothing left to wait for in a shutdown: every store request made is
    /// answered, and its receipts are acknowledged upstream (or there is no
    /// link to send them on; they stay in the outbox).
    fn flushed(&self) -> bool {
        self.pending.is_empty() && (self.link == Link::Down || self.receipts.held() == 0)
    }

    async fn on_timer(&mut self) -> Result<(), StoreError> {
        let now = Instant::now();
        while let Some((timer, _)) = self.timers.pop_due(now) {
            match timer {
                Timer::ReceiptsRetry => self.flush_receipts(),
            }
        }
        for (device, o, actions) in self.scheduler.on_tick(now) {
            warn!(event = "downlink_batch_resent", device = %device, first_seq = o.first.0, last_seq = o.last.0, count = o.size, resends = o.resends + 1, "downlink batch not confirmed in time; resending");
            crate::metrics::retried(crate::dead_letter::Direction::Down, o.size as u64);
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
                    let asked = Instant::now();
                    let read =
                        self.store
                            .read_batch(device.clone(), after, limit, self.store.now());
                    self.pending.push(Box::pin(async move {
                        Done::Read {
                            device,
                            after,
                            asked,
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
            | Done::ReceiptsPage { result: Err(e), .. }
                if e.is_fatal() =>
            {
                return Err(e)
            }
            done => done,
        };
        match done {
            Done::Intake { token, result } => self.on_stored(token, result).await?,
            Done::Rejected {
                token,
                code,
                result,
            } => self.on_rejected(token, code, result),
            Done::Cursors {
                device,
                result: Ok(c),
            } => {
                let actions = self.scheduler.on_cursors(&device, c);
                self.execute(actions).await?;
            }
            Done::Read {
                device,
                after,
                asked,
                gen,
                reply_empty,
                result: Ok(read),
            } => {
                count_events(&read.expired);
                self.send_receipts(read.receipts);
                let span = match (read.entries.first(), read.entries.last()) {
                    (Some(f), Some(l)) => Some((f.seq, l.seq, read.entries.len())),
                    _ => None,
                };
                let verdict = self.scheduler.on_read(
                    &device,
                    gen,
                    span,
                    read.head,
                    reply_empty,
                    Instant::now(),
                );
                if verdict != Verdict::Drop && self.scheduler.is_plain(&device) {
                    self.send_plain(&device, &read.entries).await;
                } else if let Verdict::Send { more } = verdict {
                    let body = inbox_batch(read.entries.iter().map(BatchEntry::row), more);
                    let bytes = body.len();
                    self.south
                        .publish(&device, self.topics.device_inbox(&device), body)
                        .await;
                    if let Some((first, last, count)) = span {
                        info!(event = "downlink_batch_sent", device = %device, after_seq = after.0, first_seq = first.0, last_seq = last.0, count, bytes, more, duration_ms = asked.elapsed().as_millis() as u64, "downlink batch sent");
                    }
                }
            }
            Done::Moved {
                device,
                result: Ok(moved),
            } => self.on_moved(device, moved).await?,
            Done::Swept(Ok(swept)) => {
                count_events(&swept.events);
                if !swept.events.is_empty() {
                    info!(
                        event = "downlink_expired",
                        count = swept.events.len(),
                        "downlink deliveries expired (ttl)"
                    );
                }
                self.send_receipts(swept.receipts);
                let mut actions = Vec::new();
                for e in &swept.replayed {
                    info!(event = "downlink_replayed", device = %e.device, msg_id = %e.msg_id, seq = e.seq.0, "downlink replayed from the dead letters under a new seq");
                    actions.extend(self.scheduler.on_queued(&e.device, e.seq));
                }
                self.execute(actions).await?;
            }
            Done::ReceiptsPage {
                from,
                limit,
                result,
            } => self.on_outbox_page(from, limit, result),
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
                warn!(event = "downlink_store_failed", device = %device, error = %e, "downlink store request failed; the device is treated as offline until it returns");
                self.scheduler.on_offline(&device);
            }
            Done::Swept(Err(e)) => {
                warn!(event = "downlink_expiry_failed", error = %e, "downlink expiry sweep failed")
            }
        }
        Ok(())
    }
}

/// Counts deliveries that changed state, by the state they reached.
fn count_events(events: &[DeliveryEvent]) {
    for e in events {
        match e.state {
            DeliveryState::Delivered => metrics::delivered(Direction::Down, 1),
            DeliveryState::Read => metrics::read(1),
            DeliveryState::Expired => metrics::expired(Direction::Down, 1),
            DeliveryState::Dead => metrics::dead_lettered(Direction::Down, 1),
            DeliveryState::Stored => {}
        }
    }
}
