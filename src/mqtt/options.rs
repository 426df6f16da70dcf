//! What a session is made of and tells: its [`Options`] (with the
//! [`Transport`], [`Will`], [`Announce`] and [`Reconnect`] in them), the
//! [`Event`]s its owner gets and the [`Message`]s among them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::acks::AckToken;
use super::failure::Failure;
use crate::config::{Endpoint, MqttVersion};
use crate::protocol::MQTT_MAX_PACKET;

/// An oversized message's head, kept so its owner can name it.
pub const OVERSIZE_HEAD: usize = 4096;

/// How to reach a broker and behave on the session.
#[derive(Clone)]
pub struct Options {
    /// Used in log lines: "north", "south", a client's id.
    pub name: String,
    /// The broker's nodes, in order of preference; never empty. One is
    /// connected at a time ([`super::endpoints::Endpoints`]).
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
    /// of when its owner passes the token to [`super::Session::ack`].
    /// Manual acks go out behind the [`super::Session::send`]s queued
    /// before them.
    pub auto_ack: bool,
    /// Let rumqttc replay unacknowledged [`super::Session::send`]s after a
    /// reconnect. Off for tracked sessions: their owners resend.
    pub replay: bool,
    pub reconnect: Reconnect,
    /// Plain TCP, or TLS.
    pub transport: Transport,
}

/// How to reach the broker, changed while the session runs
/// ([`crate::mqtt::Session::reach`]): its nodes, login, keep-alive, stall
/// bound and transport. The next connection is made with them; the one
/// up now stays, unless its node is no longer among `endpoints`.
#[derive(Clone)]
pub struct Reach {
    pub endpoints: Vec<Endpoint>,
    pub prefer_first: Option<Duration>,
    pub credentials: Option<(String, String)>,
    pub keep_alive: Duration,
    pub puback_timeout: Option<Duration>,
    pub transport: Transport,
}

impl Reach {
    /// Puts these into `opts`.
    pub fn apply(self, opts: &mut Options) {
        opts.endpoints = self.endpoints;
        opts.prefer_first = self.prefer_first;
        opts.credentials = self.credentials;
        opts.keep_alive = self.keep_alive;
        opts.puback_timeout = self.puback_timeout;
        opts.transport = self.transport;
    }
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
        /// That node.
        node: Endpoint,
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
    /// Pass to [`super::Session::ack`] once done (ignored with `auto_ack`).
    pub token: AckToken,
    /// Its real size, when only its head is in `payload`.
    pub oversize: Option<usize>,
}

/// Publishes the owner may queue for the session.
pub const PUBLISH_QUEUE: usize = 16_384;
