//! The north side: one persistent session to the upstream broker, on
//! [`crate::mqtt`].
//!
//! What north adds to the session: its subscriptions (`{prefix}/ack`, the
//! downlink topics, a Sparkplug primary host's STATE: [`host`]), the retained `{prefix}/status` — `online: true` only
//! once the subscriptions are acknowledged, `online: false` as the last will
//! and on a clean leave — and the routing of what arrives into
//! a typed receiver per consumer ([`NorthEvents`]).
//!
//! The session goes to one of `north.endpoints` at a time (see
//! [`crate::mqtt::endpoints`]); the subscriptions and the status announce
//! are made on every connection, so on every node. The gauge
//! `ferry_north_endpoint_index` follows `Up` and `Down`; the status file
//! gets the node, and each failure in words ([`failure`]: not an MQTT
//! broker, a refusal, a second gateway with the same id).
//!
//! Each consumer learns of the link through [`Link::Up`]`(epoch)` and
//! [`Link::Down`]. Every
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

pub mod failure;
mod host;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::clip::Clip;
use crate::config::NorthConfig;
use crate::ids::{DeviceId, Seq};
use crate::metrics::{self, Count};
pub use crate::mqtt::AckToken;
use crate::mqtt::{self, Announce, Event, Message, Problem, Reconnect, Session, Will};
use crate::protocol::control::{self, Status};
use crate::protocol::now_ms;
use crate::protocol::topics::Topics;
use crate::status_file::{LiveEvent, LiveSender};

/// MQTT-level in-flight publishes (awaiting PUBACK) on the session.
const SESSION_INFLIGHT: u16 = 1024;

/// What a publish north is, so its fate can be told to its owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Tag {
    Uplink {
        device: DeviceId,
        seq: Seq,
    },
    /// A batch of uplinks (`north.batch_max` > 1), in the order of its
    /// array.
    Uplinks(Vec<(DeviceId, Seq)>),
    /// A message of receipts north, numbered by the downlink pipeline.
    Receipts(u64),
    /// An alert, numbered by its sender.
    Alert(u64),
}

/// The north link as each consumer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Connected and subscribed; `epoch` counts connections.
    Up(u64),
    /// The connection broke; nothing sent before and not reported
    /// published is known to have arrived.
    Down,
}

/// What the uplink pipeline hears from north.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UplinkEvent {
    Link(Link),
    /// A backend ack message (`{prefix}/ack`), already PUBACKed.
    Ack(Bytes),
    /// The upstream dropped the link on this uplink while it was alone in
    /// flight: a failed attempt.
    Refused {
        device: DeviceId,
        seq: Seq,
    },
    /// The same, for a batch of uplinks: a failed attempt for each.
    RefusedBatch(Vec<(DeviceId, Seq)>),
    /// Sparkplug uplinks are held (true: the primary host followed is not
    /// online) or sent again (false). Told before the `Link::Up` it
    /// concerns.
    SparkplugHold(bool),
}

/// A downlink envelope. It is PUBACKed only when `token` is passed to
/// [`NorthSender::ack`], which the pipeline does after its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downlink {
    pub topic: String,
    pub payload: Bytes,
    pub token: AckToken,
    /// Its real size, when only its head is in `payload` (it was over
    /// `north.max_packet_bytes`).
    pub oversize: Option<usize>,
    /// When it arrived (ms since the epoch): its `received` time in
    /// `ferry trace`.
    pub received_ms: i64,
}

/// What the downlink pipeline hears from north; a message of receipts is
/// named by its [`Tag::Receipts`] number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownlinkEvent {
    Link(Link),
    Downlink(Downlink),
    /// The upstream acknowledged this message of receipts.
    Published(u64),
    /// The upstream dropped the link on it while it was alone in flight.
    Refused(u64),
}

/// What the alerts task hears from north; an alert is named by its
/// [`Tag::Alert`] number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlertEvent {
    Link(Link),
    Published(u64),
    Refused(u64),
}

/// Each consumer's receiver of what north hears. The uplink and downlink
/// receivers are waited on (north reads no further while one is full); the
/// alerts one only gets what fits (it is told of the link again at the
/// next change). North stops reading once both pipelines' receivers are
/// dropped.
pub struct NorthEvents {
    pub uplink: mpsc::Receiver<UplinkEvent>,
    pub downlink: mpsc::Receiver<DownlinkEvent>,
    pub alerts: mpsc::Receiver<AlertEvent>,
    /// Whether a Sparkplug uplink stored now goes north at once (the link
    /// is up, and the primary host followed, if any, online).
    pub sparkplug_live: tokio::sync::watch::Receiver<bool>,
}

/// Events queued per consumer.
const EVENTS_QUEUED: usize = 4096;

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

