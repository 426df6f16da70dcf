//! The one MQTT session: every link ferry opens as a client (north, the
//! external south, the client library, tests and benchmarks) is a
//! [`Session`] over rumqttc. No other module polls rumqttc's event loop.
//!
//! rumqttc supplies the protocol; this module supplies what it lacks
//! (../shared/notes/RUMQTT.md):
//! - a reconnect backoff with jitter after every connection error, which
//!   keeps growing while connections die young ([`Reconnect`]);
//! - re-subscription on every ConnAck, and [`Event::Up`] only once the
//!   subscriptions are acknowledged (and the optional retained
//!   [`Options::announce`] is, so a drop is never blamed on it);
//! - manual acknowledgements sent in receive order, only on the connection
//!   the message came on ([`acks::OrderedAcks`]);
//! - tracked publishes: each is followed to its PUBACK by packet id, and
//!   the one an upstream drops the link on is found and reported
//!   ([`flow::Flow`], [`Event::Refused`]);
//! - typed events, and a poll that is never cancelled (`poll.rs`) but to
//!   cut a link that moves nothing: publishes outstanding and none
//!   acknowledged for [`Options::puback_timeout`] is a failure of that
//!   node like any other ([`Problem::Stalled`], `stall.rs`), so the next
//!   endpoint is tried and what was in flight is the owner's to send again
//!   there;
//! - several endpoints (a broker's nodes), one connected at a time: a
//!   failure moves to the next behind the same backoff, and with
//!   [`Options::prefer_first`] a working session on a later one is left
//!   cleanly for the first once it accepts again ([`endpoints::Endpoints`]).
//!   A move is a drop like any other to the owner: `Down`, then `Up` on the
//!   new node, with everything unacknowledged the owner's to send again;
//! - either protocol version ([`Options::version`]): MQTT 3.1.1, or MQTT 5
//!   through `rumqttc::v5` (`v5.rs`), normalised into the same events
//!   (`wire.rs`), so no owner knows which is underneath. What 5 adds is
//!   said in the owner's terms: a PUBACK reason code that refuses a
//!   tracked publish, or a publish larger than the broker's CONNACK
//!   allows, is [`Event::Refused`]; a SUBACK failure is a refused filter
//!   in [`Event::Up`]; a refused CONNACK is a failed connection whose log
//!   line names the reason code;
//! - every failed connection told as [`Event::Failed`], with what it says
//!   about the peer ([`failure::Problem`]: no MQTT broker, a refusal, a
//!   session another client with the same id took).
//!
//! Two ways to publish:
//! - [`Session::publish`]: tracked, made for one connection (`epoch`).
//!   What was not acknowledged when it dropped is the owner's to send
//!   again; rumqttc never replays it. For the gateway's own links.
//! - [`Session::send`]: fire and forget, replayed by rumqttc after a
//!   reconnect (with [`Options::replay`]). For clients that resend on their
//!   own protocol timers anyway, and for the external south's receipts and
//!   batches (the protocol repairs a lost one).
//!
//! A session uses one of the two, never both: tracking matches packet ids
//! to tracked publishes in the order rumqttc writes them.

pub mod acks;
#[cfg(test)]
pub(crate) mod by_hand;
pub mod endpoints;
pub mod failure;
pub mod flow;
mod link;
mod poll;
mod session;
mod stall;
mod v5;
mod wire;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, Notify};

pub use acks::AckToken;
pub use failure::{Failure, Problem};
pub use flow::{Outgoing, Tag};

pub use crate::config::{Endpoint, MqttVersion};
pub use crate::protocol::MQTT_MAX_PACKET;
/// An oversized message's head, kept so its owner can name it.
pub const OVERSIZE_HEAD: usize = 4096;

