//! The north side: one persistent MQTT session to the upstream broker.
//!
//! rumqttc supplies the protocol; this module supplies what it lacks
//! (../shared/notes/RUMQTT.md): a backoff after every connection error that
//! keeps growing while connections die young, re-subscription on every
//! ConnAck, explicit packet limits, and the retained `{prefix}/status`, set
//! `online: true` only once the subscriptions are acknowledged and
//! `online: false` as the last will.
//!
//! The pipeline learns of the link through [`NorthEvent`]s: `Up(epoch)`
//! when the session can carry traffic, `Down` when it broke. Every publish
//! is made against the current epoch and goes through [`flow::Flow`], which
//! follows it to its PUBACK and finds the publish the upstream dropped the
//! link on (`Refused`). What was not acknowledged when the link dropped is
//! the pipeline's to send again. Incoming publishes are acknowledged in
//! receive order on the connection they came on.
//!
//! Nothing the upstream sends can wedge the link: packets are read up to
//! MQTT's own maximum, and one over `north.max_packet_bytes` is acknowledged
//! and reported rather than failing the connection (a broker redelivers an
//! unacknowledged message to a persistent session forever).
//!
//! One task only polls rumqttc's event loop (`poll.rs`: a poll must never be
//! cancelled) and hands every event to the session task, which does the
//! rest.

pub mod flow;
mod poll;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::{
    AsyncClient, ConnectionError, Event, LastWill, MqttOptions, Outgoing as Sent, Packet, Publish,
    QoS, SubscribeFilter,
};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::config::NorthConfig;
use crate::protocol::topics::Topics;
use crate::protocol::{now_ms, MQTT_MAX_PACKET};
pub use flow::{Outgoing, Tag};

/// Reconnect delays: 200 ms doubling to 30 s, with jitter.
const RECONNECT_BASE: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// A connection that lasted this long resets the reconnect backoff; one
/// that died sooner (an upstream that accepts and then drops us) does not.
const STABLE_AFTER: Duration = Duration::from_secs(30);
/// Requests (publishes, acks) queued towards the event loop.
const REQUEST_CAPACITY: usize = 65_536;
/// MQTT-level in-flight publishes (awaiting PUBACK) on the session.
const SESSION_INFLIGHT: u16 = 1024;
/// Publishes the pipeline may queue for the session.
const PUBLISH_QUEUE: usize = 16_384;
/// Events the poller may be ahead of the session.
const POLLED_QUEUE: usize = 1024;
/// An oversized message's head kept for the dead letter and its msg_id.
pub const OVERSIZE_HEAD: usize = 4096;

/// Counted north events nobody else counts.
pub static OVERSIZED_FROM_UPSTREAM: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NorthEvent {
    /// Connected and subscribed; `epoch` counts connections.
    Up(u64),
    /// The connection broke; nothing sent before and not reported
    /// `Published` is known to have arrived.
    Down,
    /// A backend ack message (`{prefix}/ack`), already PUBACKed.
    Ack(Bytes),
    /// A downlink envelope. It is PUBACKed only when `token` is passed to
    /// [`NorthSender::ack`], which the pipeline does after its commit.
    Downlink {
        topic: String,
        payload: Bytes,
        token: AckToken,
        /// Its real size, when only its head is in `payload` (it was over
        /// `north.max_packet_bytes`).
        oversize: Option<usize>,
    },
    /// The upstream dropped the link on this publish while it was alone in
    /// flight: a failed attempt.
    Refused(Tag),
    /// The upstream acknowledged this publish (reported for receipts only).
    Published(Tag),
}

/// Names one received publish of one connection, for its PUBACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckToken {
    epoch: u64,
    id: u64,
}

/// Publishes north; cheap to clone.
#[derive(Clone)]
pub struct NorthSender {
    publishes: mpsc::Sender<Outgoing>,
    acks: mpsc::UnboundedSender<AckToken>,
    offline: mpsc::UnboundedSender<()>,
    /// Notified once the session has sent its DISCONNECT.
    closed: Arc<Notify>,
}

impl NorthSender {
    /// Queues a QoS 1 publish for the connection `epoch`, without waiting.
    /// False if the queue is full or closed: the caller keeps the message
    /// and tries again later.
    pub fn publish(&self, topic: String, body: Bytes, tag: Tag, epoch: u64) -> bool {
        self.publishes
            .try_send(Outgoing {
                topic,
                body,
                retain: false,
                tag,
                epoch,
            })
            .is_ok()
    }

