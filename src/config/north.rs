//! The `[north]` section (and `[north.tls]`): the upstream broker's
//! addresses, the session to it and its limits, checked into a
//! [`NorthConfig`]. Every error names its key, an address by its place in
//! the list (`north.endpoints[2]`).
//!
//! `north.endpoints` lists the nodes of one upstream (a cluster, or a
//! primary and its standbys); ferry holds one session, to one of them at a
//! time. Empty, `north.host`/`north.port` is the one address.

use std::fmt;
use std::net::Ipv6Addr;
use std::time::Duration;

use super::check::{credentials, in_range, topic_segment, ConfigError, Problems};
use super::raw::RawNorth;
use super::tls::{self, ClientTls};
use super::version::MqttVersion;
use crate::ids::GatewayId;

/// Most addresses in `north.endpoints`: a cluster's nodes, not a scan list.
pub const MAX_ENDPOINTS: usize = 16;
/// `north.puback_timeout_ms` and `south.puback_timeout_ms`, least and most:
/// under a second a busy but working broker would be left; over an hour
/// is no bound.
pub const PUBACK_TIMEOUT_MS: (u64, u64) = (1_000, 3_600_000);

#[derive(Debug, Clone)]
pub struct NorthConfig {
    /// The upstream's nodes, in order of preference; never empty.
    pub endpoints: Vec<Endpoint>,
    /// `north.prefer_first`: while on a later endpoint, how often to check
    /// whether the first is back (`None`: stay where the session is).
    pub prefer_first: Option<Duration>,
    pub client_id: String,
    /// `(username, password)`; `None` connects anonymously.
    pub credentials: Option<(String, String)>,
    pub keep_alive: Duration,
    /// `north.puback_timeout_ms`: publishes outstanding and none
    /// acknowledged for this long fails the link on that node.
    pub puback_timeout: Duration,
    /// `north.mqtt_version`.
    pub mqtt_version: MqttVersion,
    pub ack_timeout: Duration,
    pub max_inflight: usize,
    /// `north.batch_max`: most uplinks in one publish; 1 is no batches.
    pub batch_max: usize,
    /// `north.batch_linger_ms`: how long a batch's first uplink waits.
    pub batch_linger: Duration,
    /// `{topic_prefix}/{gateway}`.
    pub prefix: String,
    /// Largest MQTT packet ferry sends north or accepts from the upstream.
    pub max_packet_bytes: usize,
    /// TLS to the upstream broker (`None`: plain TCP); each endpoint's
    /// certificate must name that endpoint's host.
    pub tls: Option<ClientTls>,
}

