//! The north side: one persistent MQTT session to the upstream broker.
//!
//! rumqttc supplies the protocol; this module supplies what it lacks
//! (../shared/notes/RUMQTT.md): a backoff after every connection error,
//! re-subscription on every ConnAck, an explicit max packet size, and the
//! retained `{prefix}/status`, set `online: true` only once the
//! subscriptions are acknowledged and `online: false` as the last will.
//!
//! The pipeline learns of the link through [`NorthEvent`]s: `Up(epoch)`
//! when the session can carry traffic, `Down` when it broke. Every publish
//! of the pipeline is made against the current epoch; what was in flight
//! when the link dropped is the pipeline's to resend. Incoming publishes
//! are acknowledged in receive order on the connection they came on.

use std::time::Duration;

use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;

use rumqttc::{
    AsyncClient, ConnectionError, Event, LastWill, MqttOptions, Outgoing, Packet, Publish, QoS,
    SubscribeFilter,
};
use tokio::sync::{mpsc, Notify};
use tracing::{debug, info, warn};

use crate::config::NorthConfig;
use crate::protocol::now_ms;
use crate::protocol::topics::Topics;

/// Reconnect delays: 200 ms doubling to 30 s, with jitter.
const RECONNECT_BASE: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// Requests (publishes, acks) queued towards the event loop.
const REQUEST_CAPACITY: usize = 65_536;
/// MQTT-level in-flight publishes (awaiting PUBACK) on the session.
const SESSION_INFLIGHT: u16 = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NorthEvent {
    /// Connected and subscribed; `epoch` counts connections.
    Up(u64),
    /// The connection broke; nothing sent before is known to have arrived.
    Down,
    /// A backend ack message (`{prefix}/ack`), already PUBACKed.
    Ack(Bytes),
    /// A downlink envelope. It is PUBACKed only when `token` is passed to
    /// [`NorthSender::ack`], which the pipeline does after its commit.
    Downlink {
        topic: String,
        payload: Bytes,
        token: AckToken,
    },
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
    client: AsyncClient,
    acks: mpsc::UnboundedSender<AckToken>,
    status_topic: String,
    /// Notified once the session has sent its DISCONNECT.
    closed: Arc<Notify>,
}

impl NorthSender {
    /// Queues a QoS 1 publish without waiting. False if the queue is full
    /// or closed: the caller keeps the message and tries again later.
    pub fn try_publish(&self, topic: String, body: &Bytes) -> bool {
        self.client
            .try_publish(topic, QoS::AtLeastOnce, false, body.to_vec())
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
        let _ = self.client.try_publish(
            self.status_topic.clone(),
            QoS::AtLeastOnce,
            true,
            status_body(false),
        );
        if self.client.try_disconnect().is_ok() {
            let _ = tokio::time::timeout(within, closed).await;
        }
    }
}

/// Starts the session task. Events arrive on the returned receiver.
pub fn start(
    cfg: &NorthConfig,
    topics: &Topics,
    max_packet: usize,
) -> (NorthSender, mpsc::Receiver<NorthEvent>) {
    let mut opts = MqttOptions::new(cfg.client_id.clone(), cfg.host.clone(), cfg.port);
    opts.set_keep_alive(cfg.keep_alive)
        .set_clean_session(false)
        .set_manual_acks(true)
        .set_inflight(SESSION_INFLIGHT)
        .set_max_packet_size(max_packet, max_packet)
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
    let (acks_tx, acks_rx) = mpsc::unbounded_channel();
    let closed = Arc::new(Notify::new());
    let session = Session {
        closed: closed.clone(),
        client: client.clone(),
        topics: topics.clone(),
        events: events_tx,
        unacked: VecDeque::new(),
        next_id: 0,
        epoch: 0,
    };
    tokio::spawn(session.run(eventloop, acks_rx, cfg.host.clone(), cfg.port));
    let status_topic = topics.north_status();
    (
        NorthSender {
            client,
            acks: acks_tx,
            status_topic,
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

struct Session {
    closed: Arc<Notify>,
    client: AsyncClient,
    topics: Topics,
    events: mpsc::Sender<NorthEvent>,
    /// This connection's received publishes, in receive order.
    unacked: VecDeque<Unacked>,
    next_id: u64,
    epoch: u64,
}

impl Session {
    async fn run(
        mut self,
        mut eventloop: rumqttc::EventLoop,
        mut acks: mpsc::UnboundedReceiver<AckToken>,
        host: String,
        port: u16,
    ) {
        let mut connected = false;
        let mut up = false;
        let mut failures = 0u32;
        loop {
            // Acks are only taken while connected: polling is never cancelled
            // in the middle of a connection attempt.
            let polled = if connected {
                tokio::select! {
                    ev = eventloop.poll() => ev,
                    Some(token) = acks.recv() => {
                        self.ready(token);
                        continue;
                    }
                }
            } else {
                eventloop.poll().await
            };
            match polled {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    connected = true;
                    self.epoch += 1;
                    self.unacked.clear();
                    failures = 0;
                    info!(host = %host, port, session_present = ack.session_present, epoch = self.epoch, "north connected");
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
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if !up {
                        up = true;
                        let _ = self.client.try_publish(
                            self.topics.north_status(),
                            QoS::AtLeastOnce,
                            true,
                            status_body(true),
                        );
                        if self.events.send(NorthEvent::Up(self.epoch)).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let id = self.next_id;
                    self.next_id += 1;
                    let event = if p.topic == self.topics.north_ack() {
                        Some(NorthEvent::Ack(p.payload.clone()))
                    } else if self.topics.is_north_down(&p.topic) {
                        let token = AckToken {
                            epoch: self.epoch,
                            id,
                        };
                        Some(NorthEvent::Downlink {
                            topic: p.topic.clone(),
                            payload: p.payload.clone(),
                            token,
                        })
                    } else {
                        debug!(topic = %p.topic, "ignoring a north publish on an unknown topic");
                        None
                    };
                    // Uplink acks (and strays) are acked at once; a downlink
                    // waits for its commit. Either way, in receive order.
                    let ready = !matches!(event, Some(NorthEvent::Downlink { .. }));
                    self.unacked.push_back(Unacked {
                        id,
                        publish: p,
                        ready,
                    });
                    if ready {
                        self.flush();
                    }
                    if let Some(event) = event {
                        if self.events.send(event).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                    info!("north session closed");
                    self.closed.notify_waiters();
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    connected = false;
                    // What was received on the lost connection is sent again
                    // by the broker; its acks must not go out on the next one.
                    self.unacked.clear();
                    if up {
                        up = false;
                        if self.events.send(NorthEvent::Down).await.is_err() {
                            return;
                        }
                    }
                    let delay = reconnect_delay(failures);
                    failures = failures.saturating_add(1);
                    log_error(&e, &host, port, failures, delay);
                    tokio::time::sleep(delay).await;
                }
            }
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
