//! The compare bench's four paths (benches/compare.rs), each started from
//! scratch with its consumer at the far end:
//! - (a) Mosquitto direct: publishers → one Mosquitto → a [`Consumer`];
//! - (b) a bridge: publishers → a local Mosquitto with persistence and a
//!   `connection` to an upstream Mosquitto → a [`Consumer`] there, ready
//!   once a probe crossed the bridge;
//! - (c) ferry embedded ([`Env`]) and (d) ferry external ([`ExternalEnv`]):
//!   devices → ferry → the upstream → an [`AckingBackend`] that records
//!   what it gets;
//! - (e) ferry embedded with plain devices: (a)'s publishers (no
//!   envelope, PUBACK after the commit) on `bench/{i}`, ferry's
//!   `south.plain_topics = ["bench/{device}"]`, then as (c).
//!
//! Every consumer records into the path's [`Arrivals`]; [`Setup::watched`]
//! names the broker and gateway processes whose CPU and memory count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use ferry::config::RawConfig;

use super::arrivals::Arrivals;
use super::backend::AckingBackend;
use super::cpu::Watched;
use super::external::ExternalEnv;
use super::harness::admin::try_get;
use super::harness::Mosquitto;
use super::plain::{probe_path, Consumer, TOPIC_ROOT};
use super::Env;

/// How long a bridge may take to carry its first message.
const BRIDGE_UP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long after the first probe crossed the bridge the others may take.
const PROBE_SETTLE: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum Path {
    /// (a) Mosquitto direct.
    A,
    /// (b) Mosquitto → Mosquitto bridge with persistence.
    B,
    /// (c) ferry embedded.
    C,
    /// (d) ferry external, behind a site Mosquitto.
    D,
    /// (e) ferry embedded, the publishers plain devices.
    E,
}

impl Path {
    pub fn label(self) -> &'static str {
        match self {
            Path::A => "(a) Mosquitto direct",
            Path::B => "(b) Mosquitto → Mosquitto bridge",
            Path::C => "(c) ferry embedded",
            Path::D => "(d) ferry external",
            Path::E => "(e) ferry embedded, plain devices",
        }
    }

    pub fn is_ferry(self) -> bool {
        matches!(self, Path::C | Path::D | Path::E)
    }

    /// Whether the publishers are ferry's envelope devices (waiting for
    /// `stored` receipts), not plain MQTT publishers (waiting for PUBACKs).
    pub fn has_devices(self) -> bool {
        matches!(self, Path::C | Path::D)
    }
}

/// What a path keeps running while it is measured; dropped at its end
/// (ferry before its brokers).
pub enum Running {
    Direct(Mosquitto),
    Bridge {
        local: Mosquitto,
        upstream: Mosquitto,
    },
    Embedded(Box<Env>),
    External(Box<ExternalEnv>),
}

/// The consumer at the far end of a path.
pub enum FarEnd {
    Consumer(Consumer),
    Backend(AckingBackend),
}

impl FarEnd {
    pub async fn stop(self) {
        match self {
            FarEnd::Consumer(c) => c.stop().await,
            FarEnd::Backend(b) => b.stop().await,
        }
    }
}

pub struct Setup {
    pub path: Path,
    pub running: Running,
    pub far: FarEnd,
    pub arrivals: Arc<Arrivals>,
    /// Where the publishers connect.
    pub port: u16,
    /// The broker and gateway processes of the path.
    pub watched: Watched,
}

/// The local broker's bridge to `upstream`: persistence (set by the
/// harness), no queue or in-flight cap (the harness's
/// `max_queued_messages 0`, `max_inflight_messages 0`), QoS 1 out, a
/// persistent bridge session.
fn bridge_lines(upstream: u16) -> Vec<String> {
    vec![
        "autosave_interval 60".into(),
        "connection upstream".into(),
        format!("address 127.0.0.1:{upstream}"),
        format!("topic {TOPIC_ROOT}/# out 1"),
        "cleansession false".into(),
        "bridge_protocol_version mqttv311".into(),
        "try_private true".into(),
        "restart_timeout 1".into(),
        "start_type automatic".into(),
    ]
}