/// One broker address: a host name or IP address (an IPv6 one without its
/// brackets) and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn new(host: impl Into<String>, port: u16) -> Endpoint {
        Endpoint {
            host: host.into(),
            port,
        }
    }

    /// Reads `host:port`, `host` (then the port is `default_port`),
    /// `[v6]:port` or `[v6]`. The error says what is wrong, for the key
    /// it came from.
    pub fn parse(text: &str, default_port: u16) -> Result<Endpoint, String> {
        let text = text.trim();
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let Some((v6, after)) = rest.split_once(']') else {
                return Err(format!("{text:?}: a `[` without its `]`"));
            };
            if v6.parse::<Ipv6Addr>().is_err() {
                return Err(format!(
                    "{text:?}: {v6:?} in brackets is not an IPv6 address"
                ));
            }
            let port = match after {
                "" => None,
                _ => match after.strip_prefix(':') {
                    Some(port) => Some(port),
                    None => return Err(format!("{text:?}: expected `:port` after `]`")),
                },
            };
            (v6, port)
        } else {
            match text.split_once(':') {
                Some((_, rest)) if rest.contains(':') => {
                    return Err(format!(
                        "{text:?}: an IPv6 address goes in brackets, e.g. \"[::1]:1883\""
                    ))
                }
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            }
        };
        if host.is_empty() {
            return Err(format!("{text:?}: the host is empty"));
        }
        if host.contains(|c: char| c.is_whitespace() || "/@[]".contains(c)) {
            return Err(format!("{text:?}: {host:?} is not a host name or address"));
        }
        let port = match port {
            None => default_port,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => {
                    return Err(format!("{text:?}: the port must be 1..=65535 (got {p:?})"))
                }
                Ok(port) => port,
            },
        };
        Ok(Endpoint::new(host, port))
    }

    /// The same node, however its name was written (`Broker.A` = `broker.a`).
    fn same_as(&self, other: &Endpoint) -> bool {
        self.port == other.port && self.host.eq_ignore_ascii_case(&other.host)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Checks `[north]`, noting each problem in `p`; `max_payload_bytes` is
/// the south's, which a north packet must carry.
pub(super) fn check(
    raw: &RawNorth,
    gateway: &GatewayId,
    max_payload_bytes: usize,
    p: &mut Problems,
) -> Option<NorthConfig> {
    let endpoints = p.take(endpoints(raw));
    p.take(in_range(
        "north.prefer_first_check_s",
        raw.prefer_first_check_s,
        1,
        86_400,
    ));
    let prefer_first = raw
        .prefer_first
        .then(|| Duration::from_secs(raw.prefer_first_check_s));
    p.take(in_range("north.keep_alive_s", raw.keep_alive_s, 5, 3600));
    p.take(in_range(
        "north.puback_timeout_ms",
        raw.puback_timeout_ms,
        PUBACK_TIMEOUT_MS.0,
        PUBACK_TIMEOUT_MS.1,
    ));
    let mqtt_version = p.take(MqttVersion::parse("north.mqtt_version", &raw.mqtt_version));
    p.take(in_range(
        "north.ack_timeout_ms",
        raw.ack_timeout_ms,
        100,
        3_600_000,
    ));
    p.take(in_range("north.max_inflight", raw.max_inflight, 1, 1000));
    p.take(in_range("north.batch_max", raw.batch_max, 1, 1000));
    p.take(in_range(
        "north.batch_linger_ms",
        raw.batch_linger_ms,
        0,
        10_000,
    ));
    if raw.max_packet_bytes < max_payload_bytes + 4096 {
        p.note(ConfigError::new(
            "north.max_packet_bytes",
            format!(
                "must be at least south.max_payload_bytes + 4096 = {} (got {}): a message \
                 a device may send must fit in a north packet",
                max_payload_bytes + 4096,
                raw.max_packet_bytes
            ),
        ));
    }
    p.take(in_range(
        "north.max_packet_bytes",
        raw.max_packet_bytes,
        0,
        crate::protocol::MQTT_MAX_PACKET,
    ));
    p.take(topic_segment("north.topic_prefix", &raw.topic_prefix));
    let client_id = if raw.client_id.is_empty() {
        format!("ferry-{gateway}")
    } else {
        raw.client_id.clone()
    };
    let credentials = p.take(credentials("north", &raw.username, &raw.password));
    let tls = p.take(tls::client("north.tls", &raw.tls));
    Some(NorthConfig {
        endpoints: endpoints?,
        prefer_first,
        client_id,
        credentials: credentials?,
        keep_alive: Duration::from_secs(raw.keep_alive_s),
        puback_timeout: Duration::from_millis(raw.puback_timeout_ms),
        mqtt_version: mqtt_version?,
        ack_timeout: Duration::from_millis(raw.ack_timeout_ms),
        max_inflight: raw.max_inflight,
        batch_max: raw.batch_max,
        batch_linger: Duration::from_millis(raw.batch_linger_ms),
        prefix: format!("{}/{}", raw.topic_prefix, gateway),
        max_packet_bytes: raw.max_packet_bytes,
        tls: tls?,
    })
}

/// `north.endpoints`, or `north.host`/`north.port` as a list of one.
fn endpoints(raw: &RawNorth) -> Result<Vec<Endpoint>, ConfigError> {
    if raw.port == 0 {
        return Err(ConfigError::new("north.port", "must be 1..=65535"));
    }
    if raw.endpoints.is_empty() {
        if raw.host.trim().is_empty() {
            return Err(ConfigError::new("north.host", "must not be empty"));
        }
        // As before endpoints: any host name or address (an IPv6 one bare).
        let one = Endpoint::new(raw.host.trim(), raw.port);
        return Ok(vec![one]);
    }
    if raw.host != RawNorth::default().host {
        return Err(ConfigError::new(
            "north.endpoints",
            format!(
                "set together with north.host = {:?}: list every address in north.endpoints \
                 and remove north.host",
                raw.host
            ),
        ));
    }
    if raw.endpoints.len() > MAX_ENDPOINTS {
        return Err(ConfigError::new(
            "north.endpoints",
            format!(
                "at most {MAX_ENDPOINTS} addresses (got {})",
                raw.endpoints.len()
            ),
        ));
    }
    let mut checked: Vec<Endpoint> = Vec::with_capacity(raw.endpoints.len());
    for (i, text) in raw.endpoints.iter().enumerate() {
        let key = format!("north.endpoints[{i}]");
        let endpoint = Endpoint::parse(text, raw.port).map_err(|e| ConfigError::new(&key, e))?;
        if let Some(first) = checked.iter().position(|e| e.same_as(&endpoint)) {
            return Err(ConfigError::new(
                &key,
                format!("{endpoint} is north.endpoints[{first}] again"),
            ));
        }
        checked.push(endpoint);
    }
    Ok(checked)
}
