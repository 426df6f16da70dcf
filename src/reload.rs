//! `systemctl reload` (SIGHUP): the whole config file (and the `FERRY_*`
//! environment) read and checked again, as at start.
//!
//! - A file with any problem is refused as a whole: one WARN
//!   (`config_reload_refused`) per problem, naming its key; the running
//!   settings stay.
//! - Otherwise the keys that changed are found by comparing what the file
//!   says now with what it said when last applied ([`changed`]). Those
//!   that can change live ([`is_live`]) are applied at once, each through
//!   its part's own channel ([`Live`]); the others are named in one WARN
//!   (`config_reload_needs_restart`), never half-applied: until a restart
//!   the gateway runs on what it had. One INFO (`config_reloaded`) lists
//!   what was applied.
//! - The password file is read again by the embedded broker's own SIGHUP
//!   handler (`south::auth`), whatever the config says.
//! - Every TLS device listener reads its certificate, key, client CA and
//!   CRL files again (the paths it started with: a rotated certificate is
//!   put in place of the old one): new handshakes use them, connected
//!   devices stay. A listener whose files cannot be read keeps what it had
//!   (WARN `tls_reload_failed`).
//! - North is handed how to reach the upstream on every reload
//!   ([`crate::north::reach`]: nodes, login, keep-alive, stall bound, TLS
//!   files read again): the session stays on a node still listed and
//!   leaves one that is not (`mqtt::session`'s `reach.rs`).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{
    AlertsConfig, Config, DownlinkConfig, NorthConfig, RateLimit, RawConfig, Source, SouthMode,
};
use crate::protocol::topics::Topics;
use crate::retention::Retention;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::uplink::scheduler::SchedulerConfig;

/// Sets the log filter (`log.level`) while running; given by the binary,
/// which owns the subscriber.
pub type LevelSetter = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

static LOG_LEVEL: OnceLock<LevelSetter> = OnceLock::new();
static LOG_FORMAT: OnceLock<LevelSetter> = OnceLock::new();

/// The binary hands over how to change the log level live (once).
pub fn set_log_level_setter(setter: LevelSetter) {
    let _ = LOG_LEVEL.set(setter);
}

/// ... and the log format (`"text"` or `"json"`).
pub fn set_log_format_setter(setter: LevelSetter) {
    let _ = LOG_FORMAT.set(setter);
}

/// The keys applied live, as written in the file (`section.key`); a
/// section name alone covers every key in it.
const LIVE: &[&str] = &[
    "log.level",
    "log.format",
    "south.rate_per_s",
    "south.burst",
    "south.max_inflight_per_device",
    "south.plain_topics",
    "downlink",
    "north.ack_timeout_ms",
    "north.max_inflight",
    "north.host",
    "north.port",
    "north.endpoints",
    "north.prefer_first",
    "north.prefer_first_check_s",
    "north.username",
    "north.password",
    "north.keep_alive_s",
    "north.puback_timeout_ms",
    "north.tls",
    "retry.base_ms",
    "retry.max_ms",
    "retry.jitter",
    "retry.max_attempts",
    "alerts",
    "store.retention_days",
    "store.dead_letter_retention_days",
    "store.min_dedup_s",
    "store.max_db_bytes",
    "store.dead_letter_share_rows",
    "store.dead_letter_share_bytes",
    "store.dead_letter_total_bytes",
];

/// Whether a changed key is applied without a restart.
pub fn is_live(key: &str) -> bool {
    LIVE.iter()
        .any(|l| key == *l || key.strip_prefix(l).is_some_and(|r| r.starts_with('.')))
}

/// What the parts that change live listen on.
pub struct Live {
    pub alerts: watch::Sender<AlertsConfig>,
    pub retention: watch::Sender<Retention>,
    /// `south.rate_per_s`/`burst` and `south.max_inflight_per_device`.
    pub limits: watch::Sender<(RateLimit, usize)>,
    /// The uplink scheduler's: ack timeout, messages in flight, backoff.
    pub uplink: watch::Sender<SchedulerConfig>,
    /// `[downlink]` (batch size, confirm timeout, queue cap) and
    /// `retry.max_attempts` (for receipts north).
    pub downlink: watch::Sender<(DownlinkConfig, u32)>,
    /// How north reaches the upstream ([`crate::north::reach`]): handed
    /// over on every reload, so certificate files rotated in place are
    /// read again.
    pub north: watch::Sender<NorthConfig>,
    /// The store, for `store.max_db_bytes` and the dead-letter shares.
    pub store: Store,
    /// The gateway's topics, for `south.plain_topics`.
    pub topics: Topics,
}

