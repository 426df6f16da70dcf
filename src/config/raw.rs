//! The config file as written: serde structs mirroring conf/ferry.toml,
//! every field documented and defaulted, unknown keys refused by name, and
//! `FERRY_<SECTION>__<KEY>` environment overrides applied on top.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::check::{ConfigError, ConfigErrors};

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
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            listen: "127.0.0.1:9183".into(),
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
    /// External mode: the MQTT version ferry speaks to the site broker,
    /// "3.1.1" or "5".
    pub mqtt_version: String,
    /// Embedded mode: TLS on the device listener.
    pub tls: RawListenerTls,
    /// External mode: TLS to the site broker.
    pub site_tls: RawClientTls,
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
            auth: "none".into(),
            password_file: PathBuf::new(),
            allow_anonymous: false,
            max_payload_bytes: 65536,
            topic_prefix: "devices".into(),
            max_connections: 10_000,
            max_keep_alive_s: 600,
            max_session_expiry_s: 3600,
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
            mqtt_version: "3.1.1".into(),
            tls: RawListenerTls::default(),
            site_tls: RawClientTls::default(),
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
    /// The MQTT version ferry speaks to the upstream broker, "3.1.1" or "5".
    pub mqtt_version: String,
    /// Wait for the backend's ack before an attempt counts as failed.
    pub ack_timeout_ms: u64,
    /// Most unacked messages per device.
    pub max_inflight: usize,
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
            mqtt_version: "3.1.1".into(),
            ack_timeout_ms: 10_000,
            max_inflight: 32,
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
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            sync: "full".into(),
            max_batch: 2048,
            max_db_bytes: 8 << 30,
            retention_days: 30,
            dead_letter_retention_days: 90,
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

impl RawConfig {
    /// Reads the file and the environment; refuses unknown keys and values
    /// of the wrong type by name, every one of them, and names the
    /// environment variable when an override is the culprit.
    pub fn load(path: &Path) -> Result<RawConfig, ConfigErrors> {
        let (raw, problems) = RawConfig::read(path)?;
        if problems.is_empty() {
            Ok(raw)
        } else {
            Err(ConfigErrors::from_vec(problems))
        }
    }

    /// What [`RawConfig::load`] reads, with the keys it refuses left at
    /// their defaults and named in the problems returned beside it, so the
    /// checks of every other key still run. Err: the file cannot be read
    /// as TOML at all.
    pub(super) fn read(path: &Path) -> Result<(RawConfig, Vec<ConfigError>), ConfigErrors> {
        if !path.is_file() {
            return Err(ConfigError::new(
                "--config",
                format!("{} is not a readable file", path.display()),
            )
            .into());
        }
        let built = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix("FERRY")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true)
                    // The one list key: `FERRY_NORTH__ENDPOINTS=a:1883,b:1883`.
                    .list_separator(",")
                    .with_list_parse_key("north.endpoints"),
            )
            .build()
            .map_err(|e| from_config_error(&e))?;
        // The cache, not a deserialized copy: only it knows which value
        // came from the environment.
        let mut table = built
            .cache
            .clone()
            .into_table()
            .map_err(|e| from_config_error(&e))?;
        let mut problems = Vec::new();
        check_known_keys(&table, &mut problems);
        // What the kinds let through can still be wrong (a negative port,
        // a float for a count): each key is read on its own, so every bad
        // one is named, not only serde's first.
        for (section, keys) in sorted(&table) {
            let Ok(keys) = keys.clone().into_table() else {
                continue;
            };
            for (key, value) in sorted(&keys) {
                let name = format!("{section}.{key}");
                if problems
                    .iter()
                    .any(|p: &ConfigError| overlap(&p.key, &name))
                {
                    continue;
                }
                let one = config::Map::from([(
                    section.clone(),
                    config::Value::new(None, config::Map::from([(key.clone(), value.clone())])),
                )]);
                if let Err(e) = config::Value::new(None, one).try_deserialize::<RawConfig>() {
                    let mut e = from_config_error(&e);
                    if !e.key.starts_with(&name) {
                        e.key = name;
                    }
                    problems.push(blame(e, value));
                }
            }
        }
        for p in &problems {
            remove(&mut table, &p.key);
        }
        let mut raw: RawConfig = config::Value::new(None, table.clone())
            .try_deserialize()
            .map_err(|e| from_config_error(&e))?;
        for (section, value) in &table {
            env_keys(section, value, &mut raw.from_env);
        }
        Ok((raw, problems))
    }
}

/// Whether the keys `a` and `b` are the same or one holds the other
/// (`south` and `south.port`, `north.endpoints` and `north.endpoints[1]`).
fn overlap(a: &str, b: &str) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    long.strip_prefix(short)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// Takes the key `path` (`south.tls.cert`) out of `table`, so its default
/// stands in while the other keys are checked.
fn remove(table: &mut config::Map<String, config::Value>, path: &str) {
    let path = path.split('[').next().unwrap_or(path);
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    match rest {
        None => {
            table.remove(head);
        }
        Some(rest) => {
            if let Some(config::Value {
                kind: config::ValueKind::Table(inner),
                ..
            }) = table.get_mut(head)
            {
                remove(inner, rest);
            }
        }
    }
}

/// `map`'s entries by name, so problems come out in a stable order.
fn sorted<V>(map: &config::Map<String, V>) -> Vec<(&String, &V)> {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries
}

/// The environment variable that sets `key` (`south.port` →
/// `FERRY_SOUTH__PORT`).
fn env_var(key: &str) -> String {
    format!("FERRY_{}", key.replace('.', "__").to_uppercase())
}

