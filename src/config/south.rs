//! The `[south]` section (and `[south.tls]`, `[south.site_tls]`): where
//! devices connect, how they prove who they are, and their limits, checked
//! into a [`SouthConfig`]. Every error names its key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::check::{credentials, in_range, topic_segment, ConfigError, Problems};
pub use super::listeners::Listener;
use super::raw::RawSouth;
use super::tls::{self, ClientTls, ListenerTls};
use super::version::MqttVersion;
use crate::ids::GatewayId;
use crate::protocol::plain::{PlainFilter, PlainTopics};
use crate::protocol::plain_down::PlainDown;

/// The longest `south.max_session_expiry_s` allowed: 30 days.
const MAX_SESSION_EXPIRY_S: u64 = 30 * 24 * 3600;
/// The largest `south.max_session_bytes` allowed: 64 GiB, more than any
/// box ferry runs on has.
const MAX_SESSION_BYTES: usize = 64 << 30;

#[derive(Debug, Clone)]
pub struct SouthConfig {
    pub mode: SouthMode,
    /// Embedded mode: where the broker listens (the first of `listeners`).
    pub listen: SocketAddr,
    /// Embedded mode: every device listener (`south.listeners`, or the one
    /// `south.listen`).
    pub listeners: Vec<Listener>,
    /// `south.plain_topics`: where plain devices publish.
    pub plain_topics: PlainTopics,
    /// `south.plain_down`: where plain devices' downlinks go (embedded
    /// mode only).
    pub plain_down: Option<PlainDown>,
    pub max_payload_bytes: usize,
    pub topic_prefix: String,
    pub max_connections: usize,
    /// A device asking for a longer keep-alive, or none, gets this one.
    pub max_keep_alive: Duration,
    /// Embedded mode: the longest a device's session (MQTT 3.1.1 without
    /// a clean session, MQTT 5's session expiry) outlives its connection;
    /// zero keeps none.
    pub max_session_expiry: Duration,
    /// Embedded mode: what the messages kept in all sessions may cost in
    /// memory together, bytes.
    pub max_session_bytes: usize,
    pub max_subscriptions: usize,
    /// Embedded mode: how long a connection may take to complete its TLS
    /// handshake and its CONNECT.
    pub connect_timeout: Duration,
    /// Embedded mode: TLS on the device listener (`None`: plain TCP).
    pub tls: Option<ListenerTls>,
    /// Embedded mode: how devices prove who they are.
    pub auth: SouthAuth,
    /// Each device's token bucket, in both modes.
    pub rate: RateLimit,
    /// Uplinks from one device sent to the store and not yet answered, at most.
    pub max_inflight_per_device: usize,
}

/// How the embedded broker authenticates devices.
#[derive(Debug, Clone, PartialEq)]
pub enum SouthAuth {
    /// Any client is accepted as the device its client id names; allowed
    /// off loopback only with `south.allow_anonymous`.
    None,
    /// Client id = username, password checked against this file.
    Password { file: PathBuf },
}

/// A token bucket: `per_s` publishes a second on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_s: f64,
    pub burst: u32,
}