impl Live {
    /// Each part's settings as `cfg` has them.
    pub fn of(cfg: &Config, store: Store, topics: Topics) -> Live {
        Live {
            alerts: watch::Sender::new(cfg.alerts),
            retention: watch::Sender::new(Live::retention_of(cfg)),
            limits: watch::Sender::new((cfg.south.rate, cfg.south.max_inflight_per_device)),
            uplink: watch::Sender::new(SchedulerConfig::of(&cfg.north, cfg.retry)),
            downlink: watch::Sender::new((cfg.downlink.clone(), cfg.retry.max_attempts)),
            north: watch::Sender::new(cfg.north.clone()),
            store,
            topics,
        }
    }

    pub fn retention_of(cfg: &Config) -> Retention {
        Retention {
            delivered: cfg.store.retention,
            dead: cfg.store.dead_letter_retention,
            min_dedup: cfg.store.min_dedup,
        }
    }
}

/// The keys whose values differ between `old` and `new`, as `section.key`
/// (deeper tables joined with `.`; a list is one key), sorted.
pub fn changed(old: &RawConfig, new: &RawConfig) -> Vec<String> {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten(
        "",
        &serde_json::to_value(old).unwrap_or(Value::Null),
        &mut a,
    );
    flatten(
        "",
        &serde_json::to_value(new).unwrap_or(Value::Null),
        &mut b,
    );
    let mut keys: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// Answers every SIGHUP until the shutdown: see the module's doc.
pub async fn run(source: Arc<Source>, live: Live, mut shutdown: Shutdown) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        warn!(
            event = "config_reload_unavailable",
            "cannot listen for SIGHUP: the config is read at start only"
        );
        return;
    };
    let mut applied = source.raw.clone();
    loop {
        tokio::select! {
            _ = shutdown.begun() => return,
            got = hangups.recv() => if got.is_none() { return },
        }
        reload(&source, &mut applied, &live);
    }
}

/// One reload: see the module's doc. `applied` is what the file said when
/// last applied; it becomes what it says now, for what was applied.
fn reload(source: &Source, applied: &mut RawConfig, live: &Live) {
    let path = source.path.display().to_string();
    let (raw, cfg) = match RawConfig::load(&source.path)
        .and_then(|raw| Config::from_raw(raw.clone()).map(|cfg| (raw, cfg)))
    {
        Ok(loaded) => loaded,
        Err(problems) => {
            for p in problems.iter() {
                warn!(event = "config_reload_refused", path = %path, key = %p.key, problem = %p.reason, "config reload refused: the running settings stay");
            }
            return;
        }
    };
    let mut tls = reload_tls();
    if cfg.north.tls.is_some() {
        let sep = if tls.is_empty() { "" } else { ", " };
        tls = format!("{tls}{sep}north TLS files (from the next connection)");
    }
    let keys = changed(applied, &raw);
    // The north session takes its settings on every reload: a certificate
    // rotated in place is read again, and nothing else moves it.
    live.north.send_replace(cfg.north.clone());
    if keys.is_empty() {
        info!(event = "config_reloaded", path = %path, applied = %tls, "config reloaded: nothing changed");
        return;
    }
    let (now, later): (Vec<&String>, Vec<&String>) = keys.iter().partition(|k| is_live(k));
    let mut done = Vec::new();
    for key in &now {
        match apply(key, &cfg, live) {
            Ok(()) => done.push(key.as_str()),
            Err(why) => {
                warn!(event = "config_reload_not_applied", key = %key, problem = %why, "a changed setting could not be applied live; it stays as it was")
            }
        }
    }
    // What was applied is now what the file says; the rest still differs.
    if let (Ok(old), Ok(new)) = (serde_json::to_value(&*applied), serde_json::to_value(&raw)) {
        let mut merged = old;
        for key in &done {
            set_at(&mut merged, key, lookup(&new, key));
        }
        if let Ok(m) = serde_json::from_value::<RawConfig>(merged) {
            *applied = RawConfig {
                from_env: applied.from_env.clone(),
                ..m
            };
        }
    }
    if !later.is_empty() {
        let keys: Vec<&str> = later.iter().map(|k| k.as_str()).collect();
        warn!(event = "config_reload_needs_restart", path = %path, keys = %keys.join(", "), "changed in the config but not applied: these take a restart (systemctl restart ferry); until then the gateway runs on the old values");
    }
    if !tls.is_empty() {
        done.push(&tls);
    }
    info!(event = "config_reloaded", path = %path, applied = %done.join(", "), "config reloaded");
}