/// How to reach a broker and behave on the session.
#[derive(Clone)]
pub struct Options {
    /// Used in log lines: "north", "south", a client's id.
    pub name: String,
    /// The broker's nodes, in order of preference; never empty. One is
    /// connected at a time ([`endpoints::Endpoints`]).
    pub endpoints: Vec<Endpoint>,
    /// While on a later endpoint, check this often whether the first
    /// accepts again, and go back to it when it does (`None`: stay).
    pub prefer_first: Option<Duration>,
    pub client_id: String,
    /// The protocol level spoken: 3.1.1 (rumqttc's client) or 5
    /// (`rumqttc::v5`, `v5.rs`). The owner sees the same events either way.
    pub version: MqttVersion,
    /// Username and password.
    pub credentials: Option<(String, String)>,
    pub keep_alive: Duration,
    pub clean_session: bool,
    pub last_will: Option<Will>,
    /// Largest packet read; larger ones fail the connection. The session
    /// reads up to MQTT's maximum by default and reports larger messages
    /// than [`Options::max_message_bytes`] instead.
    pub max_incoming_packet: usize,
    /// Largest packet written.
    pub max_outgoing_packet: usize,
    /// A message whose topic and payload exceed this arrives with only its
    /// head and [`Message::oversize`] set.
    pub max_message_bytes: usize,
    /// MQTT-level publishes in flight (awaiting PUBACK).
    pub inflight: u16,
    /// Publishes outstanding and none of them acknowledged for this long
    /// (a received publish counts as progress too): the node takes the
    /// session but moves nothing, and the link fails there (`stall.rs`).
    /// `None`: wait for ever (clients, whose own protocol timers resend).
    pub puback_timeout: Option<Duration>,
    /// Filters subscribed (QoS 1) on every ConnAck.
    pub subscriptions: Vec<String>,
    /// Published retained (QoS 1) once subscribed; `Up` follows its PUBACK.
    pub announce: Option<Announce>,
    /// Acknowledge every incoming publish as it arrives (clients), instead
    /// of when its owner passes the token to [`Session::ack`]. Manual acks
    /// go out behind the [`Session::send`]s queued before them.
    pub auto_ack: bool,
    /// Let rumqttc replay unacknowledged [`Session::send`]s after a
    /// reconnect. Off for tracked sessions: their owners resend.
    pub replay: bool,
    pub reconnect: Reconnect,
    /// Plain TCP, or TLS.
    pub transport: Transport,
}

#[derive(Clone, Debug, Default)]
pub enum Transport {
    #[default]
    Tcp,
    /// TLS with this rustls config; each endpoint's certificate must name
    /// that endpoint's host (it is the SNI too).
    Tls(Arc<rustls::ClientConfig>),
}

impl Transport {
    /// TLS as `tls` says, or plain TCP when there is none.
    pub fn from_config(tls: Option<&crate::config::ClientTls>) -> Transport {
        tls.map_or(Transport::Tcp, |t| Transport::Tls(t.rustls()))
    }
}

#[derive(Clone, Debug)]
pub struct Will {
    pub topic: String,
    pub payload: Bytes,
    pub retain: bool,
}

/// A retained message published on every connection once subscribed.
#[derive(Clone)]
pub struct Announce {
    pub topic: String,
    /// Made afresh for each connection (it may carry a timestamp).
    pub body: Arc<dyn Fn() -> Bytes + Send + Sync>,
}

/// Reconnect delays: `base` doubling to `max`, with half of it jitter.
#[derive(Clone, Debug)]
pub struct Reconnect {
    pub base: Duration,
    pub max: Duration,
    /// A connection that lasted this long resets the backoff; one that
    /// died sooner (a broker that accepts and then drops us) does not.
    pub stable_after: Duration,
}

impl Reconnect {
    /// The gateway's own links (north, the external south): 200 ms
    /// doubling to 30 s, reset only by a connection that lasted 30 s.
    pub const GATEWAY: Reconnect = Reconnect {
        base: Duration::from_millis(200),
        max: Duration::from_secs(30),
        stable_after: Duration::from_secs(30),
    };

    /// The delay after `failures` consecutive failures (0 for the first).
    pub fn delay(&self, failures: u32) -> Duration {
        let cfg = crate::backoff::RetryConfig {
            base: self.base,
            max: self.max,
            max_attempts: 1,
            jitter: 0.5,
        };
        crate::backoff::delay_random(&cfg, failures)
    }
}

impl Options {
    /// A clean, auto-acking client session with client-friendly defaults.
    pub fn new(
        name: impl Into<String>,
        host: impl Into<String>,
        port: u16,
        client_id: impl Into<String>,
    ) -> Options {
        Options {
            name: name.into(),
            endpoints: vec![Endpoint::new(host, port)],
            prefer_first: None,
            client_id: client_id.into(),
            version: MqttVersion::V311,
            credentials: None,
            keep_alive: Duration::from_secs(30),
            clean_session: true,
            last_will: None,
            max_incoming_packet: MQTT_MAX_PACKET,
            max_outgoing_packet: 16 << 20,
            max_message_bytes: MQTT_MAX_PACKET,
            inflight: 200,
            puback_timeout: None,
            subscriptions: Vec::new(),
            announce: None,
            auto_ack: true,
            replay: true,
            reconnect: Reconnect {
                base: Duration::from_millis(100),
                max: Duration::from_secs(10),
                stable_after: Duration::ZERO,
            },
            transport: Transport::Tcp,
        }
    }
}

/// What the session tells its owner.
#[derive(Debug)]
pub enum Event<T> {
    /// Connected and subscribed (and announced); `epoch` counts
    /// connections, `endpoint` is the place in [`Options::endpoints`] of
    /// the node connected to. `refused` lists filters the broker would not
    /// grant.
    Up {
        epoch: u64,
        endpoint: usize,
        session_present: bool,
        refused: Vec<String>,
    },
    /// The connection that was `Up` broke; nothing tracked and not
    /// reported `Published` is known to have arrived.
    Down,
    /// A connection attempt failed, or a connection broke (after `Down`
    /// if it was up): which node, and what it says about it.
    Failed(Failure),
    Message(Message),
    /// The broker acknowledged this tracked publish.
    Published(T),
    /// The broker dropped the link on this tracked publish while it was
    /// alone in flight, or (MQTT 5) refused it with a PUBACK reason code,
    /// or it is larger than the broker takes: count it as a failed attempt.
    Refused(T),
}