/// Which broker devices talk to.
#[derive(Debug, Clone, PartialEq)]
pub enum SouthMode {
    /// ferry's own rumqttd on `south.listen`.
    Embedded,
    /// A client of the site's broker.
    External(ExternalSouth),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExternalSouth {
    pub host: String,
    pub port: u16,
    pub client_id: String,
    /// `(username, password)`; `None` connects anonymously.
    pub credentials: Option<(String, String)>,
    pub keep_alive: Duration,
    /// `south.puback_timeout_ms`: the site broker acknowledging none of
    /// ferry's outstanding publishes for this long fails the link.
    pub puback_timeout: Duration,
    /// `south.mqtt_version`.
    pub mqtt_version: MqttVersion,
    /// TLS to the site broker (`None`: plain TCP).
    pub tls: Option<ClientTls>,
}

/// Checks the south section, noting each problem in `p`; `gateway` names
/// ferry's default client id on a site broker.
pub(super) fn check(raw: &RawSouth, gateway: &GatewayId, p: &mut Problems) -> Option<SouthConfig> {
    let listeners = super::listeners::check(raw, !raw.tls.cert.as_os_str().is_empty(), p);
    let plain_topics = plain_topics(raw, p);
    p.take(in_range(
        "south.max_payload_bytes",
        raw.max_payload_bytes,
        64,
        16 << 20,
    ));
    p.take(topic_segment("south.topic_prefix", &raw.topic_prefix));
    p.take(in_range(
        "south.max_connections",
        raw.max_connections,
        1,
        1_000_000,
    ));
    p.take(in_range(
        "south.max_keep_alive_s",
        raw.max_keep_alive_s,
        5,
        u16::MAX as u64,
    ));
    p.take(in_range(
        "south.max_session_expiry_s",
        raw.max_session_expiry_s,
        0,
        MAX_SESSION_EXPIRY_S,
    ));
    p.take(in_range(
        "south.max_session_bytes",
        raw.max_session_bytes,
        0,
        MAX_SESSION_BYTES,
    ));
    p.take(in_range(
        "south.max_subscriptions",
        raw.max_subscriptions,
        2,
        10_000,
    ));
    p.take(in_range(
        "south.connect_timeout_ms",
        raw.connect_timeout_ms,
        100,
        u16::MAX as u64,
    ));
    // No off switch: a device that may send without bound can fill the
    // store for everyone. A site that wants no practical limit sets a
    // high one.
    let rate = raw.rate_per_s;
    if !(rate.is_finite() && (MIN_RATE..=MAX_RATE).contains(&rate)) {
        p.note(ConfigError::new(
            "south.rate_per_s",
            format!(
                "must be between {MIN_RATE} and {MAX_RATE} publishes per second (got {rate}); \
                 there is no off switch, set a high rate instead"
            ),
        ));
    }
    p.take(in_range("south.burst", raw.burst, 1, 1_000_000));
    p.take(in_range(
        "south.max_inflight_per_device",
        raw.max_inflight_per_device,
        1,
        MAX_UNANSWERED,
    ));

    let listener_tls = &raw.tls;
    // south.auth is checked first (as embedded mode's unless the mode is
    // "external"); a mode that is neither is reported after it.
    let mode = ModeName::parse(&raw.mode);
    let external = matches!(mode, Ok(ModeName::External));
    let south_auth = listeners
        .as_ref()
        .and_then(|listeners| p.take(south_auth(raw, listeners, external)));
    let mqtt_version = p.take(MqttVersion::parse("south.mqtt_version", &raw.mqtt_version));
    let south_mode = mqtt_version.and_then(|v| p.take(mode_of(raw, gateway, mode, v)));
    let plain_down = plain_down(raw, external, p);
    let south_tls = match south_mode.as_ref()? {
        SouthMode::Embedded => p.take(tls::listener(listener_tls))?,
        SouthMode::External(_) => None,
    };

    Some(SouthConfig {
        mode: south_mode?,
        listen: listeners.as_ref()?[0].listen,
        listeners: listeners?,
        plain_topics: plain_topics?,
        plain_down: plain_down?,
        max_payload_bytes: raw.max_payload_bytes,
        topic_prefix: raw.topic_prefix.clone(),
        max_connections: raw.max_connections,
        max_keep_alive: Duration::from_secs(raw.max_keep_alive_s),
        max_session_expiry: Duration::from_secs(raw.max_session_expiry_s),
        max_session_bytes: raw.max_session_bytes,
        max_subscriptions: raw.max_subscriptions,
        connect_timeout: Duration::from_millis(raw.connect_timeout_ms),
        tls: south_tls,
        auth: south_auth?,
        rate: RateLimit {
            per_s: raw.rate_per_s,
            burst: raw.burst,
        },
        max_inflight_per_device: raw.max_inflight_per_device,
    })
}

/// `south.plain_down`, if set: embedded mode only (only the device port
/// sees a device's PUBACK, which is its `delivered`). `None` when it has a
/// problem (noted); `Some(None)` when unset.
fn plain_down(raw: &RawSouth, external: bool, p: &mut Problems) -> Option<Option<PlainDown>> {
    let Some(text) = &raw.plain_down else {
        return Some(None);
    };
    let why = if external {
        "is for embedded mode only: the site broker keeps a device's PUBACK, which is its          `delivered`, to itself"
            .to_string()
    } else {
        match PlainDown::parse(text, &[raw.topic_prefix.as_str()]) {
            Ok(down) => return Some(Some(down)),
            Err(why) => why,
        }
    };
    p.note(ConfigError::new(
        "south.plain_down",
        format!("{text:?} {why}"),
    ));
    None
}

/// `south.plain_topics`, each filter's problem noted under its place.
fn plain_topics(raw: &RawSouth, p: &mut Problems) -> Option<PlainTopics> {
    /// More would only cost every publish a longer match.
    const MAX_PLAIN_TOPICS: usize = 64;
    if raw.plain_topics.len() > MAX_PLAIN_TOPICS {
        p.note(ConfigError::new(
            "south.plain_topics",
            format!(
                "{} filters; at most {MAX_PLAIN_TOPICS}",
                raw.plain_topics.len()
            ),
        ));
        return None;
    }
    let before = p.len();
    let reserved = [raw.topic_prefix.as_str()];
    let filters: Vec<_> = raw
        .plain_topics
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            let parsed = PlainFilter::parse(text, &reserved).map_err(|why| {
                ConfigError::new(
                    &format!("south.plain_topics[{i}]"),
                    format!("{text:?} {why}"),
                )
            });
            p.take(parsed)
        })
        .collect();
    (p.len() == before).then(|| PlainTopics::new(filters))
}