/// The device listeners' TLS files read again; what to list as applied
/// ("" when no listener serves TLS, or none could read its files).
fn reload_tls() -> String {
    let mut ok = 0;
    for (cert, outcome) in rumqttd::reload_tls() {
        match outcome {
            Ok(()) => ok += 1,
            Err(e) => {
                warn!(event = "tls_reload_failed", cert = %cert, error = %e, "a TLS listener could not read its certificate, key, CA or CRL again; it keeps the ones it had")
            }
        }
    }
    if ok > 0 {
        format!(
            "south TLS files ({ok} listener{})",
            if ok == 1 { "" } else { "s" }
        )
    } else {
        String::new()
    }
}

/// Applies one live key from the checked `cfg`.
fn apply(key: &str, cfg: &Config, live: &Live) -> Result<(), String> {
    if key == "log.level" {
        if std::env::var_os("RUST_LOG").is_some() {
            return Err("RUST_LOG is set, and it wins over log.level".into());
        }
        let set = LOG_LEVEL
            .get()
            .ok_or("this process's log filter cannot be changed")?;
        return set(&cfg.log_level);
    }
    if key.starts_with("downlink.") || key == "retry.max_attempts" {
        live.downlink
            .send_replace((cfg.downlink.clone(), cfg.retry.max_attempts));
        if key.starts_with("downlink.") {
            return Ok(());
        }
    }
    if key.starts_with("north.") && !matches!(key, "north.ack_timeout_ms" | "north.max_inflight") {
        // Sent above, with every reload.
        return Ok(());
    }
    if key.starts_with("north.") || key.starts_with("retry.") {
        live.uplink
            .send_replace(SchedulerConfig::of(&cfg.north, cfg.retry));
        return Ok(());
    }
    if key == "south.plain_topics" {
        if !matches!(cfg.south.mode, SouthMode::Embedded) {
            return Err("in external mode the site broker's subscriptions and ACL are set at start: restart to change them".into());
        }
        live.topics.set_plain(cfg.south.plain_topics.clone());
        return Ok(());
    }
    if key.starts_with("south.") {
        live.limits
            .send_replace((cfg.south.rate, cfg.south.max_inflight_per_device));
        return Ok(());
    }
    if key == "log.format" {
        let set = LOG_FORMAT
            .get()
            .ok_or("this process's log format cannot be changed")?;
        return set(match cfg.log_format {
            crate::config::LogFormat::Json => "json",
            crate::config::LogFormat::Text => "text",
        });
    }
    if key.starts_with("alerts.") {
        live.alerts.send_replace(cfg.alerts);
        return Ok(());
    }
    if key == "store.max_db_bytes" || key.starts_with("store.dead_letter_") {
        live.store
            .set_budget(cfg.store.max_db_bytes, cfg.store.refusals);
        if key != "store.dead_letter_retention_days" {
            return Ok(());
        }
    }
    if key.starts_with("store.") {
        live.retention.send_replace(Live::retention_of(cfg));
        return Ok(());
    }
    Err("no live path for it".into())
}

fn lookup(v: &Value, key: &str) -> Value {
    key.split('.')
        .try_fold(v, |v, k| v.get(k))
        .cloned()
        .unwrap_or(Value::Null)
}

fn set_at(v: &mut Value, key: &str, value: Value) {
    let mut at = v;
    let parts: Vec<&str> = key.split('.').collect();
    for k in &parts[..parts.len() - 1] {
        let Some(next) = at.get_mut(*k) else { return };
        at = next;
    }
    if let Some(map) = at.as_object_mut() {
        map.insert(parts[parts.len() - 1].to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_changed_keys_are_named_and_sorted_live_or_not() {
        let old = RawConfig::default();
        let mut new = old.clone();
        new.log.level = "debug".into();
        new.north.client_id = "x".into();
        new.alerts.backlog_age_s += 1;
        assert_eq!(
            changed(&old, &new),
            ["alerts.backlog_age_s", "log.level", "north.client_id"]
        );
        assert!(is_live("log.level") && is_live("alerts.backlog_age_s"));
        assert!(is_live("store.retention_days") && is_live("south.burst"));
        assert!(!is_live("south.burst_x") && !is_live("south.listen"));
        assert!(is_live("south.plain_topics") && !is_live("south.plain_down"));
        assert!(is_live("retry.base_ms") && is_live("retry.max_attempts"));
        assert!(is_live("north.port") && is_live("north.tls.ca_file"));
        assert!(!is_live("north.client_id") && is_live("store.max_db_bytes"));
        assert!(is_live("store.dead_letter_share_rows") && !is_live("store.sync"));
        assert!(is_live("log.format"));
        assert!(changed(&old, &old.clone()).is_empty());
    }
}
