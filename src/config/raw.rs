//! The config file as written: serde structs mirroring conf/ferry.toml,
//! every field documented and defaulted, unknown keys refused by name.
//! Reading the file and the environment overrides into them is
//! [`super::load`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The file as written. See conf/ferry.toml for every key's meaning.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub gateway: RawGateway,
    pub south: RawSouth,
    pub north: RawNorth,
    pub retry: RawRetry,
    pub store: RawStore,
    pub downlink: RawDownlink,
    /// Named device groups, addressable in a downlink's `to` as `@name`.
    pub groups: BTreeMap<String, Vec<String>>,
    pub log: RawLog,
    pub shutdown: RawShutdown,
    pub alerts: RawAlerts,
    pub admin: RawAdmin,
    /// The keys an environment variable set (`south.port`), so a check
    /// that refuses one names the variable, not the file.
    #[serde(skip)]
    pub from_env: BTreeSet<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAdmin {
    /// host:port of the admin HTTP server (`/metrics`, `/healthz`,
    /// `/readyz`, the JSON API and the status page); empty turns it off.
    pub listen: String,
    /// Names a request's `Host` may carry besides the listen address's own
    /// (a reverse proxy's public name, `name` or `name:port`); any other
    /// `Host` is answered 421, so a web page cannot reach the server
    /// through DNS rebinding.
    pub allowed_hosts: Vec<String>,
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            listen: "127.0.0.1:9183".into(),
            allowed_hosts: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawAlerts {
    /// Alert when the upstream link has been down this many seconds.
    pub north_down_s: u64,
    /// Alert when the oldest undelivered message is this many seconds old.
    pub backlog_age_s: u64,
    /// Alert when uplinks have waited this many seconds on a backend that
    /// acks nothing.
    pub backend_silent_s: u64,
}

impl Default for RawAlerts {
    fn default() -> Self {
        RawAlerts {
            north_down_s: 300,
            backlog_age_s: 3600,
            backend_silent_s: 300,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawDownlink {
    /// Most messages in one inbox batch (hard cap 1000).
    pub batch_size: usize,
    /// Resend an unconfirmed batch after this long (with backoff).
    pub confirm_timeout_ms: u64,
    /// Undelivered messages per device before the oldest expire.
    pub queue_cap: u64,
}

impl Default for RawDownlink {
    fn default() -> Self {
        RawDownlink {
            batch_size: 200,
            confirm_timeout_ms: 10_000,
            queue_cap: 10_000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawGateway {
    /// This box's id, part of every north topic.
    pub id: String,
    /// Directory of the SQLite store.
    pub data_dir: PathBuf,
}

impl Default for RawGateway {
    fn default() -> Self {
        RawGateway {
            id: String::new(),
            data_dir: PathBuf::from("./data"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSouth {
    /// "embedded" (ferry's own broker) or "external" (a client of the
    /// site's broker).
    pub mode: String,
    /// Listen address of the embedded device broker.
    pub listen: String,
    /// Embedded mode: several device listeners; set, it replaces `listen`.
    pub listeners: Vec<RawListener>,
    /// Topic filters with one `{device}` level: a publish matching one is
    /// a plain uplink of that device (no envelope).
    pub plain_topics: Vec<String>,
    /// A topic with one `{device}` level: plain devices' downlinks go
    /// there as their bare payload.
    pub plain_down: Option<String>,
    /// Largest accepted uplink envelope, bytes.
    pub max_payload_bytes: usize,
    /// Device topic prefix.
    pub topic_prefix: String,
    /// Most devices connected at once.
    pub max_connections: usize,
    /// Longest MQTT keep-alive a device is held to, seconds.
    pub max_keep_alive_s: u64,
    /// Longest a device's MQTT session outlives its connection, seconds
    /// (0: no sessions).
    pub max_session_expiry_s: u64,
    /// What the messages kept in all devices' sessions may cost in memory
    /// together, bytes (0: sessions keep subscriptions only).
    pub max_session_bytes: usize,
    /// Most subscriptions one device may hold.
    pub max_subscriptions: usize,
    /// A connection that has not completed its CONNECT within this long is
    /// closed, milliseconds.
    pub connect_timeout_ms: u64,
    /// Embedded mode: "none" or "password" (client id = username, checked
    /// against `password_file`).
    pub auth: String,
    /// Embedded mode: `device:hash` lines (argon2id PHC), made with
    /// `ferry passwd FILE DEVICE`.
    pub password_file: PathBuf,
    /// Embedded mode: allow `auth = "none"` on a listener that is not on
    /// loopback (any client could then act as any device).
    pub allow_anonymous: bool,
    /// Publishes (uplinks and controls) one device may send per second on
    /// average: the refill rate of its token bucket.
    pub rate_per_s: f64,
    /// Publishes one device may send at once before `rate_per_s` holds it
    /// back: the size of its token bucket.
    pub burst: u32,
    /// Uplinks from one device sent to the store and not yet answered, at most.
    pub max_inflight_per_device: usize,
    /// External mode: the site broker's host.
    pub host: String,
    /// External mode: the site broker's port.
    pub port: u16,
    /// External mode: username on the site broker; empty = anonymous.
    pub username: String,
    /// External mode: password on the site broker.
    pub password: String,
    /// External mode: ferry's client id; empty means `ferry-{gateway.id}-south`.
    pub client_id: String,
    /// External mode: MQTT keep-alive, seconds.
    pub keep_alive_s: u64,
    /// External mode: the site broker acknowledging none of ferry's
    /// outstanding publishes for this long, ms, fails the link (it takes
    /// the session but moves nothing); ferry reconnects.
    pub puback_timeout_ms: u64,
    /// External mode: the MQTT version ferry speaks to the site broker,
    /// "3.1.1" or "5".
    pub mqtt_version: String,
    /// Embedded mode: TLS on the device listener.
    pub tls: RawListenerTls,
    /// External mode: TLS to the site broker.
    pub site_tls: RawClientTls,
    /// Sparkplug B edge nodes.
    pub sparkplug: RawSparkplug,
}

/// `[south.sparkplug]`: Sparkplug B edge nodes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawSparkplug {
    /// A publish on an edge node's `spBv1.0/...` topic is an uplink of
    /// that edge node.
    pub enabled: bool,
    /// The primary host application whose `spBv1.0/STATE/{host_id}` ferry
    /// follows on the north broker: Sparkplug uplinks wait while it is
    /// not online.
    pub host_id: Option<String>,
}

/// One device listener of `south.listeners`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListener {
    /// Its address, "host:port".
    pub listen: String,
    /// "tcp" (the default), "tls" (with `[south.tls]`), "ws" (MQTT over
    /// WebSocket) or "wss" (over TLS, with `[south.tls]`).
    #[serde(default = "tcp")]
    pub transport: String,
    /// "ws" and "wss": the path MQTT is served on; empty: "/mqtt".
    #[serde(default)]
    pub path: String,
}

fn tcp() -> String {
    "tcp".into()
}

/// TLS on the embedded broker's device listener; every path empty = plain
/// TCP.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawListenerTls {
    /// The listener's certificate chain, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
    /// CA certificates (PEM) that issue device certificates; set, every
    /// device must present one, and its CN is the device id.
    pub client_ca: PathBuf,
    /// Revocation lists (PEM) from the client CA; needs `client_ca`.
    pub crl: PathBuf,
}

/// ferry as a TLS client of a broker; every path empty = plain TCP.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawClientTls {
    /// CA certificates (PEM) the broker's certificate must chain to; set,
    /// the link is TLS.
    pub ca: PathBuf,
    /// ferry's client certificate chain, PEM (with `key`), if the broker
    /// asks for one.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
}

impl Default for RawSouth {
    fn default() -> Self {
        RawSouth {
            // Loopback until devices are authenticated: see `auth`.
            listen: "127.0.0.1:1883".into(),
            listeners: Vec::new(),
            plain_topics: Vec::new(),
            plain_down: None,
            auth: "none".into(),
            password_file: PathBuf::new(),
            allow_anonymous: false,
            max_payload_bytes: 65536,
            topic_prefix: "devices".into(),
            max_connections: 10_000,
            max_keep_alive_s: 600,
            max_session_expiry_s: 3600,
            max_session_bytes: 128 << 20,
            max_subscriptions: 8,
            connect_timeout_ms: 5000,
            rate_per_s: 200.0,
            burst: 400,
            max_inflight_per_device: 256,
            mode: "embedded".into(),
            host: "127.0.0.1".into(),
            port: 1883,
            username: String::new(),
            password: String::new(),
            client_id: String::new(),
            keep_alive_s: 30,
            puback_timeout_ms: 30_000,
            mqtt_version: "3.1.1".into(),
            tls: RawListenerTls::default(),
            site_tls: RawClientTls::default(),
            sparkplug: RawSparkplug::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawNorth {
    /// Upstream broker host, when `endpoints` is empty.
    pub host: String,
    /// Upstream broker port; also the port of an endpoint that names none.
    pub port: u16,
    /// The upstream's nodes as `host:port` (`[v6]:port`; no port: `port`),
    /// tried in order, one session at a time; empty means `host`/`port`.
    /// From the environment: comma-separated.
    pub endpoints: Vec<String>,
    /// While on a later endpoint, go back to the first once it accepts
    /// connections again.
    pub prefer_first: bool,
    /// How often, seconds, to check whether the first endpoint is back
    /// while on a later one (doubling after a return that fails).
    pub prefer_first_check_s: u64,
    /// Client id upstream; empty means `ferry-{gateway.id}`.
    pub client_id: String,
    /// Upstream username; empty means anonymous.
    pub username: String,
    /// Upstream password.
    pub password: String,
    /// MQTT keep-alive, seconds.
    pub keep_alive_s: u64,
    /// A node acknowledging none of ferry's outstanding publishes for this
    /// long, ms, fails the link there (it takes the session but moves
    /// nothing): the next endpoint is tried.
    pub puback_timeout_ms: u64,
    /// The MQTT version ferry speaks to the upstream broker, "3.1.1" or "5".
    pub mqtt_version: String,
    /// Wait for the backend's ack before an attempt counts as failed.
    pub ack_timeout_ms: u64,
    /// Most unacked messages per device.
    pub max_inflight: usize,
    /// Most uplinks in one publish north (a JSON array on `{prefix}/up`);
    /// 1 publishes each alone on its own topic.
    pub batch_max: usize,
    /// How long, ms, a batch's first uplink waits for others.
    pub batch_linger_ms: u64,
    /// North topic prefix; the full prefix is `{topic_prefix}/{gateway.id}`.
    pub topic_prefix: String,
    /// Largest MQTT packet exchanged with the upstream broker, bytes.
    pub max_packet_bytes: usize,
    /// TLS to the upstream broker.
    pub tls: RawClientTls,
}

impl Default for RawNorth {
    fn default() -> Self {
        RawNorth {
            host: "127.0.0.1".into(),
            port: 1884,
            endpoints: Vec::new(),
            prefer_first: true,
            prefer_first_check_s: 30,
            client_id: String::new(),
            username: String::new(),
            password: String::new(),
            keep_alive_s: 30,
            puback_timeout_ms: 30_000,
            mqtt_version: "3.1.1".into(),
            ack_timeout_ms: 10_000,
            max_inflight: 32,
            batch_max: 1,
            batch_linger_ms: 5,
            topic_prefix: "ferry".into(),
            max_packet_bytes: 16 << 20,
            tls: RawClientTls::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRetry {
    /// First resend delay, ms.
    pub base_ms: u64,
    /// Largest resend delay, ms.
    pub max_ms: u64,
    /// Attempts (made while the link was up) before dead-lettering.
    pub max_attempts: u32,
    /// Fraction of each delay that is randomised away, 0.0..=1.0.
    pub jitter: f64,
}

impl Default for RawRetry {
    fn default() -> Self {
        RawRetry {
            base_ms: 1000,
            max_ms: 300_000,
            max_attempts: 10,
            jitter: 0.2,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawStore {
    /// SQLite synchronous mode: "full" or "normal".
    pub sync: String,
    /// Most messages per transaction.
    pub max_batch: usize,
    /// Disk budget of the store in bytes (pages in use plus the WAL file):
    /// at it, new uplinks and downlinks are refused until space frees.
    pub max_db_bytes: u64,
    /// Delivered uplinks and finished downlinks are pruned after this many days.
    pub retention_days: u32,
    /// Dead letters are pruned after this many days.
    pub dead_letter_retention_days: u32,
    /// At the disk budget delivered messages are pruned at once; their
    /// dedup keys (what a resend is answered with) are kept at least this
    /// many seconds.
    pub min_dedup_s: u64,
    /// Dead letters one peer's refusals (malformed, too large, unauthorized,
    /// a bad topic) may fill, in rows; past its share, its further refusals
    /// are summed in one row.
    pub dead_letter_share_rows: u64,
    /// The same share in bytes.
    pub dead_letter_share_bytes: u64,
    /// Dead letters all peers' refusals together may fill, in bytes (at
    /// most a twentieth of `max_db_bytes`); past it, every refusal is summed
    /// in one row.
    pub dead_letter_total_bytes: u64,
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            sync: "full".into(),
            max_batch: 2048,
            max_db_bytes: 8 << 30,
            retention_days: 30,
            dead_letter_retention_days: 90,
            min_dedup_s: 3600,
            dead_letter_share_rows: 1000,
            dead_letter_share_bytes: 1 << 20,
            dead_letter_total_bytes: 256 << 20,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawLog {
    /// tracing filter directive.
    pub level: String,
    /// "text" (one readable line per event) or "json" (one JSON object per
    /// line, for a log shipper).
    pub format: String,
}

impl Default for RawLog {
    fn default() -> Self {
        RawLog {
            level: "info,rumqttd=warn,rustls::msgs::handshake=error".into(),
            format: "text".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawShutdown {
    /// Seconds from SIGTERM/SIGINT to exit: flush north, go offline, close
    /// the store; past it ferry names what did not finish and exits 1.
    pub grace_s: u64,
}

impl Default for RawShutdown {
    fn default() -> Self {
        RawShutdown { grace_s: 10 }
    }
}
