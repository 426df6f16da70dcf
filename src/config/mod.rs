//! Configuration: a TOML file plus `FERRY_<SECTION>__<KEY>` environment
//! overrides, read in two layers.
//!
//! [`RawConfig`] mirrors the file (every field documented, every field
//! defaulted, unknown keys refused); [`Config::load`] turns it into checked,
//! typed values once. Past this module nobody parses a string or checks a
//! range again. Every error names the key it is about.
//!
//! It is a leaf: every section's checked type, every bound a key is
//! checked against, the closed choices as enums and the password file's
//! format ([`passwords`]) are defined here or below (ids, backoff's retry
//! policy, protocol's packet limit), never imported from the parts that
//! use them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::backoff::RetryConfig;
use crate::ids::{DeviceId, GatewayId};

mod admin;
mod check;
mod listeners;
mod load;
mod north;
/// Where the package installs the config: the file the commands read
/// when `-c` is not given.
pub const DEFAULT_FILE: &str = "/etc/ferry/ferry.toml";

pub mod passwords;
mod raw;
mod south;
mod sparkplug;
mod store;
mod tls;
mod version;
pub use admin::{AdminConfig, Host, HostName, MAX_ALLOWED_HOSTS};
use check::{in_range, Problems};
pub use check::{ConfigError, ConfigErrors};
pub use north::{Endpoint, NorthConfig, MAX_ENDPOINTS};
pub use raw::*;
pub use south::{ExternalSouth, RateLimit, SouthAuth, SouthConfig, SouthMode, MAX_UNANSWERED};
pub use store::{RefusalShares, StoreConfig, SyncMode, TOTAL_SHARE_OF_BUDGET};
pub use tls::{ClientTls, ListenerTls};
pub use version::MqttVersion;

/// How log events are written to stderr (the journal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One readable line per event.
    Text,
    /// One JSON object per line: timestamp, level, target, message and
    /// every field by name.
    Json,
}