    /// The publish named by `token` may be acknowledged. Acks go out in
    /// receive order, and only on the connection the publish came on.
    pub fn ack(&self, token: AckToken) {
        let _ = self.acks.send(token);
    }

    /// Leaves cleanly: retained status `online: false` (a clean DISCONNECT
    /// does not fire the last will), then DISCONNECT, waiting at most
    /// `within` for it to be written.
    pub async fn go_offline(&self, within: Duration) {
        let closed = self.closed.notified();
        if self.offline.send(()).is_ok() {
            let _ = tokio::time::timeout(within, closed).await;
        }
    }
}

/// Starts the session task. Events arrive on the returned receiver.
pub fn start(cfg: &NorthConfig, topics: &Topics) -> (NorthSender, mpsc::Receiver<NorthEvent>) {
    let mut opts = MqttOptions::new(cfg.client_id.clone(), cfg.host.clone(), cfg.port);
    opts.set_keep_alive(cfg.keep_alive)
        .set_clean_session(false)
        .set_manual_acks(true)
        .set_inflight(SESSION_INFLIGHT)
        // Read anything a broker can send (see the module doc); send only
        // what intake made sure fits.
        .set_max_packet_size(MQTT_MAX_PACKET, cfg.max_packet_bytes)
        .set_request_channel_capacity(REQUEST_CAPACITY)
        .set_last_will(LastWill::new(
            topics.north_status(),
            status_body(false),
            QoS::AtLeastOnce,
            true,
        ));
    if let Some((user, pass)) = &cfg.credentials {
        opts.set_credentials(user.clone(), pass.clone());
    }
    let (client, mut eventloop) = AsyncClient::new(opts, REQUEST_CAPACITY);
    // Uplinks, acks and receipts are small; don't let Nagle hold them back.
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    eventloop.set_network_options(net);
    let (events_tx, events) = mpsc::channel(4096);
    let (polled_tx, polled_rx) = mpsc::channel(POLLED_QUEUE);
    tokio::spawn(poll::run(eventloop, polled_tx));
    let (acks_tx, acks_rx) = mpsc::unbounded_channel();
    let (publishes_tx, publishes_rx) = mpsc::channel(PUBLISH_QUEUE);
    let (offline_tx, offline_rx) = mpsc::unbounded_channel();
    let closed = Arc::new(Notify::new());
    let session = Session {
        closed: closed.clone(),
        client,
        topics: topics.clone(),
        events: events_tx,
        flow: flow::Flow::new(SESSION_INFLIGHT as usize),
        unacked: VecDeque::new(),
        next_id: 0,
        epoch: 0,
        max_packet: cfg.max_packet_bytes,
        host: cfg.host.clone(),
        port: cfg.port,
    };
    tokio::spawn(session.run(polled_rx, acks_rx, publishes_rx, offline_rx));
    (
        NorthSender {
            publishes: publishes_tx,
            acks: acks_tx,
            offline: offline_tx,
            closed,
        },
        events,
    )
}

fn status_body(online: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"online": online, "ts": now_ms()}))
        .expect("status serializes")
}

/// A received publish waiting for its turn to be acknowledged.
struct Unacked {
    id: u64,
    publish: Publish,
    ready: bool,
}

/// The connection's lifecycle.
enum Link {
    /// Connecting, or waiting to reconnect.
    Down,
    /// Connected since `at`.
    Connected { at: Instant, stage: Stage },
    /// DISCONNECT requested; the session ends when it is written.
    Closing,
}

/// How far a new connection got.
#[derive(PartialEq)]
enum Stage {
    /// Waiting for the SubAck.
    Subscribing,
    /// Subscribed; the retained `online: true` is out, alone, so that a
    /// drop is never blamed on it when pipeline traffic follows.
    Announcing,
    /// `Up` was told: the pipeline publishes.
    Up,
}

struct Session {
    closed: Arc<Notify>,
    client: AsyncClient,
    topics: Topics,
    events: mpsc::Sender<NorthEvent>,
    flow: flow::Flow,
    /// This connection's received publishes, in receive order.
    unacked: VecDeque<Unacked>,
    next_id: u64,
    epoch: u64,
    max_packet: usize,
    host: String,
    port: u16,
}

