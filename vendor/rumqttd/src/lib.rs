// ferry: ferry's fork of rumqttd 0.20.0 (the patches: ../README.md).
// Compiler warnings are on for all of it (what upstream left unused is
// gone), and clippy checks it with ferry's; only these lints of upstream's
// design stay allowed crate-wide: changing them would rewrite upstream's
// types and blur the diff the patches are read against.
#![allow(
    clippy::result_large_err,
    clippy::large_enum_variant,
    clippy::too_many_arguments
)]
use std::fmt;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::{collections::HashMap, path::Path};

use serde::{Deserialize, Serialize};
use tracing_subscriber::{
    filter::EnvFilter,
    fmt::{
        format::{Format, Pretty},
        Layer,
    },
    layer::Layered,
    reload::Handle,
    Registry,
};

pub use link::alerts;
pub use link::direct::{Acker, DevicePublish, PublishSink};
pub use link::local;
pub use link::meters;
pub use router::{
    Alert, ClientEvent, DirectPublish, Forward, IncomingMeter, Meter, Notification, OutgoingMeter,
    Router,
};
use segments::Storage;
#[cfg(feature = "use-rustls")]
pub use server::reload_tls;
pub use server::{Broker, LinkType, Server};

pub use self::router::shared_subs::Strategy;

mod link;
pub mod protocol;
pub mod refusals;
mod router;
mod segments;
mod server;

pub type ConnectionId = usize;
pub type RouterId = usize;
pub type NodeId = usize;
pub type Topic = String;
pub type Filter = String;
pub type TopicId = usize;
pub type Offset = (u64, u64);
pub type Cursor = (u64, u64);

pub type ClientId = String;
pub type AuthUser = String;
pub type AuthPass = String;
pub type AuthHandler = Arc<
    dyn Fn(ClientId, AuthUser, AuthPass) -> Pin<Box<dyn std::future::Future<Output = bool> + Send>>
        + Send
        + Sync,
>;

/// ferry: what clients did wrong, counted, for the gateway's metrics.
pub mod counters {
    use std::sync::atomic::AtomicU64;

    /// SUBSCRIBE filters refused: past `max_subscriptions`, or not the
    /// client's own topic under isolation.
    pub static SUBSCRIPTIONS_REFUSED: AtomicU64 = AtomicU64::new(0);
    /// Connections closed for a protocol violation: a malformed packet,
    /// before or after the CONNECT.
    pub static PROTOCOL_VIOLATIONS: AtomicU64 = AtomicU64::new(0);
    /// TLS handshakes that failed, a refused client certificate included.
    pub static TLS_HANDSHAKES_FAILED: AtomicU64 = AtomicU64::new(0);
    /// CONNECTs refused because the client id is not the certificate's CN.
    pub static CERTIFICATE_ID_REFUSED: AtomicU64 = AtomicU64::new(0);
    /// CONNECTs refused because their will is on a topic the client may
    /// not publish on.
    pub static WILLS_REFUSED: AtomicU64 = AtomicU64::new(0);
    /// CONNECTs refused because the client id is longer than
    /// `max_client_id_len`, or the whole CONNECT over the size limit.
    pub static CLIENT_IDS_REFUSED: AtomicU64 = AtomicU64::new(0);
    /// CONNECTs refused because the broker had no room
    /// (`max_connections`).
    pub static CONNECTIONS_FULL: AtomicU64 = AtomicU64::new(0);
    /// Deliveries not sent because they were over the client's maximum
    /// packet size (MQTT 5).
    pub static DIRECT_TOO_LARGE: AtomicU64 = AtomicU64::new(0);
    /// CONNECTs accepted, by protocol level: MQTT 3.1, 3.1.1 and 5.
    pub static CONNECTS_V31: AtomicU64 = AtomicU64::new(0);
    pub static CONNECTS_V311: AtomicU64 = AtomicU64::new(0);
    pub static CONNECTS_V5: AtomicU64 = AtomicU64::new(0);
    /// Deliveries a full session left out (the protocol repairs them).
    pub static SESSION_MESSAGES_DROPPED: AtomicU64 = AtomicU64::new(0);
    /// Deliveries left out because all sessions together held
    /// `RouterConfig::max_session_bytes` (the protocol repairs them).
    pub static SESSION_MESSAGES_OVER_BUDGET: AtomicU64 = AtomicU64::new(0);
    /// What the messages kept in sessions cost in memory now, bytes (a
    /// gauge; see `router/sessions.rs`).
    pub static SESSION_BYTES: AtomicU64 = AtomicU64::new(0);
}