impl LogFormat {
    /// `log.format`'s value: "text" or "json".
    fn parse(value: &str) -> Result<LogFormat, ConfigError> {
        match value {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(ConfigError::new(
                "log.format",
                format!("must be \"text\" or \"json\" (got {other:?})"),
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub gateway: GatewayId,
    pub data_dir: PathBuf,
    pub south: SouthConfig,
    /// `[south.sparkplug]`: Sparkplug B edge nodes (None: off).
    pub sparkplug: Option<crate::protocol::sparkplug::edge::SparkplugTopics>,
    pub north: NorthConfig,
    pub retry: RetryConfig,
    pub store: StoreConfig,
    pub downlink: DownlinkConfig,
    /// Group name (without `@`) → members.
    pub groups: BTreeMap<String, Vec<DeviceId>>,
    pub log_level: String,
    pub log_format: LogFormat,
    /// `shutdown.grace_s`: from the signal to exit, at most.
    pub shutdown_grace: Duration,
    pub alerts: AlertsConfig,
    /// `[admin]`: where the admin HTTP server listens and the names it
    /// answers to (`None`: `admin.listen` is empty, no admin server).
    pub admin: Option<AdminConfig>,
    /// The file it was read from, and what it said (with the environment's
    /// overrides), for a reload to compare against (`None`: not read from
    /// a file).
    pub source: Option<std::sync::Arc<Source>>,
}

/// Where a [`Config`] came from.
#[derive(Debug)]
pub struct Source {
    pub path: PathBuf,
    pub raw: RawConfig,
}

/// `[alerts]`, checked: how long each condition lasts before it is raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlertsConfig {
    pub north_down: Duration,
    pub backlog_age: Duration,
    pub backend_silent: Duration,
}

#[derive(Debug, Clone)]
pub struct DownlinkConfig {
    pub batch_size: usize,
    pub confirm_timeout: Duration,
    pub queue_cap: u64,
}

impl Config {
    /// Reads `path`, applies environment overrides and checks every key;
    /// refused, it names every problem, not only the first.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let (raw, mut problems) = RawConfig::read(path)?;
        let from_env = raw.from_env.clone();
        let kept = raw.clone();
        let checked = Config::from_raw(raw);
        if let Err(more) = &checked {
            problems.extend(more.iter().map(|e| load::blame_env(e.clone(), &from_env)));
        }
        match checked {
            Ok(mut config) if problems.is_empty() => {
                config.source = Some(std::sync::Arc::new(Source {
                    path: path.to_owned(),
                    raw: kept,
                }));
                Ok(config)
            }
            _ => Err(ConfigErrors::from_vec(problems)),
        }
    }

    pub fn from_raw(raw: RawConfig) -> Result<Config, ConfigErrors> {
        let mut p = Problems::default();
        let config = Config::check(raw, &mut p);
        p.finish(config)
    }

    /// Every check, each problem noted in `p`; `None` when any was.
    fn check(raw: RawConfig, p: &mut Problems) -> Option<Config> {
        let gateway = p.take(GatewayId::new(raw.gateway.id.clone()).map_err(|e| {
            ConfigError::new("gateway.id", format!("{e}; use [A-Za-z0-9._-]{{1,64}}"))
        }));
        if raw.gateway.data_dir.as_os_str().is_empty() {
            p.note(ConfigError::new(
                "gateway.data_dir",
                "must name a directory",
            ));
        }
        // The sections below name their own keys; a bad gateway.id (noted
        // above) stands in as "gateway" so they are checked all the same.
        let named = gateway
            .clone()
            .unwrap_or_else(|| GatewayId::new("gateway".to_string()).expect("a valid id"));
        let south = south::check(&raw.south, &named, p);
        let sparkplug = sparkplug::check(&raw.south.sparkplug, p);
        let north = north::check(&raw.north, &named, raw.south.max_payload_bytes, p);
        p.take(in_range("retry.base_ms", raw.retry.base_ms, 1, 86_400_000));
        if raw.retry.max_ms < raw.retry.base_ms {
            p.note(ConfigError::new(
                "retry.max_ms",
                "must be at least retry.base_ms",
            ));
        }
        p.take(in_range(
            "retry.max_attempts",
            raw.retry.max_attempts,
            1,
            1_000_000,
        ));
        if !(0.0..=1.0).contains(&raw.retry.jitter) {
            p.note(ConfigError::new(
                "retry.jitter",
                format!("must be between 0.0 and 1.0 (got {})", raw.retry.jitter),
            ));
        }

        let store = store::check(&raw.store, p);
        p.take(in_range(
            "alerts.north_down_s",
            raw.alerts.north_down_s,
            1,
            604_800,
        ));
        p.take(in_range(
            "alerts.backend_silent_s",
            raw.alerts.backend_silent_s,
            1,
            604_800,
        ));
        let admin = admin::check(&raw.admin, p);
        p.take(in_range(
            "alerts.backlog_age_s",
            raw.alerts.backlog_age_s,
            1,
            31_536_000,
        ));

        p.take(in_range(
            "downlink.batch_size",
            raw.downlink.batch_size,
            1,
            1000,
        ));
        p.take(in_range(
            "downlink.confirm_timeout_ms",
            raw.downlink.confirm_timeout_ms,
            100,
            3_600_000,
        ));
        p.take(in_range(
            "downlink.queue_cap",
            raw.downlink.queue_cap,
            1,
            10_000_000,
        ));
        let mut groups = BTreeMap::new();
        for (name, members) in &raw.groups {
            let key = format!("groups.{name}");
            if let Err(e) = DeviceId::new(name.as_str()) {
                p.note(ConfigError::new(&key, format!("bad group name: {e}")));
            }
            let mut checked = Vec::with_capacity(members.len());
            for m in members {
                match DeviceId::new(m.as_str()) {
                    Ok(id) => checked.push(id),
                    Err(e) => p.note(ConfigError::new(&key, format!("bad device id {m:?}: {e}"))),
                }
            }
            groups.insert(name.clone(), checked);
        }

        p.take(in_range("shutdown.grace_s", raw.shutdown.grace_s, 1, 3600));
        let log_format = p.take(LogFormat::parse(&raw.log.format));
        Some(Config {
            gateway: gateway?,
            data_dir: raw.gateway.data_dir,
            south: south?,
            sparkplug,
            north: north?,
            retry: RetryConfig {
                base: Duration::from_millis(raw.retry.base_ms),
                max: Duration::from_millis(raw.retry.max_ms),
                max_attempts: raw.retry.max_attempts,
                jitter: raw.retry.jitter,
            },
            store: store?,
            downlink: DownlinkConfig {
                batch_size: raw.downlink.batch_size,
                confirm_timeout: Duration::from_millis(raw.downlink.confirm_timeout_ms),
                queue_cap: raw.downlink.queue_cap,
            },
            groups,
            log_level: raw.log.level,
            log_format: log_format?,
            shutdown_grace: Duration::from_secs(raw.shutdown.grace_s),
            alerts: AlertsConfig {
                north_down: Duration::from_secs(raw.alerts.north_down_s),
                backlog_age: Duration::from_secs(raw.alerts.backlog_age_s),
                backend_silent: Duration::from_secs(raw.alerts.backend_silent_s),
            },
            admin: admin?,
            source: None,
        })
    }
}

#[cfg(test)]
mod tests;