impl Session {
    async fn run(
        mut self,
        mut polled: mpsc::Receiver<poll::Polled>,
        mut acks: mpsc::UnboundedReceiver<AckToken>,
        mut publishes: mpsc::Receiver<Outgoing>,
        mut offline: mpsc::UnboundedReceiver<()>,
    ) {
        let mut link = Link::Down;
        let mut failures = 0u32;
        loop {
            let connected = !matches!(link, Link::Down);
            if matches!(link, Link::Connected { .. }) {
                self.hand_over();
            }
            let probe_deadline = self.flow.probe_deadline();
            let polled = tokio::select! {
                polled = polled.recv() => match polled {
                    Some(p) => p,
                    None => return,
                },
                Some(token) = acks.recv(), if connected => {
                    self.ready(token);
                    continue;
                }
                Some(out) = publishes.recv(), if connected && self.flow.held() < PUBLISH_QUEUE => {
                    self.flow.submit(out);
                    continue;
                }
                Some(()) = offline.recv(), if matches!(link, Link::Connected { .. }) => {
                    self.leave();
                    link = Link::Closing;
                    continue;
                }
                _ = sleep_until(probe_deadline), if probe_deadline.is_some() => {
                    if let Some(tag) = self.flow.expire_probe(Instant::now()) {
                        warn!(tag = ?tag, "north probe neither acknowledged nor refused; resuming");
                    }
                    continue;
                }
            };
            match polled {
                poll::Polled::Event(Event::Incoming(Packet::ConnAck(ack))) => {
                    link = Link::Connected {
                        at: Instant::now(),
                        stage: Stage::Subscribing,
                    };
                    self.epoch += 1;
                    self.flow.connected(self.epoch);
                    self.unacked.clear();
                    info!(host = %self.host, port = self.port, session_present = ack.session_present, epoch = self.epoch, "north connected");
                    // Subscribe every time: rumqttc does not restore
                    // subscriptions, and a repeat is harmless.
                    let filters = [
                        self.topics.north_ack(),
                        self.topics.north_down_filter(),
                        self.topics.north_down(),
                    ]
                    .map(|path| SubscribeFilter::new(path, QoS::AtLeastOnce));
                    if let Err(e) = self.client.try_subscribe_many(filters) {
                        warn!(error = %e, "north subscribe could not be queued");
                    }
                }
                poll::Polled::Event(Event::Incoming(Packet::SubAck(_))) => {
                    if let Link::Connected { stage, .. } = &mut link {
                        if *stage == Stage::Subscribing {
                            *stage = Stage::Announcing;
                            self.flow.submit(Outgoing {
                                topic: self.topics.north_status(),
                                body: Bytes::from(status_body(true)),
                                retain: true,
                                tag: Tag::Status,
                                epoch: self.epoch,
                            });
                        }
                    }
                }
                poll::Polled::Event(Event::Outgoing(Sent::Publish(pkid))) => {
                    self.flow.written(pkid, Instant::now())
                }
                poll::Polled::Event(Event::Outgoing(Sent::AwaitAck(pkid))) => {
                    self.flow.collision(pkid)
                }
                poll::Polled::Event(Event::Incoming(Packet::PubAck(ack))) => {
                    let event = match (self.flow.acked(ack.pkid), &mut link) {
                        (Some(tag @ Tag::Receipts(_)), _) => Some(NorthEvent::Published(tag)),
                        (Some(Tag::Status), Link::Connected { stage, .. })
                            if *stage == Stage::Announcing =>
                        {
                            *stage = Stage::Up;
                            Some(NorthEvent::Up(self.epoch))
                        }
                        _ => None,
                    };
                    if let Some(event) = event {
                        if !self.emit(event).await {
                            return;
                        }
                    }
                }
                poll::Polled::Event(Event::Incoming(Packet::Publish(p))) => {
                    if !self.on_publish(p).await {
                        return;
                    }
                }
                poll::Polled::Event(Event::Outgoing(Sent::Disconnect)) => {
                    info!("north session closed");
                    self.closed.notify_waiters();
                    return;
                }
                poll::Polled::Event(_) => {}
                poll::Polled::Error(e, resume) => {
                    // What was received on the lost connection is sent again
                    // by the broker; its acks must not go out on the next one.
                    self.unacked.clear();
                    let strike = self.flow.lost(Instant::now());
                    if let Some(tag) = &strike {
                        warn!(tag = ?tag, error = %e, "the upstream broker dropped the link on this message");
                        if !self.emit(NorthEvent::Refused(tag.clone())).await {
                            return;
                        }
                    }
                    let was = std::mem::replace(&mut link, Link::Down);
                    if let Link::Connected { at, stage } = was {
                        if at.elapsed() >= STABLE_AFTER {
                            failures = 0;
                        }
                        if stage == Stage::Up && !self.emit(NorthEvent::Down).await {
                            return;
                        }
                    } else if matches!(was, Link::Closing) {
                        self.closed.notify_waiters();
                        return;
                    }
                    // A drop explained by one message is no reason to wait
                    // longer: that message backs off on its own. Any other
                    // early death makes the next wait longer.
                    let delay = if strike.is_some() {
                        reconnect_delay(0)
                    } else {
                        failures = failures.saturating_add(1);
                        reconnect_delay(failures - 1)
                    };
                    log_error(&e, &self.host, self.port, failures, delay);
                    let _ = resume.send(delay);
                }
            }
        }
    }

