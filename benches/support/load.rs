//! Uplink load: a fleet of devices, each a [`ferry::mqtt::Session`] on the
//! south broker (ferry's own, or the site broker in external mode), that
//! publish envelopes QoS 1 and read their receipts.
//!
//! A device keeps at most `window` messages without a `stored` receipt, as
//! a real device would, and either publishes as fast as that window allows
//! or on a fixed schedule (`period`). It measures what it sees: each
//! message's latency from just before its publish to its `stored` receipt,
//! and the receipts' order, seqs and duplicates. After a reconnect it
//! resends what has no `stored` yet (same `msg_id`), as the protocol asks.
//!
//! Every wait is bounded by the phase's deadline; a device that runs out of
//! time says so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry::ids::MsgId;
use ferry::mqtt::{Event, MqttVersion, Options, Session};
use ferry::protocol::envelope::WireEnvelope;
use ferry::protocol::receipt::{Receipt, ReceiptStatus};
use ferry::protocol::topics::DeviceTopics;
use hdrhistogram::Histogram;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, MissedTickBehavior};

use super::device_id;

/// Devices connect in groups of this many, so that setup is not a connect
/// storm (each CONNECT costs a round trip to the broker's router).
const CONNECT_GROUP: usize = 20;
/// How long a device may take to be connected and subscribed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The uplink stream the devices publish on.
const STREAM: &str = "bench";
/// The south topic prefix (ferry's default).
const SOUTH_PREFIX: &str = "devices";

/// What one phase asks of every device.
pub struct PhaseCtx {
    /// Part of every `msg_id`, so one phase's receipts are told from another's.
    pub run_id: String,
    /// The broker the devices connect to.
    pub port: u16,
    /// The MQTT version every device connects with.
    pub mqtt: MqttVersion,
    pub devices: usize,
    pub messages: usize,
    pub window: usize,
    /// The payload of every envelope (a JSON string of `payload_bytes` x's).
    pub payload: Value,
    /// Send each payload as `{"t": ns since origin, "pad": payload}`, so that
    /// a consumer on the far side can time it ([`super::arrivals`]).
    pub stamp: bool,
    /// Per-device interval between publishes; `None` = as fast as the
    /// window allows.
    pub period: Option<Duration>,
    /// Time origin for the `*_ns` fields.
    pub origin: Instant,
    pub deadline: tokio::time::Instant,
}

impl PhaseCtx {
    fn now_ns(&self) -> u64 {
        (self.origin.elapsed().as_nanos() as u64).max(1)
    }
}

// ------------------------------------------------------------------ results

/// Counts of what devices saw; one device's, or a phase's summed.
pub struct Seen {
    pub published: u64,
    pub stored: u64,
    pub delivered: u64,
    pub failed: u64,
    pub rejected: u64,
    pub duplicate_receipts: u64,
    /// `delivered` before `stored`, or a receipt whose seq differs from the first.
    pub order_or_seq_errors: u64,
    pub unparsable: u64,
    /// Receipts for an earlier phase's messages (late `delivered`s).
    pub foreign: u64,
    /// Connections that were up and dropped.
    pub drops: u64,
    pub reconnects: u64,
    pub resent: u64,
    pub devices_timed_out: u64,
    pub first_publish_ns: u64,
    pub last_stored_ns: u64,
    pub last_delivered_ns: u64,
    /// Stored-receipt latency, µs.
    pub latency_us: Histogram<u64>,
}

impl Seen {
    pub fn new() -> Seen {
        Seen {
            published: 0,
            stored: 0,
            delivered: 0,
            failed: 0,
            rejected: 0,
            duplicate_receipts: 0,
            order_or_seq_errors: 0,
            unparsable: 0,
            foreign: 0,
            drops: 0,
            reconnects: 0,
            resent: 0,
            devices_timed_out: 0,
            first_publish_ns: u64::MAX,
            last_stored_ns: 0,
            last_delivered_ns: 0,
            latency_us: Histogram::new_with_bounds(1, 600_000_000, 3)
                .expect("static histogram bounds"),
        }
    }