/// `south.mode` and what goes with it: the site broker's link in external
/// mode, and the keys that belong to the other mode refused.
fn mode_of(
    raw: &RawSouth,
    gateway: &GatewayId,
    mode: Result<ModeName, ConfigError>,
    mqtt_version: MqttVersion,
) -> Result<SouthMode, ConfigError> {
    let listener_tls = &raw.tls;
    let site_tls = &raw.site_tls;
    Ok(match mode? {
        ModeName::Embedded => {
            if mqtt_version != MqttVersion::V311 {
                return Err(ConfigError::new(
                    "south.mqtt_version",
                    "applies to external mode only: it is the version ferry speaks as the \
                     site broker's client (devices choose their own); leave it \"3.1.1\"",
                ));
            }
            if let Some(key) = tls::first_set(&[
                ("south.site_tls.ca", &site_tls.ca),
                ("south.site_tls.cert", &site_tls.cert),
                ("south.site_tls.key", &site_tls.key),
            ]) {
                return Err(ConfigError::new(
                    key,
                    "is TLS to a site broker (south.mode = \"external\"); the embedded \
                     listener's TLS is south.tls.cert, .key and .client_ca",
                ));
            }
            SouthMode::Embedded
        }
        ModeName::External => {
            if !raw.listeners.is_empty() {
                return Err(ConfigError::new(
                    "south.listeners",
                    "applies to embedded mode only: in external mode devices connect to \
                     the site broker",
                ));
            }
            if let Some(key) = tls::first_set(&[
                ("south.tls.cert", &listener_tls.cert),
                ("south.tls.key", &listener_tls.key),
                ("south.tls.client_ca", &listener_tls.client_ca),
                ("south.tls.crl", &listener_tls.crl),
            ]) {
                return Err(ConfigError::new(
                    key,
                    "is TLS on the embedded listener, which external mode does not run; \
                     TLS to the site broker is south.site_tls.ca, .cert and .key",
                ));
            }
            if raw.host.is_empty() {
                return Err(ConfigError::new(
                    "south.host",
                    "the site broker's host is required in external mode",
                ));
            }
            in_range("south.port", raw.port, 1, u16::MAX)?;
            in_range("south.keep_alive_s", raw.keep_alive_s, 5, u16::MAX as u64)?;
            let (least, most) = super::north::PUBACK_TIMEOUT_MS;
            in_range(
                "south.puback_timeout_ms",
                raw.puback_timeout_ms,
                least,
                most,
            )?;
            let client_id = if raw.client_id.is_empty() {
                format!("ferry-{gateway}-south")
            } else {
                raw.client_id.clone()
            };
            SouthMode::External(ExternalSouth {
                host: raw.host.clone(),
                port: raw.port,
                client_id,
                credentials: credentials("south", &raw.username, &raw.password)?,
                keep_alive: Duration::from_secs(raw.keep_alive_s),
                puback_timeout: Duration::from_millis(raw.puback_timeout_ms),
                mqtt_version,
                tls: tls::client("south.site_tls", site_tls)?,
            })
        }
    })
}