/// Starts the session of gateway `gateway`. What arrives is routed to the
/// returned receivers; the link's changes are also written to the status
/// file.
pub fn start(
    cfg: &NorthConfig,
    gateway: &str,
    topics: &Topics,
    status_file: LiveSender,
    reload: Option<watch::Receiver<NorthConfig>>,
) -> (NorthSender, NorthEvents) {
    let status = topics.north_status();
    let (host, sparkplug_live) = host::Host::new(topics.sparkplug());
    let mqtt::Reach {
        endpoints,
        prefer_first,
        credentials,
        keep_alive,
        puback_timeout,
        transport,
    } = reach(cfg);
    let opts = mqtt::Options {
        name: "north".into(),
        endpoints,
        prefer_first,
        client_id: cfg.client_id.clone(),
        version: cfg.mqtt_version,
        credentials,
        keep_alive,
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
        puback_timeout,
        subscriptions: [
            topics.north_ack(),
            topics.north_down_filter(),
            topics.north_down(),
        ]
        .into_iter()
        .chain(host.subscription())
        .collect(),
        announce: Some(Announce {
            topic: status.clone(),
            body: Arc::new(|| status_body(true)),
        }),
        auto_ack: false,
        replay: false,
        reconnect: Reconnect::GATEWAY,
        transport,
    };
    let (session, events) = Session::start(opts);
    let (uplink_tx, uplink) = mpsc::channel(EVENTS_QUEUED);
    let (downlink_tx, downlink) = mpsc::channel(EVENTS_QUEUED);
    let (alerts_tx, alerts) = mpsc::channel(EVENTS_QUEUED);
    let router = Router {
        session: session.clone(),
        topics: topics.clone(),
        max_packet: cfg.max_packet_bytes,
        uplink: uplink_tx,
        downlink: downlink_tx,
        alerts: alerts_tx,
        status_file,
        reload,
        client_id: cfg.client_id.clone(),
        gateway: gateway.to_string(),
        logged: None,
        host,
    };
    tokio::spawn(router.run(events));
    let events = NorthEvents {
        uplink,
        downlink,
        alerts,
        sparkplug_live,
    };
    (NorthSender { session, status }, events)
}

/// How `cfg` says to reach the upstream: what `systemctl reload` may
/// change on the running session (the client id, protocol version and
/// packet sizes take a restart).
pub fn reach(cfg: &NorthConfig) -> mqtt::Reach {
    mqtt::Reach {
        endpoints: cfg.endpoints.clone(),
        prefer_first: cfg.prefer_first,
        credentials: cfg.credentials.clone(),
        keep_alive: cfg.keep_alive,
        puback_timeout: Some(cfg.puback_timeout),
        transport: mqtt::Transport::from_config(cfg.tls.as_ref()),
    }
}

fn status_body(online: bool) -> Bytes {
    Bytes::from(control::to_bytes(&Status {
        online,
        ts: Some(now_ms()),
    }))
}

/// Routes the session's events to their consumers.
struct Router {
    session: Session<Tag>,
    topics: Topics,
    max_packet: usize,
    uplink: mpsc::Sender<UplinkEvent>,
    downlink: mpsc::Sender<DownlinkEvent>,
    alerts: mpsc::Sender<AlertEvent>,
    status_file: LiveSender,
    /// `systemctl reload`: how to reach the upstream now.
    reload: Option<watch::Receiver<NorthConfig>>,
    client_id: String,
    gateway: String,
    /// The last failure's event logged (another is logged at once, a
    /// repeat as the session's `link_down` is: the first three, then at
    /// powers of two).
    logged: Option<&'static str>,
    /// The Sparkplug primary host followed, if any.
    host: host::Host,
}