    fn add(&mut self, d: &Seen) {
        self.published += d.published;
        self.stored += d.stored;
        self.delivered += d.delivered;
        self.failed += d.failed;
        self.rejected += d.rejected;
        self.duplicate_receipts += d.duplicate_receipts;
        self.order_or_seq_errors += d.order_or_seq_errors;
        self.unparsable += d.unparsable;
        self.foreign += d.foreign;
        self.drops += d.drops;
        self.reconnects += d.reconnects;
        self.resent += d.resent;
        self.devices_timed_out += d.devices_timed_out;
        self.first_publish_ns = self.first_publish_ns.min(d.first_publish_ns);
        self.last_stored_ns = self.last_stored_ns.max(d.last_stored_ns);
        self.last_delivered_ns = self.last_delivered_ns.max(d.last_delivered_ns);
        let _ = self.latency_us.add(&d.latency_us);
    }

    /// `stored` receipts per second, first publish to last `stored`.
    pub fn stored_rate(&self) -> f64 {
        rate(self.stored, self.first_publish_ns, self.last_stored_ns)
    }

    /// `delivered` receipts per second, first publish to last `delivered`.
    pub fn e2e_rate(&self) -> f64 {
        rate(
            self.delivered,
            self.first_publish_ns,
            self.last_delivered_ns,
        )
    }
}

fn rate(count: u64, from_ns: u64, to_ns: u64) -> f64 {
    if count == 0 || to_ns <= from_ns {
        return 0.0;
    }
    count as f64 / ((to_ns - from_ns) as f64 / 1e9)
}

// -------------------------------------------------------------------- fleet

/// The devices of one phase, connected and subscribed, waiting for `go`.
pub struct Fleet {
    go: watch::Sender<bool>,
    devices: Vec<(JoinHandle<Seen>, JoinHandle<u64>)>,
}

impl Fleet {
    /// Connects every device (in groups) and waits for each to be
    /// subscribed to its receipts before returning.
    pub async fn connect(ctx: Arc<PhaseCtx>) -> Result<Fleet, String> {
        let (go, go_rx) = watch::channel(false);
        let mut devices = Vec::with_capacity(ctx.devices);
        let ids: Vec<usize> = (0..ctx.devices).collect();
        for group in ids.chunks(CONNECT_GROUP) {
            let mut readies = Vec::new();
            for &i in group {
                let (ready_tx, ready_rx) = oneshot::channel();
                let device = Device::start(i, ctx.clone());
                let shared = device.shared.clone();
                let session = device.session.clone();
                let receiver = tokio::spawn(device.run(ready_tx));
                let publisher =
                    tokio::spawn(publish(session, ctx.clone(), shared, i, go_rx.clone()));
                devices.push((receiver, publisher));
                readies.push((i, ready_rx));
            }
            for (i, rx) in readies {
                if !matches!(timeout(CONNECT_TIMEOUT, rx).await, Ok(Ok(()))) {
                    return Err(format!(
                        "dev-{i}: not connected and subscribed on port {} within {CONNECT_TIMEOUT:?}",
                        ctx.port
                    ));
                }
            }
        }
        Ok(Fleet { go, devices })
    }

    /// Lets every device publish; returns what they saw once each has
    /// every final receipt or the deadline passed.
    pub async fn run(self) -> Result<Seen, String> {
        let _ = self.go.send(true);
        let mut seen = Seen::new();
        for (receiver, publisher) in self.devices {
            let published = publisher.await.unwrap_or(0);
            let mut d = receiver
                .await
                .map_err(|e| format!("device task panicked: {e}"))?;
            d.published = published;
            seen.add(&d);
        }
        Ok(seen)
    }
}

// ------------------------------------------------------------------- device

/// Receipt states of one message, as bits.
const STORED: u8 = 1;
const DELIVERED: u8 = 2;
const FAILED: u8 = 4;