/// ferry: what a connect hook is told about a CONNECT (see
/// [`ConnectionSettings::connect_hook`]).
#[derive(Debug, Clone)]
pub struct ConnectInfo {
    pub client_id: String,
    /// `None` when the CONNECT carried no username (or no login at all).
    pub username: Option<String>,
    pub password: Option<String>,
    /// The address the connection came from.
    pub peer: std::net::SocketAddr,
}

/// ferry: decides whether a CONNECT is accepted; `Err(code)` refuses it
/// with a CONNACK carrying `code` before the connection is closed.
pub type ConnectHook = Arc<
    dyn Fn(
            ConnectInfo,
        ) -> Pin<
            Box<dyn std::future::Future<Output = Result<(), protocol::ConnectReturnCode>> + Send>,
        > + Send
        + Sync,
>;

/// ferry: whether client `client_id` may publish on `topic` beyond its own
/// device topics under isolation (see [`ConnectionSettings::also_publish`]).
pub type PublishHook = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

#[derive(Debug, Default, Serialize, Deserialize, Clone)]
pub struct Config {
    pub id: usize,
    pub router: RouterConfig,
    pub v4: Option<HashMap<String, ServerSettings>>,
    pub v5: Option<HashMap<String, ServerSettings>>,
    pub ws: Option<HashMap<String, ServerSettings>>,
    pub cluster: Option<ClusterSettings>,
    pub console: Option<ConsoleSettings>,
    pub bridge: Option<BridgeConfig>,
    pub prometheus: Option<PrometheusSetting>,
    pub metrics: Option<HashMap<MetricType, MetricSettings>>,
}

#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct PrometheusSetting {
    #[deprecated(note = "Use listen instead")]
    port: Option<u16>,
    listen: Option<SocketAddr>,
    // How frequently to update metrics
    interval: u64,
}

// TODO: Change names without _ until config-rs issue is resolved
// https://github.com/mehcode/config-rs/issues/369
#[derive(Debug, Serialize, Deserialize, Clone)]
#[serde(untagged)]
pub enum TlsConfig {
    Rustls {
        /// ferry: with `verify-client-cert`, `None` serves TLS without
        /// client certificates (upstream refuses to start); `Some` requires
        /// and verifies one against every certificate in this file.
        capath: Option<String>,
        certpath: String,
        keypath: String,
        /// ferry: certificate revocation lists (PEM) a client certificate
        /// is checked against; needs `capath`.
        #[serde(default)]
        crlpath: Option<String>,
        /// ferry: a client certificate's subject CN is the client's id: the
        /// CONNECT must carry exactly that id (see [`valid_cert_client_id`])
        /// or it is refused with CONNACK "not authorized". Its O is not
        /// used as a tenant (no tenant prefix on client ids or topics).
        /// `false` keeps upstream's behaviour.
        #[serde(default)]
        cn_is_client_id: bool,
    },
    NativeTls {
        pkcs12path: String,
        pkcs12pass: String,
    },
}