impl Router {
    async fn run(mut self, mut events: mpsc::Receiver<Event<Tag>>) {
        loop {
            let event = tokio::select! {
                event = events.recv() => match event {
                    Some(event) => event,
                    None => return,
                },
                cfg = crate::live::next(&mut self.reload) => {
                    self.session.reach(reach(&cfg));
                    continue;
                }
            };
            match event {
                Event::Up {
                    epoch,
                    endpoint,
                    node,
                    ..
                } => {
                    crate::metrics::set_north_endpoint(Some(endpoint));
                    let _ = self.status_file.send(LiveEvent::NorthUp(node.to_string()));
                    self.link(Link::Up(epoch)).await;
                }
                Event::Down => {
                    crate::metrics::set_north_endpoint(None);
                    self.link(Link::Down).await;
                }
                Event::Published(Tag::Receipts(id)) => {
                    let _ = self.downlink.send(DownlinkEvent::Published(id)).await;
                }
                Event::Refused(Tag::Receipts(id)) => {
                    let _ = self.downlink.send(DownlinkEvent::Refused(id)).await;
                }
                Event::Published(Tag::Alert(id)) => {
                    let _ = self.alerts.try_send(AlertEvent::Published(id));
                }
                Event::Refused(Tag::Alert(id)) => {
                    let _ = self.alerts.try_send(AlertEvent::Refused(id));
                }
                Event::Published(Tag::Uplink { .. } | Tag::Uplinks(_)) => {}
                Event::Refused(Tag::Uplinks(batch)) => {
                    let _ = self.uplink.send(UplinkEvent::RefusedBatch(batch)).await;
                }
                Event::Refused(Tag::Uplink { device, seq }) => {
                    let _ = self.uplink.send(UplinkEvent::Refused { device, seq }).await;
                }
                Event::Failed(f) => self.failed(&f),
                Event::Message(m) => self.route(m).await,
            }
            if self.uplink.is_closed() && self.downlink.is_closed() {
                return;
            }
        }
    }

    /// A connection failed: the status file gets what it means, and the
    /// log too when it is new or the session's own line would be written
    /// (the first failures of an outage, then at powers of two); a failure
    /// with nothing to add (`Problem::Other`) is the session's line alone.
    fn failed(&mut self, f: &mqtt::Failure) {
        let text = failure::explain(f, &self.client_id, &self.gateway);
        let _ = self.status_file.send(LiveEvent::NorthFailed {
            endpoint: f.endpoint.to_string(),
            error: text.clone(),
        });
        let Some(event) = failure::event(&f.problem) else {
            return;
        };
        if self.logged == Some(event) && f.failures > 3 && !f.failures.is_power_of_two() {
            return;
        }
        self.logged = Some(event);
        let (endpoint, client_id, error, failures) = (
            &f.endpoint,
            Clip(&self.client_id),
            Clip(&f.error),
            f.failures,
        );
        match f.problem {
            Problem::NotMqtt { .. } => {
                warn!(event = "north_not_mqtt_broker", %endpoint, %client_id, %error, failures, "{text}")
            }
            Problem::Refused(reason) => {
                warn!(event = "north_connect_refused", %endpoint, %client_id, reason, %error, failures, "{text}")
            }
            Problem::Closed { after, times } => {
                warn!(event = "north_closed_by_broker", %endpoint, %client_id, after_ms = after.as_millis() as u64, times, %error, failures, "{text}")
            }
            Problem::SessionTaken => {
                warn!(event = "north_session_taken", %endpoint, %client_id, gateway = %self.gateway, %error, failures, "{text}")
            }
            Problem::NotListening | Problem::Stalled { .. } | Problem::Other => {}
        }
    }

    /// Tells every consumer (and the status file) of the link.
    async fn link(&mut self, link: Link) {
        if link == Link::Down {
            let _ = self.status_file.send(LiveEvent::NorthDown);
        }
        if let Some(held) = self.host.on_link(matches!(link, Link::Up(_))) {
            let _ = self.uplink.send(UplinkEvent::SparkplugHold(held)).await;
        }
        let _ = self.alerts.try_send(AlertEvent::Link(link));
        let _ = self.uplink.send(UplinkEvent::Link(link)).await;
        let _ = self.downlink.send(DownlinkEvent::Link(link)).await;
    }

    /// Routes one incoming message. Uplink acks (and strays) are acked at
    /// once; a downlink waits for its commit. Either way, in receive order.
    async fn route(&mut self, m: Message) {
        if let Some(size) = m.oversize {
            let total = metrics::count(Count::OversizedFromUpstream);
            warn!(event = "north_message_oversized", topic = %Clip(&m.topic), bytes = size, limit = self.max_packet, total, "north message over north.max_packet_bytes acknowledged and not processed");
        }
        if self.topics.is_north_down(&m.topic) {
            let downlink = Downlink {
                topic: m.topic,
                payload: m.payload,
                token: m.token,
                oversize: m.oversize,
                received_ms: now_ms(),
            };
            let _ = self.downlink.send(DownlinkEvent::Downlink(downlink)).await;
            return;
        }
        self.session.ack(m.token);
        if self.host.is_state(&m.topic) {
            if let Some(held) = self.host.on_state(&m.payload) {
                let _ = self.uplink.send(UplinkEvent::SparkplugHold(held)).await;
            }
            return;
        }
        if m.topic == self.topics.north_ack() {
            if m.oversize.is_none() {
                let _ = self.uplink.send(UplinkEvent::Ack(m.payload)).await;
            }
            return;
        }
        debug!(topic = %Clip(&m.topic), "ignoring a north publish on an unknown topic");
    }
}