/// Shared by a device's publisher and its receiver.
struct Shared {
    /// ns since `origin` just before message `n` was published; 0 = not yet.
    sent_at: Box<[AtomicU64]>,
    /// One permit per message that may be outstanding without `stored`.
    window: Semaphore,
    /// `{run}-{i}-`: message `n`'s id is this and `n`.
    prefix: String,
    /// `devices/dev-{i}/up/bench`.
    topic_up: String,
}

impl Shared {
    /// Message `n`'s envelope, first sent at `sent_ns`.
    fn envelope(&self, n: usize, ctx: &PhaseCtx, sent_ns: u64) -> Vec<u8> {
        let msg_id = format!("{}{n}", self.prefix);
        if ctx.stamp {
            return super::arrivals::stamped_envelope(&msg_id, sent_ns, &ctx.payload);
        }
        let msg_id = MsgId::new(msg_id).expect("bench msg_ids are valid");
        WireEnvelope::json(msg_id, ctx.payload.clone()).to_bytes()
    }
}

/// The receiving side of one device: receipts, latency, window refills.
struct Device {
    i: usize,
    ctx: Arc<PhaseCtx>,
    shared: Arc<Shared>,
    session: Session<()>,
    events: mpsc::Receiver<Event<()>>,
    state: Vec<u8>,
    seq: Vec<u64>,
    seen: Seen,
}

impl Device {
    fn start(i: usize, ctx: Arc<PhaseCtx>) -> Device {
        let id = device_id(i);
        let topics = DeviceTopics::new(SOUTH_PREFIX, &id);
        let mut opts = Options::new(id.as_str(), "127.0.0.1", ctx.port, id.as_str());
        opts.subscriptions = vec![topics.ack()];
        opts.version = ctx.mqtt;
        opts.inflight = (ctx.window + 64).clamp(128, u16::MAX as usize) as u16;
        opts.max_incoming_packet = 1 << 20;
        opts.max_outgoing_packet = 1 << 20;
        opts.max_message_bytes = 1 << 20;
        // What a dropped connection lost, the device resends itself.
        opts.replay = false;
        let (session, events) = Session::start(opts);
        let shared = Arc::new(Shared {
            sent_at: (0..ctx.messages).map(|_| AtomicU64::new(0)).collect(),
            window: Semaphore::new(ctx.window),
            prefix: format!("{}-{i}-", ctx.run_id),
            topic_up: topics.up(STREAM),
        });
        Device {
            i,
            state: vec![0; ctx.messages],
            seq: vec![0; ctx.messages],
            ctx,
            shared,
            session,
            events,
            seen: Seen::new(),
        }
    }

    fn finished(&self) -> bool {
        self.seen.delivered + self.seen.failed >= self.ctx.messages as u64
    }

