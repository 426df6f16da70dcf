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
use rumqttc::{AsyncClient, ConnectionError, Event, LastWill, MqttOptions, Packet, QoS};
use tokio::sync::mpsc;
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
}

/// Publishes north; cheap to clone.
#[derive(Clone)]
pub struct NorthSender {
    client: AsyncClient,
}

impl NorthSender {
    /// Queues a QoS 1 publish without waiting. False if the queue is full
    /// or closed: the caller keeps the message and tries again later.
    pub fn try_publish(&self, topic: String, body: &Bytes) -> bool {
        self.client
            .try_publish(topic, QoS::AtLeastOnce, false, body.to_vec())
            .is_ok()
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
    let (client, eventloop) = AsyncClient::new(opts, REQUEST_CAPACITY);
    let (events_tx, events) = mpsc::channel(4096);
    let session = Session {
        client: client.clone(),
        topics: topics.clone(),
        events: events_tx,
    };
    tokio::spawn(session.run(eventloop, cfg.host.clone(), cfg.port));
    (NorthSender { client }, events)
}

fn status_body(online: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"online": online, "ts": now_ms()}))
        .expect("status serializes")
}

struct Session {
    client: AsyncClient,
    topics: Topics,
    events: mpsc::Sender<NorthEvent>,
}

impl Session {
    async fn run(self, mut eventloop: rumqttc::EventLoop, host: String, port: u16) {
        let mut epoch = 0u64;
        let mut up = false;
        let mut failures = 0u32;
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    epoch += 1;
                    failures = 0;
                    info!(host = %host, port, session_present = ack.session_present, epoch, "north connected");
                    // Subscribe every time: rumqttc does not restore
                    // subscriptions, and a repeat is harmless.
                    if let Err(e) = self
                        .client
                        .try_subscribe(self.topics.north_ack(), QoS::AtLeastOnce)
                    {
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
                        if self.events.send(NorthEvent::Up(epoch)).await.is_err() {
                            return;
                        }
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let ack_topic = self.topics.north_ack();
                    if p.topic == ack_topic {
                        if self
                            .events
                            .send(NorthEvent::Ack(p.payload.clone()))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    } else {
                        debug!(topic = %p.topic, "ignoring a north publish on an unknown topic");
                    }
                    // In receive order, on this connection: the event loop
                    // is polled by this task alone, so no reconnect can
                    // happen between receiving and queuing the ack.
                    if let Err(e) = self.client.try_ack(&p) {
                        warn!(error = %e, "north ack could not be queued");
                    }
                }
                Ok(_) => {}
                Err(e) => {
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