/// One incoming publish.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: String,
    pub payload: Bytes,
    pub retain: bool,
    /// Pass to [`Session::ack`] once done (ignored with `auto_ack`).
    pub token: AckToken,
    /// Its real size, when only its head is in `payload`.
    pub oversize: Option<usize>,
}

/// The owner's handle; cheap to clone. Dropping every handle and the event
/// receiver ends the session.
pub struct Session<T> {
    client: wire::Client,
    publishes: mpsc::Sender<Outgoing<T>>,
    commands: mpsc::UnboundedSender<session::Command>,
    closed: Arc<Notify>,
    /// The largest publish the connection takes (see `session/outgoing.rs`).
    max_packet: Arc<AtomicUsize>,
}

impl<T> Clone for Session<T> {
    fn clone(&self) -> Self {
        Session {
            client: self.client.clone(),
            publishes: self.publishes.clone(),
            commands: self.commands.clone(),
            closed: self.closed.clone(),
            max_packet: self.max_packet.clone(),
        }
    }
}

/// Publishes the owner may queue for the session.
pub const PUBLISH_QUEUE: usize = 16_384;

impl<T: Tag> Session<T> {
    /// Starts the session's tasks; its events arrive on the receiver.
    pub fn start(opts: Options) -> (Session<T>, mpsc::Receiver<Event<T>>) {
        session::start(opts)
    }

    /// Queues a tracked QoS 1 publish for connection `epoch`, without
    /// waiting. False if the queue is full or closed: the caller keeps the
    /// message and tries again later.
    pub fn publish(&self, topic: String, body: Bytes, retain: bool, tag: T, epoch: u64) -> bool {
        self.publishes
            .try_send(Outgoing {
                topic,
                body,
                retain,
                tag,
                epoch,
            })
            .is_ok()
    }

    /// Fire-and-forget QoS 1 publish (see the module doc). False if
    /// rumqttc's request queue is full. One larger than an MQTT 5 broker
    /// takes is dropped here, with a warning (rumqttc would fail the
    /// connection on it, and replay it after every reconnect).
    pub fn send(&self, topic: impl Into<String>, body: impl Into<Vec<u8>>, retain: bool) -> bool {
        let (topic, body) = (topic.into(), body.into());
        if self.too_large(&topic, &body) {
            return true;
        }
        self.client.try_publish(topic, retain, body)
    }

    /// Like [`Session::send`], waiting for room in the request queue.
    pub async fn send_wait(
        &self,
        topic: impl Into<String>,
        body: impl Into<Vec<u8>>,
        retain: bool,
    ) -> bool {
        let (topic, body) = (topic.into(), body.into());
        if self.too_large(&topic, &body) {
            return true;
        }
        self.client.publish(topic, retain, body).await
    }

    /// Whether a publish is larger than the connection takes (then logged).
    fn too_large(&self, topic: &str, body: &[u8]) -> bool {
        let limit = self.max_packet.load(Ordering::Relaxed);
        if limit == usize::MAX {
            return false;
        }
        let size = v5::publish_size(topic, body.len());
        if size <= limit {
            return false;
        }
        tracing::warn!(event = "link_publish_refused", topic = %crate::clip::Clip(topic), reason = "packet_too_large", size, limit, "a publish larger than the broker takes (its MQTT 5 maximum packet size) was dropped");
        true
    }

    /// The message named by `token` may be acknowledged: in receive order,
    /// on its own connection only.
    pub fn ack(&self, token: AckToken) {
        let _ = self.commands.send(session::Command::Ack(token));
    }

    /// The session's task answers the pings of `probed` from its loop (see
    /// [`crate::health`]) while its poller is alive: polled within three
    /// keep-alives while connected (rumqttc's own PINGREQ and PINGRESP are
    /// events too), or reconnecting.
    pub fn answer_probes(&self, probed: crate::health::Probed) {
        let _ = self.commands.send(session::Command::Probed(probed));
    }

    /// Leaves cleanly: `farewell` first (a clean DISCONNECT does not fire
    /// the last will, so a retained status says it instead), then
    /// DISCONNECT, waiting at most `within` for it to be written.
    pub async fn close(&self, farewell: Option<Will>, within: Duration) {
        let closed = self.closed.notified();
        if self
            .commands
            .send(session::Command::Close(farewell))
            .is_ok()
        {
            let _ = tokio::time::timeout(within, closed).await;
        }
    }
}