impl Setup {
    /// Starts `path`; its consumer runs for at most `lifetime`; ferry's
    /// config (c, d) gets `configure` after the benches' production options.
    pub async fn start(
        path: Path,
        gateway: &str,
        lifetime: Duration,
        configure: impl FnOnce(&mut RawConfig),
    ) -> Result<Setup, String> {
        let arrivals = Arc::new(Arrivals::new());
        let pid = |m: &Mosquitto| m.pid().unwrap_or(0);
        // Ferry's far end (c, d): the acking backend on the upstream at
        // `port`, recording into this path's arrivals.
        let backend =
            |port| AckingBackend::start_recording(port, gateway, lifetime, Some(arrivals.clone()));
        let setup = match path {
            Path::A => {
                let m = Mosquitto::start();
                let far = Consumer::start(m.port, arrivals.clone(), lifetime).await?;
                Setup {
                    path,
                    port: m.port,
                    watched: vec![("mosquitto".into(), pid(&m))],
                    running: Running::Direct(m),
                    far: FarEnd::Consumer(far),
                    arrivals,
                }
            }
            Path::B => {
                let upstream = Mosquitto::start();
                let lines = bridge_lines(upstream.port);
                let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
                let local = Mosquitto::start_persistent_with(&lines);
                let far = Consumer::start(upstream.port, arrivals.clone(), lifetime).await?;
                arrivals.begin("probe-", Instant::now());
                if let Err(e) = probe_path(local.port, &arrivals, BRIDGE_UP_TIMEOUT).await {
                    return Err(format!(
                        "bridge: {e}\n--- local broker log tail ---\n{}",
                        local.log_tail()
                    ));
                }
                // Probes still crossing the bridge land before the first phase.
                tokio::time::sleep(PROBE_SETTLE).await;
                Setup {
                    path,
                    port: local.port,
                    watched: vec![
                        ("local mosquitto".into(), pid(&local)),
                        ("upstream mosquitto".into(), pid(&upstream)),
                    ],
                    running: Running::Bridge { local, upstream },
                    far: FarEnd::Consumer(far),
                    arrivals,
                }
            }
            Path::C | Path::E => {
                let env = Env::start(gateway, |c| {
                    configure(c);
                    if path == Path::E {
                        c.south.plain_topics = vec![format!("{TOPIC_ROOT}/{{device}}")];
                    }
                });
                let far = backend(env.mosquitto.port).await?;
                Setup {
                    path,
                    port: env.ferry.south_port,
                    watched: vec![
                        ("ferry".into(), env.ferry_pid),
                        ("upstream mosquitto".into(), env.mosquitto_pid),
                    ],
                    running: Running::Embedded(Box::new(env)),
                    far: FarEnd::Backend(far),
                    arrivals,
                }
            }
            Path::D => {
                let env = ExternalEnv::start(gateway, &[], configure).await?;
                let far = backend(env.upstream.port).await?;
                Setup {
                    path,
                    port: env.site.port,
                    watched: vec![
                        ("site mosquitto".into(), env.site_pid),
                        ("ferry".into(), env.ferry_pid),
                        ("upstream mosquitto".into(), env.upstream_pid),
                    ],
                    running: Running::External(Box::new(env)),
                    far: FarEnd::Backend(far),
                    arrivals,
                }
            }
        };
        Ok(setup)
    }

    /// ferry's `/metrics` now (c, d); `None` for the brokers' paths.
    pub fn ferry_metrics(&self) -> Option<Result<String, String>> {
        let url = match &self.running {
            Running::Embedded(env) => env.ferry.admin_url("/metrics"),
            Running::External(env) => {
                format!("http://127.0.0.1:{}/metrics", env.ferry.admin_port)
            }
            Running::Direct(_) | Running::Bridge { .. } => return None,
        };
        Some(match try_get(&url) {
            Ok((200, body)) => Ok(body),
            Ok((code, body)) => Err(format!("GET {url}: {code} {body}")),
            Err(e) => Err(format!("GET {url}: {e}")),
        })
    }

    pub fn log_tail(&self) -> String {
        match &self.running {
            Running::Direct(m) => m.log_tail(),
            Running::Bridge { local, upstream } => format!(
                "local broker:\n{}\nupstream broker:\n{}",
                local.log_tail(),
                upstream.log_tail()
            ),
            Running::Embedded(env) => env.ferry.log_tail(),
            Running::External(env) => env.ferry.log_tail(),
        }
    }
}
