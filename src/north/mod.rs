//! The north side: one persistent session to the upstream broker, on
//! [`crate::mqtt`].
//!
//! What north adds to the session: its subscriptions (`{prefix}/ack`, the
//! downlink topics), the retained `{prefix}/status` — `online: true` only
//! once the subscriptions are acknowledged, `online: false` as the last will
//! and on a clean leave — and the routing of what arrives into
//! [`NorthEvent`]s for the two pipelines.
//!
//! The session goes to one of `north.endpoints` at a time (see
//! [`crate::mqtt::endpoints`]); the subscriptions and the status announce
//! are made on every connection, so on every node. The gauge
//! `ferry_north_endpoint_index` follows `Up` and `Down`.
//!
//! The pipeline learns of the link through `Up(epoch)` and `Down`. Every
//! publish is made against the current epoch and is followed to its PUBACK;
//! the one the upstream drops the link on comes back as `Refused`. What was
//! not acknowledged when the link dropped is the pipeline's to send again.
//! A downlink is acknowledged only when the pipeline passes its token to
//! [`NorthSender::ack`], after its commit, in receive order.
//!
//! Nothing the upstream sends can wedge the link: packets are read up to
//! MQTT's own maximum, and one over `north.max_packet_bytes` is acknowledged
//! and reported rather than failing the connection (a broker redelivers an
//! unacknowledged message to a persistent session forever).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::clip::Clip;
use crate::config::NorthConfig;
use crate::ids::{DeviceId, Seq};
use crate::metrics::{self, Count};
pub use crate::mqtt::AckToken;
use crate::mqtt::{self, Announce, Event, Message, Reconnect, Session, Will};
use crate::protocol::control::{self, Status};
use crate::protocol::now_ms;
use crate::protocol::topics::Topics;

/// MQTT-level in-flight publishes (awaiting PUBACK) on the session.
const SESSION_INFLIGHT: u16 = 1024;

/// What a publish north is, so its fate can be told to its owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tag {
    Uplink {
        device: DeviceId,
        seq: Seq,
    },
    /// A message of receipts north, numbered by the downlink pipeline.
    Receipts(u64),
    /// An alert, numbered by [`crate::alerts`].
    Alert(u64),
}

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
        /// When it arrived (ms since the epoch): its `received` time in
        /// `ferry trace`.
        received_ms: i64,
    },
    /// The upstream dropped the link on this publish while it was alone in
    /// flight: a failed attempt.
    Refused(Tag),
    /// The upstream acknowledged this publish (reported for receipts and
    /// alerts only).
    Published(Tag),
}

/// Publishes north; cheap to clone.
#[derive(Clone)]
pub struct NorthSender {
    session: Session<Tag>,
    status: String,
}

impl NorthSender {
    /// The session's task answers `probed`'s pings (see [`crate::health`]).
    pub fn answer_probes(&self, probed: crate::health::Probed) {
        self.session.answer_probes(probed);
    }

    /// Queues a QoS 1 publish for the connection `epoch`, without waiting.
    /// False if the queue is full or closed: the caller keeps the message
    /// and tries again later.
    pub fn publish(&self, topic: String, body: Bytes, tag: Tag, epoch: u64) -> bool {
        self.session.publish(topic, body, false, tag, epoch)
    }

    /// The publish named by `token` may be acknowledged. Acks go out in
    /// receive order, and only on the connection the publish came on.
    pub fn ack(&self, token: AckToken) {
        self.session.ack(token);
    }

    /// Leaves cleanly: retained status `online: false` (a clean DISCONNECT
    /// does not fire the last will), then DISCONNECT, waiting at most
    /// `within` for it to be written.
    pub async fn go_offline(&self, within: Duration) {
        let farewell = Will {
            topic: self.status.clone(),
            payload: status_body(false),
            retain: true,
        };
        self.session.close(Some(farewell), within).await;
    }
}