    async fn emit(&self, event: NorthEvent) -> bool {
        self.events.send(event).await.is_ok()
    }

    /// Hands rumqttc every publish that may go now.
    fn hand_over(&mut self) {
        while let Some(out) = self.flow.next_to_send() {
            let payload = out.body.to_vec();
            if self
                .client
                .try_publish(out.topic.clone(), QoS::AtLeastOnce, out.retain, payload)
                .is_err()
            {
                self.flow.refused_by_client(out);
                return;
            }
        }
    }

    /// Retained `online: false` (a clean DISCONNECT does not fire the last
    /// will), then DISCONNECT.
    fn leave(&mut self) {
        // Ahead of anything held: the session ends.
        let status = self.flow.bypass(Outgoing {
            topic: self.topics.north_status(),
            body: Bytes::from(status_body(false)),
            retain: true,
            tag: Tag::Status,
            epoch: self.epoch,
        });
        let _ = self
            .client
            .try_publish(status.topic, QoS::AtLeastOnce, true, status.body.to_vec());
        if self.client.try_disconnect().is_err() {
            self.closed.notify_waiters();
        }
    }

    /// Routes one incoming publish; false once the pipeline is gone.
    async fn on_publish(&mut self, p: Publish) -> bool {
        let id = self.next_id;
        self.next_id += 1;
        let size = p.topic.len() + p.payload.len();
        let oversize = (size > self.max_packet).then_some(size);
        if let Some(size) = oversize {
            let total = OVERSIZED_FROM_UPSTREAM.fetch_add(1, Ordering::Relaxed) + 1;
            warn!(topic = %truncate(&p.topic, 200), bytes = size, limit = self.max_packet, total, "north message over north.max_packet_bytes acknowledged and not processed");
        }
        let event = if p.topic == self.topics.north_ack() {
            oversize
                .is_none()
                .then(|| NorthEvent::Ack(p.payload.clone()))
        } else if self.topics.is_north_down(&p.topic) {
            let payload = match oversize {
                Some(_) => p.payload.slice(..OVERSIZE_HEAD.min(p.payload.len())),
                None => p.payload.clone(),
            };
            Some(NorthEvent::Downlink {
                topic: p.topic.clone(),
                payload,
                token: AckToken {
                    epoch: self.epoch,
                    id,
                },
                oversize,
            })
        } else {
            debug!(topic = %truncate(&p.topic, 200), "ignoring a north publish on an unknown topic");
            None
        };
        // Uplink acks (and strays) are acked at once; a downlink waits for
        // its commit. Either way, in receive order.
        let ready = !matches!(event, Some(NorthEvent::Downlink { .. }));
        self.unacked.push_back(Unacked {
            id,
            publish: p,
            ready,
        });
        if ready {
            self.flush();
        }
        match event {
            Some(event) => self.emit(event).await,
            None => true,
        }
    }

    fn ready(&mut self, token: AckToken) {
        if token.epoch != self.epoch {
            return;
        }
        if let Some(u) = self.unacked.iter_mut().find(|u| u.id == token.id) {
            u.ready = true;
        }
        self.flush();
    }

    /// Acks the ready head of the queue, in order.
    fn flush(&mut self) {
        while self.unacked.front().is_some_and(|u| u.ready) {
            let u = self.unacked.pop_front().expect("front exists");
            if let Err(e) = self.client.try_ack(&u.publish) {
                warn!(error = %e, "north ack could not be queued");
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn log_error(e: &ConnectionError, host: &str, port: u16, failures: u32, delay: Duration) {
    // The first failures of an outage are worth a warning; the rest only
    // say the same thing again.
    if failures <= 3 || failures.is_power_of_two() {
        warn!(host, port, error = %e, failures, retry_in_ms = delay.as_millis() as u64, "north link down");
    } else {
        debug!(host, port, error = %e, failures, "north link still down");
    }
}

fn reconnect_delay(failures: u32) -> Duration {
    let cfg = crate::config::RetryConfig {
        base: RECONNECT_BASE,
        max: RECONNECT_MAX,
        max_attempts: 1,
        jitter: 0.5,
    };
    crate::backoff::delay_random(&cfg, failures)
}