    /// Handles receipts until everything is delivered (or failed) or the
    /// phase deadline passes; `ready` once first subscribed.
    async fn run(mut self, ready: oneshot::Sender<()>) -> Seen {
        let mut ready = Some(ready);
        while !self.finished() {
            let Ok(event) = timeout_at(self.ctx.deadline, self.events.recv()).await else {
                self.seen.devices_timed_out = 1;
                break;
            };
            match event {
                Some(Event::Message(m)) => self.on_receipt(&m.payload),
                Some(Event::Up { .. }) => match ready.take() {
                    Some(tx) => {
                        let _ = tx.send(());
                    }
                    None => {
                        self.seen.reconnects += 1;
                        self.resend_unstored();
                    }
                },
                Some(Event::Down) => {
                    self.seen.drops += 1;
                    if self.seen.drops <= 2 {
                        eprintln!("dev-{}: connection dropped", self.i);
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        let first = self
            .shared
            .sent_at
            .first()
            .map(|t| t.load(Ordering::Acquire));
        if let Some(first) = first.filter(|t| *t != 0) {
            self.seen.first_publish_ns = first;
        }
        self.session.close(None, Duration::from_secs(1)).await;
        self.seen
    }

    fn on_receipt(&mut self, body: &[u8]) {
        let Ok(receipt) = serde_json::from_slice::<Receipt>(body) else {
            self.seen.unparsable += 1;
            return;
        };
        if receipt.status == ReceiptStatus::Rejected {
            self.seen.rejected += 1;
            return;
        }
        let Some(n) = receipt
            .msg_id
            .as_ref()
            .and_then(|id| id.as_str().strip_prefix(self.shared.prefix.as_str()))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n < self.ctx.messages)
        else {
            self.seen.foreign += 1;
            return;
        };
        let now = self.ctx.now_ns();
        let st = self.state[n];
        if let Some(seq) = receipt.seq {
            if self.seq[n] == 0 {
                self.seq[n] = seq.0;
            } else if self.seq[n] != seq.0 {
                self.seen.order_or_seq_errors += 1;
            }
        }
        match receipt.status {
            ReceiptStatus::Stored if st & (STORED | FAILED) == 0 => self.mark_stored(n, now),
            ReceiptStatus::Delivered if st & DELIVERED == 0 => {
                if st & (STORED | FAILED) == 0 {
                    // Receipts must come in state order; count it and go on.
                    self.seen.order_or_seq_errors += 1;
                    self.mark_stored(n, now);
                }
                self.state[n] |= DELIVERED;
                self.seen.delivered += 1;
                self.seen.last_delivered_ns = now;
            }
            ReceiptStatus::Failed if st & (FAILED | DELIVERED) == 0 => {
                if st & STORED == 0 {
                    self.shared.window.add_permits(1);
                }
                self.state[n] |= FAILED;
                self.seen.failed += 1;
            }
            _ => self.seen.duplicate_receipts += 1,
        }
    }

    fn mark_stored(&mut self, n: usize, now: u64) {
        self.state[n] |= STORED;
        self.seen.stored += 1;
        self.seen.last_stored_ns = now;
        let sent = self.shared.sent_at[n].load(Ordering::Acquire);
        if sent != 0 {
            self.seen
                .latency_us
                .saturating_record(now.saturating_sub(sent) / 1000);
        }
        self.shared.window.add_permits(1);
    }

    /// After a reconnect without a session: a device resends what it has
    /// no `stored` for (same msg_id).
    fn resend_unstored(&mut self) {
        for n in 0..self.ctx.messages {
            let sent_ns = self.shared.sent_at[n].load(Ordering::Acquire);
            if sent_ns != 0 && self.state[n] & (STORED | FAILED) == 0 {
                let body = self.shared.envelope(n, &self.ctx, sent_ns);
                if self
                    .session
                    .send(self.shared.topic_up.as_str(), body, false)
                {
                    self.seen.resent += 1;
                }
            }
        }
    }
}

/// Publishes the device's messages once `go` is set: waits for a window
/// permit (and, paced, for the next tick of its schedule), then publishes
/// QoS 1. Returns how many it published.
async fn publish(
    session: Session<()>,
    ctx: Arc<PhaseCtx>,
    shared: Arc<Shared>,
    i: usize,
    mut go: watch::Receiver<bool>,
) -> u64 {
    if timeout_at(ctx.deadline, go.wait_for(|g| *g)).await.is_err() {
        return 0;
    }
    let mut ticker = ctx.period.map(|period| {
        // Spread the devices' schedules evenly over one period.
        let offset = period.mul_f64(i as f64 / ctx.devices as f64);
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
        t.set_missed_tick_behavior(MissedTickBehavior::Burst);
        t
    });
    let mut published = 0;
    for n in 0..ctx.messages {
        if let Some(t) = ticker.as_mut() {
            if timeout_at(ctx.deadline, t.tick()).await.is_err() {
                break;
            }
        }
        match timeout_at(ctx.deadline, shared.window.acquire()).await {
            Ok(Ok(permit)) => permit.forget(),
            _ => break,
        }
        let sent_ns = ctx.now_ns();
        let body = shared.envelope(n, &ctx, sent_ns);
        shared.sent_at[n].store(sent_ns, Ordering::Release);
        let sent = session.send_wait(shared.topic_up.as_str(), body, false);
        match timeout_at(ctx.deadline, sent).await {
            Ok(true) => published += 1,
            _ => break,
        }
    }
    published
}