impl TlsConfig {
    // Returns true only if all of the file paths inside `TlsConfig` actually exists on file system.
    // NOTE: This doesn't verify if certificate files are in required format or not.
    pub fn validate_paths(&self) -> bool {
        match self {
            TlsConfig::Rustls {
                capath,
                certpath,
                keypath,
                crlpath,
                ..
            } => {
                let exists =
                    |p: &Option<String>| p.as_ref().map_or(true, |v| Path::new(v).exists());
                exists(capath)
                    && exists(crlpath)
                    && [certpath, keypath].iter().all(|v| Path::new(v).exists())
            }
            TlsConfig::NativeTls { pkcs12path, .. } => Path::new(pkcs12path).exists(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct ServerSettings {
    pub name: String,
    pub listen: SocketAddr,
    pub tls: Option<TlsConfig>,
    pub next_connection_delay_ms: u64,
    pub connections: ConnectionSettings,
}

impl ServerSettings {
    pub fn set_auth_handler<F, O>(&mut self, auth_fn: F)
    where
        F: Fn(ClientId, AuthUser, AuthPass) -> O + Send + Sync + 'static,
        O: IntoFuture<Output = bool> + 'static,
        O::IntoFuture: Send,
    {
        self.connections.set_auth_handler(auth_fn)
    }
}

#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct BridgeConfig {
    pub name: String,
    pub addr: String,
    pub qos: u8,
    pub sub_path: Filter,
    pub reconnection_delay: u64,
    pub ping_delay: u64,
    pub connections: ConnectionSettings,
    #[serde(default)]
    pub transport: Transport,
}

#[derive(Serialize, Deserialize, Clone)]
pub struct ConnectionSettings {
    pub connection_timeout_ms: u16,
    pub max_payload_size: usize,
    pub max_inflight_count: usize,
    pub auth: Option<HashMap<String, String>>,
    #[serde(skip)]
    pub external_auth: Option<AuthHandler>,
    #[serde(default)]
    pub dynamic_filters: bool,
    /// ferry: the longest keep-alive honoured, in seconds; a client asking
    /// for more, or for none (0, which is then accepted), is treated as
    /// asking for this. 0 keeps upstream's behaviour (keep-alive 0 refused).
    #[serde(default)]
    pub max_keep_alive: u16,
    /// ferry: a PUBLISH over `max_payload_size` is skipped on the wire
    /// instead of failing the connection, and handed on with only the first
    /// `oversize_head` bytes of its payload and a `ferry-oversize` user
    /// property giving its real size. 0 keeps upstream's behaviour.
    #[serde(default)]
    pub oversize_head: usize,
    /// ferry: per-client topic isolation under this prefix. A client with
    /// id X may publish only on `{prefix}/X/up[/...]`, `confirm`, `pull`,
    /// `read`, `nack` and `status`; any other publish is not routed where it
    /// was sent but handed to [`QUARANTINE_TOPIC`] with the publisher and
    /// the topic it used as user properties. `None` keeps upstream's
    /// behaviour.
    #[serde(default)]
    pub isolation: Option<String>,
    /// ferry: under isolation, the topics beyond its own device topics a
    /// client may publish on (and put its will on), as the hook decides:
    /// the gateway's plain devices' topics. `None`: only its own.
    #[serde(skip)]
    pub also_publish: Option<PublishHook>,
    /// ferry: when set, decides every CONNECT (after the static `auth` and
    /// `external_auth`, which ferry leaves unset): a refusal is answered
    /// with a CONNACK carrying the hook's return code, then the connection
    /// is closed. Unlike `external_auth` it is told the peer's address and
    /// can choose the code.
    #[serde(skip)]
    pub connect_hook: Option<ConnectHook>,
    /// ferry: longest client id accepted, in bytes; a longer one gets
    /// CONNACK 2 (identifier rejected), as does a CONNECT over
    /// `max_payload_size` whose client id is longer. 0 = no limit.
    #[serde(default)]
    pub max_client_id_len: usize,
    /// ferry: the longest session a client may keep past its connection,
    /// in seconds (MQTT 5's session expiry is held to it; a 3.1.1 client
    /// without a clean session gets it). 0 keeps no sessions.
    #[serde(default)]
    pub max_session_expiry: u32,
    /// ferry: the most topic aliases (MQTT 5) a client may set, resolved
    /// per connection before isolation sees the publish (`link::properties`).
    #[serde(default)]
    pub topic_alias_max: u16,
    /// ferry: when set, every PUBLISH a client sends (after its topic
    /// aliases are resolved and isolation has looked at it) goes here
    /// from the connection's own task, never to the router, and its PUBACK
    /// (PUBREC) waits for the gateway's ack (`link::direct`). A PUBREL is
    /// answered by the connection, in turn.
    #[serde(skip)]
    pub publish_sink: Option<PublishSink>,
    /// ferry: on a websocket listener, the one path MQTT is served on
    /// (e.g. `/mqtt`); a handshake for another path is answered 404.
    /// `None`: any path.
    #[serde(default)]
    pub ws_path: Option<String>,
}

/// ferry: where a publish outside its client's own topics goes instead
/// (see [`ConnectionSettings::isolation`]); only a local link may
/// subscribe to it.
pub const QUARANTINE_TOPIC: &str = "ferry-quarantine";
/// ferry: the user property naming a quarantined publish's client id.
pub const PUBLISHER_PROPERTY: &str = "ferry-publisher";
/// ferry: the user property giving a quarantined publish's own topic.
pub const TOPIC_PROPERTY: &str = "ferry-topic";

/// ferry: whether client `client_id` may publish on `topic` under
/// isolation `prefix` and the gateway's `also` hook: on its own device
/// topics, or where the hook says.
pub fn may_publish(prefix: &str, also: Option<&PublishHook>, client_id: &str, topic: &str) -> bool {
    own_publish_topic(prefix, client_id, topic) || also.is_some_and(|h| h(client_id, topic))
}

/// ferry: whether client `client_id` may publish on `topic` under
/// isolation `prefix`: only on its own device topics.
pub fn own_publish_topic(prefix: &str, client_id: &str, topic: &str) -> bool {
    let Some(rest) = topic
        .strip_prefix(prefix)
        .and_then(|t| t.strip_prefix('/'))
        .and_then(|t| t.strip_prefix(client_id))
        .and_then(|t| t.strip_prefix('/'))
    else {
        return false;
    };
    rest == "up"
        || rest.starts_with("up/")
        || matches!(rest, "confirm" | "pull" | "read" | "nack" | "status")
}

/// ferry: whether a client certificate's CN can be a client id (see
/// [`TlsConfig::Rustls`]'s `cn_is_client_id`): 1 to 64 of `A-Z a-z 0-9 . _ -`,
/// ferry's device id, so it is one topic level and never a wildcard.
pub fn valid_cert_client_id(cn: &str) -> bool {
    (1..=64).contains(&cn.len())
        && cn
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// ferry: whether client `client_id` may subscribe to `filter` under
/// isolation `prefix`: only to its own `ack` and `inbox`.
pub fn own_subscribe_filter(prefix: &str, client_id: &str, filter: &str) -> bool {
    filter
        .strip_prefix(prefix)
        .and_then(|t| t.strip_prefix('/'))
        .and_then(|t| t.strip_prefix(client_id))
        .and_then(|t| t.strip_prefix('/'))
        .is_some_and(|rest| matches!(rest, "ack" | "inbox"))
}

/// ferry: whether a remote client `client_id` may subscribe to `filter`
/// under isolation `prefix`: its own `ack` and `inbox`, or `also` (see
/// [`RouterConfig::also_subscribe`]) with its own id in it.
pub fn may_subscribe(prefix: &str, also: Option<&str>, client_id: &str, filter: &str) -> bool {
    own_subscribe_filter(prefix, client_id, filter)
        || also.is_some_and(|t| {
            t.split_once("{device}").is_some_and(|(head, tail)| {
                filter.len() == head.len() + client_id.len() + tail.len()
                    && filter.starts_with(head)
                    && filter.ends_with(tail)
                    && &filter[head.len()..head.len() + client_id.len()] == client_id
            })
        })
}

impl ConnectionSettings {
    pub fn set_auth_handler<F, O>(&mut self, auth_fn: F)
    where
        F: Fn(ClientId, AuthUser, AuthPass) -> O + Send + Sync + 'static,
        O: IntoFuture<Output = bool> + 'static,
        O::IntoFuture: Send,
    {
        self.external_auth = Some(Arc::new(move |client_id, username, password| {
            let auth = auth_fn(client_id, username, password).into_future();
            Box::pin(auth)
        }));
    }
}

impl fmt::Debug for ConnectionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field("connection_timeout_ms", &self.connection_timeout_ms)
            .field("max_payload_size", &self.max_payload_size)
            .field("max_inflight_count", &self.max_inflight_count)
            .field("auth", &self.auth)
            .field("external_auth", &self.external_auth.is_some())
            .field("dynamic_filters", &self.dynamic_filters)
            .field("max_keep_alive", &self.max_keep_alive)
            .field("oversize_head", &self.oversize_head)
            .field("connect_hook", &self.connect_hook.is_some())
            .field("also_publish", &self.also_publish.is_some())
            .field("publish_sink", &self.publish_sink.is_some())
            .field("max_client_id_len", &self.max_client_id_len)
            .finish()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterSettings {
    /// Id with which this node connects to other nodes of the mesh
    pub node_id: NodeId,
    /// Address on which this broker is listening for mesh connections
    pub listen: String,
    /// Address of clusters that this node has to initiate connection
    pub seniors: Vec<(ConnectionId, String)>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct RouterConfig {
    pub max_connections: usize,
    pub max_outgoing_packet_count: u64,
    pub max_segment_size: usize,
    pub max_segment_count: usize,
    pub custom_segment: Option<HashMap<String, SegmentConfig>>,
    pub initialized_filters: Option<Vec<Filter>>,
    // defaults to Round Robin
    #[serde(default)]
    pub shared_subscriptions_strategy: Strategy,
    /// ferry: keep nothing for a client once it leaves: no session (every
    /// session is clean), no retained messages from clients, and a filter's
    /// log is freed when its last subscriber goes.
    #[serde(default)]
    pub ephemeral: bool,
    /// ferry: most subscriptions one connection may hold; a SUBSCRIBE
    /// beyond it gets a failure (0x80) for that filter. 0 = no limit.
    #[serde(default)]
    pub max_subscriptions: usize,
    /// ferry: messages waiting for direct delivery to one connection
    /// ([`local::LinkTx::deliver`]) before that connection's own publishes
    /// are held back (not acknowledged) until it has read them. 0 = no
    /// limit.
    #[serde(default)]
    pub max_direct_queue: usize,
    /// ferry: per-client subscription isolation under this prefix: a
    /// remote client may subscribe only to its own `{prefix}/X/ack` and
    /// `{prefix}/X/inbox`; any other filter (wildcards included) gets a
    /// failure (0x80). Local links are not held to it. `None` keeps
    /// upstream's behaviour.
    #[serde(default)]
    pub isolation: Option<String>,
    /// ferry: under isolation, one more topic a remote client may subscribe
    /// to: this one with `{device}` replaced by its client id, exactly (the
    /// gateway's plain devices' downlink topic, e.g. `plant/cmd/{device}`).
    #[serde(default)]
    pub also_subscribe: Option<String>,
    /// ferry: most sessions kept for clients that are away, with
    /// `ephemeral` (see `router/sessions.rs`; how long each lives is its
    /// connection's session expiry, [`ConnectionSettings::max_session_expiry`]
    /// at most). 0 keeps none.
    #[serde(default)]
    pub max_sessions: usize,
    /// ferry: what the messages kept in all sessions may cost in memory
    /// together, bytes (see `router/sessions.rs`: counted by what they
    /// cost, not their payloads' length); past it, a session keeps no
    /// more messages. 0 keeps none (only subscriptions).
    #[serde(default)]
    pub max_session_bytes: usize,
}

/// The user property a skipped oversized publish carries (see
/// [`ConnectionSettings::oversize_head`]): its real size, the whole
/// packet's (a publish can be over the limit by its MQTT 5 properties).
pub const OVERSIZE_PROPERTY: &str = "ferry-oversize";

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct SegmentConfig {
    pub max_segment_size: usize,
    pub max_segment_count: usize,
}

type ReloadHandle = Handle<EnvFilter, Layered<Layer<Registry, Pretty, Format<Pretty>>, Registry>>;

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ConsoleSettings {
    pub listen: String,
    #[serde(skip)]
    filter_handle: Option<ReloadHandle>,
}

impl ConsoleSettings {
    pub fn set_filter_reload_handle(&mut self, handle: ReloadHandle) {
        self.filter_handle.replace(handle);
    }
}

#[derive(Debug, Serialize, Deserialize, Clone, Default)]
pub enum Transport {
    #[serde(rename = "tcp")]
    #[default]
    Tcp,
    #[serde(rename = "tls")]
    Tls {
        ca: PathBuf,
        client_auth: Option<ClientAuth>,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientAuth {
    certs: PathBuf,
    key: PathBuf,
}

#[derive(Debug, Serialize, Deserialize, Clone, Hash, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MetricType {
    Meters,
    Alerts,
}

#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct MetricSettings {
    push_interval: u64,
}