/// `e`, naming the environment variable when `value` came from one: a
/// mistyped override is not the file's fault.
fn blame(mut e: ConfigError, value: &config::Value) -> ConfigError {
    let mut set = BTreeSet::new();
    env_keys(&e.key, value, &mut set);
    // A table (an unknown section) names its first variable.
    e.env = set.first().map(|key| env_var(key));
    e
}

/// Whether `value`, or anything in it, came from an environment variable.
fn from_environment(value: &config::Value) -> bool {
    if value.origin() == Some("the environment") {
        return true;
    }
    match &value.kind {
        config::ValueKind::Table(t) => t.values().any(from_environment),
        config::ValueKind::Array(a) => a.iter().any(from_environment),
        _ => false,
    }
}

/// Notes every key in `table` that [`RawConfig`] does not have, and every
/// value whose kind is not the key's.
fn check_known_keys(table: &config::Map<String, config::Value>, problems: &mut Vec<ConfigError>) {
    let known = serde_json::to_value(RawConfig::default()).expect("RawConfig serializes");
    for (section, value) in sorted(table) {
        if section == "groups" {
            // Free-form: every key is a group name, checked in from_raw.
            continue;
        }
        let Some(known_section) = known.get(section) else {
            problems.push(blame(
                ConfigError::new(section, "unknown section; see conf/ferry.toml for the keys"),
                value,
            ));
            continue;
        };
        check_table(section, value, known_section, problems);
    }
}

/// Notes each key in the table `value` (at `path`) that `known` lacks, and
/// each value of the wrong kind, looking into nested tables (`south.tls`).
fn check_table(
    path: &str,
    value: &config::Value,
    known: &serde_json::Value,
    problems: &mut Vec<ConfigError>,
) {
    let Ok(keys) = value.clone().into_table() else {
        problems.push(blame(
            ConfigError::new(path, "must be a table of keys"),
            value,
        ));
        return;
    };
    for (key, value) in sorted(&keys) {
        let name = format!("{path}.{key}");
        let Some(known_key) = known.get(key) else {
            problems.push(blame(
                ConfigError::new(&name, "unknown key; see conf/ferry.toml for the keys"),
                value,
            ));
            continue;
        };
        if known_key.is_object() {
            check_table(&name, value, known_key, problems);
        } else if let Some(wrong) = wrong_kind(value, known_key) {
            problems.push(blame(ConfigError::new(&name, wrong), value));
        }
    }
}

/// Why `value` cannot be the key whose default is `known`, when its kind
/// is wrong. The config crate would quietly turn `port = "1884"` into a
/// number; a quoted number is refused here instead, as TOML means it. An
/// environment variable has no kinds: its text is parsed (`1884` is a
/// number, `true` a bool), and anything may stand for a string.
fn wrong_kind(value: &config::Value, known: &serde_json::Value) -> Option<String> {
    use config::ValueKind as K;
    let env = value.origin() == Some("the environment");
    match (&value.kind, known) {
        (K::String(s), serde_json::Value::Number(_)) => Some(format!(
            "must be a number, not the string {s:?}{}",
            if env { "" } else { "; write it without quotes" }
        )),
        (K::String(s), serde_json::Value::Bool(_)) => Some(format!(
            "must be true or false, not the string {s:?}{}",
            if env { "" } else { "; write it without quotes" }
        )),
        (
            K::I64(_) | K::U64(_) | K::I128(_) | K::U128(_) | K::Float(_) | K::Boolean(_),
            serde_json::Value::String(_),
        ) if !env => Some("must be a string, in quotes".to_string()),
        (K::Float(f), serde_json::Value::Number(n)) if !n.is_f64() => {
            Some(format!("must be a whole number (got {f})"))
        }
        (
            K::Table(_),
            serde_json::Value::Number(_)
            | serde_json::Value::Bool(_)
            | serde_json::Value::String(_),
        ) => Some("must be a single value, not a table".to_string()),
        _ => None,
    }
}

fn from_config_error(e: &config::ConfigError) -> ConfigError {
    let text = e.to_string();
    // The config crate says "... for key `north.port` in ..." where it knows the key.
    let key = text
        .split("for key `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or("(file)")
        .to_string();
    // The key is said once, first; the file is the line's own prefix.
    let reason = match text.split_once(" for key `") {
        Some((reason, _)) => reason.to_string(),
        None => one_line(&text),
    };
    ConfigError {
        key,
        reason,
        env: None,
    }
}

/// Adds to `keys` the key paths under `path` that an environment variable
/// set.
fn env_keys(path: &str, value: &config::Value, keys: &mut BTreeSet<String>) {
    match &value.kind {
        config::ValueKind::Table(t) => {
            for (key, value) in t {
                env_keys(&format!("{path}.{key}"), value, keys);
            }
        }
        _ if from_environment(value) => {
            keys.insert(path.to_string());
        }
        _ => {}
    }
}

/// `e`, naming the environment variable when one set its key: a check of
/// a value's range refuses an override like a value in the file.
pub(super) fn blame_env(mut e: ConfigError, from_env: &BTreeSet<String>) -> ConfigError {
    let key = e.key.split('[').next().unwrap_or(&e.key).to_string();
    if from_env.contains(&key) {
        e.env = Some(env_var(&key));
    }
    e
}

/// A TOML parser's report on one line: its message lines without the
/// drawing of the source around the spot (`3 | [south`, `  ^`), which the
/// line and column already give, and without the trailing file name.
fn one_line(text: &str) -> String {
    let kept: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with('|') && !l.starts_with('^') && !l.contains(" | ")
        })
        .filter(|l| !l.starts_with("in "))
        .collect();
    let mut line = kept.join("; ");
    if let Some(at) = line.rfind(" in ") {
        if !line[at..].contains(';') {
            line.truncate(at);
        }
    }
    line
}