/// Starts the session. Events arrive on the returned receiver.
pub fn start(cfg: &NorthConfig, topics: &Topics) -> (NorthSender, mpsc::Receiver<NorthEvent>) {
    let status = topics.north_status();
    let opts = mqtt::Options {
        name: "north".into(),
        endpoints: cfg.endpoints.clone(),
        prefer_first: cfg.prefer_first,
        client_id: cfg.client_id.clone(),
        credentials: cfg.credentials.clone(),
        keep_alive: cfg.keep_alive,
        clean_session: false,
        last_will: Some(Will {
            topic: status.clone(),
            payload: status_body(false),
            retain: true,
        }),
        // Read anything a broker can send (see the module doc); send only
        // what intake made sure fits.
        max_incoming_packet: mqtt::MQTT_MAX_PACKET,
        max_outgoing_packet: cfg.max_packet_bytes,
        max_message_bytes: cfg.max_packet_bytes,
        inflight: SESSION_INFLIGHT,
        subscriptions: vec![
            topics.north_ack(),
            topics.north_down_filter(),
            topics.north_down(),
        ],
        announce: Some(Announce {
            topic: status.clone(),
            body: Arc::new(|| status_body(true)),
        }),
        auto_ack: false,
        replay: false,
        reconnect: Reconnect::GATEWAY,
        transport: mqtt::Transport::from_config(cfg.tls.as_ref()),
    };
    let (session, events) = Session::start(opts);
    let (tx, rx) = mpsc::channel(4096);
    let router = Router {
        session: session.clone(),
        topics: topics.clone(),
        max_packet: cfg.max_packet_bytes,
        out: tx,
    };
    tokio::spawn(router.run(events));
    (NorthSender { session, status }, rx)
}

fn status_body(online: bool) -> Bytes {
    Bytes::from(control::to_bytes(&Status {
        online,
        ts: Some(now_ms()),
    }))
}

/// Turns the session's events into the pipelines' [`NorthEvent`]s.
struct Router {
    session: Session<Tag>,
    topics: Topics,
    max_packet: usize,
    out: mpsc::Sender<NorthEvent>,
}

impl Router {
    async fn run(self, mut events: mpsc::Receiver<Event<Tag>>) {
        while let Some(event) = events.recv().await {
            let routed = match event {
                Event::Up {
                    epoch, endpoint, ..
                } => {
                    crate::metrics::set_north_endpoint(Some(endpoint));
                    Some(NorthEvent::Up(epoch))
                }
                Event::Down => {
                    crate::metrics::set_north_endpoint(None);
                    Some(NorthEvent::Down)
                }
                Event::Published(tag @ (Tag::Receipts(_) | Tag::Alert(_))) => {
                    Some(NorthEvent::Published(tag))
                }
                Event::Published(Tag::Uplink { .. }) => None,
                Event::Refused(tag) => Some(NorthEvent::Refused(tag)),
                Event::Message(m) => self.route(m),
            };
            if let Some(event) = routed {
                if self.out.send(event).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Routes one incoming message. Uplink acks (and strays) are acked at
    /// once; a downlink waits for its commit. Either way, in receive order.
    fn route(&self, m: Message) -> Option<NorthEvent> {
        if let Some(size) = m.oversize {
            let total = metrics::count(Count::OversizedFromUpstream);
            warn!(event = "north_message_oversized", topic = %Clip(&m.topic), bytes = size, limit = self.max_packet, total, "north message over north.max_packet_bytes acknowledged and not processed");
        }
        if self.topics.is_north_down(&m.topic) {
            return Some(NorthEvent::Downlink {
                topic: m.topic,
                payload: m.payload,
                token: m.token,
                oversize: m.oversize,
                received_ms: now_ms(),
            });
        }
        self.session.ack(m.token);
        if m.topic == self.topics.north_ack() {
            return m.oversize.is_none().then_some(NorthEvent::Ack(m.payload));
        }
        debug!(topic = %Clip(&m.topic), "ignoring a north publish on an unknown topic");
        None
    }
}