/// `south.auth` and its companions. In external mode the site broker
/// authenticates devices, so none of them apply there.
fn south_auth(
    raw: &RawSouth,
    listeners: &[Listener],
    external: bool,
) -> Result<SouthAuth, ConfigError> {
    let method = MethodName::parse(&raw.auth);
    if external {
        if !matches!(method, Ok(MethodName::None)) {
            return Err(ConfigError::new(
                "south.auth",
                "applies to embedded mode only; in external mode the site broker \
                 authenticates devices (docs/EXTERNAL.md)",
            ));
        }
        if !raw.password_file.as_os_str().is_empty() {
            return Err(ConfigError::new(
                "south.password_file",
                "applies to embedded mode only",
            ));
        }
        return Ok(SouthAuth::None);
    }
    match method? {
        MethodName::None => {
            if !raw.password_file.as_os_str().is_empty() {
                return Err(ConfigError::new(
                    "south.password_file",
                    "is set but south.auth is \"none\"; set south.auth = \"password\" to use it",
                ));
            }
            // Client certificates prove who a device is (its CN is its id),
            // on a TLS listener.
            let certificates = !raw.tls.client_ca.as_os_str().is_empty();
            let open = listeners
                .iter()
                .find(|l| !raw.allow_anonymous && l.open_to_network(certificates));
            if let Some(Listener { listen, .. }) = open {
                return Err(ConfigError::new(
                    "south.auth",
                    format!(
                        "\"none\" on {listen}, which is not loopback, would let any client on \
                         the network act as any device; set south.auth = \"password\" with \
                         south.password_file, or require client certificates \
                         (south.tls.client_ca, on a TLS listener), or south.allow_anonymous = \
                         true to accept that"
                    ),
                ));
            }
            Ok(SouthAuth::None)
        }
        MethodName::Password => {
            if raw.password_file.as_os_str().is_empty() {
                return Err(ConfigError::new(
                    "south.password_file",
                    "is required with south.auth = \"password\"; make it with \
                     `ferry passwd FILE DEVICE`",
                ));
            }
            super::passwords::load(&raw.password_file)
                .map_err(|e| ConfigError::new("south.password_file", e.to_string()))?;
            Ok(SouthAuth::Password {
                file: raw.password_file.clone(),
            })
        }
    }
}

/// `south.mode`, the word: which [`SouthMode`] to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModeName {
    Embedded,
    External,
}

impl ModeName {
    fn parse(value: &str) -> Result<ModeName, ConfigError> {
        match value {
            "embedded" => Ok(ModeName::Embedded),
            "external" => Ok(ModeName::External),
            other => Err(ConfigError::new(
                "south.mode",
                format!("{other:?} is not a mode; use \"embedded\" or \"external\""),
            )),
        }
    }
}

/// `south.auth`, the word: which [`SouthAuth`] to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MethodName {
    None,
    Password,
}

impl MethodName {
    fn parse(value: &str) -> Result<MethodName, ConfigError> {
        match value {
            "none" => Ok(MethodName::None),
            "password" => Ok(MethodName::Password),
            other => Err(ConfigError::new(
                "south.auth",
                format!("{other:?} is not a method; use \"none\" or \"password\""),
            )),
        }
    }
}

impl SouthMode {
    /// The `south.mode` value this mode is written as.
    pub fn name(&self) -> &'static str {
        match self {
            SouthMode::Embedded => "embedded",
            SouthMode::External(_) => "external",
        }
    }
}

/// Uplinks sent to the store and not yet answered, at most, gateway-wide;
/// `south.max_inflight_per_device` is at most this.
pub const MAX_UNANSWERED: usize = 16_384;

/// `south.rate_per_s` bounds, publishes per second.
const MIN_RATE: f64 = 0.1;
const MAX_RATE: f64 = 1_000_000.0;
