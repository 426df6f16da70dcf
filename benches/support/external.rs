//! External mode (docs/EXTERNAL.md): devices talk to a site broker, a
//! second Mosquitto, and ferry is one more client of it
//! (`south.mode = "external"`), with the same upstream as in embedded mode.
//!
//! The harness's `Ferry::start` waits for ferry's own south listener, which
//! external mode does not open; [`SiteClient`] starts the same binary on
//! the same kind of config and is ready when a probe device on the site
//! broker gets a `stored` receipt, which proves ferry's south session is
//! subscribed (messages published before that would reach nobody).

use std::fs::{self, OpenOptions};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use ferry::config::RawConfig;
use ferry::ids::{DeviceId, MsgId};
use ferry::mqtt::{Event, Options, Session};
use ferry::protocol::envelope::WireEnvelope;
use ferry::protocol::receipt::{Receipt, ReceiptStatus};
use ferry::protocol::topics::DeviceTopics;
use serde_json::json;

use super::harness::config::to_toml;
use super::harness::proc::kill_and_reap;
use super::harness::{ferry_command, file_tail, free_port, Mosquitto};
use super::production_opts;

/// The site broker's settings for the bench (docs/EXTERNAL.md): ferry may
/// have 1,000 device messages in flight, nothing queued is dropped, and the
/// broker's small writes are not held by Nagle's algorithm (Mosquitto's
/// default; with it, a receipt waits for the device's delayed ACK and the
/// stored p50 at 2,000 msgs/s is 43 ms instead of 0.6 ms). Persistence
/// stays off (the harness's default): the bench measures throughput, not
/// broker restarts.
pub const SITE_BROKER: [&str; 3] = [
    "max_inflight_messages 1000",
    "max_queued_messages 0",
    "set_tcp_nodelay true",
];

/// How long ferry may take to be subscribed on the site broker.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Both brokers and ferry as a client of the site one; torn down (ferry
/// first) on drop.
pub struct ExternalEnv {
    pub ferry: SiteClient,
    pub site: Mosquitto,
    pub upstream: Mosquitto,
    pub ferry_pid: u32,
    pub site_pid: u32,
    pub upstream_pid: u32,
}

impl ExternalEnv {
    /// The upstream, the site broker ([`SITE_BROKER`] and `site_conf`
    /// lines), and ferry as `gateway` with the production timings, then
    /// `change`; returns once ferry takes device messages from the site
    /// broker.
    pub async fn start(
        gateway: &str,
        site_conf: &[String],
        change: impl FnOnce(&mut RawConfig),
    ) -> Result<ExternalEnv, String> {
        let upstream = Mosquitto::start();
        let conf: Vec<&str> = SITE_BROKER
            .iter()
            .copied()
            .chain(site_conf.iter().map(String::as_str))
            .collect();
        let site = Mosquitto::start_with(&conf);
        let mut config = production_opts(gateway, upstream.port).config;
        change(&mut config);
        config.south.mode = "external".into();
        config.south.host = "127.0.0.1".into();
        config.south.port = site.port;
        let ferry = SiteClient::start(config)?;
        let env = ExternalEnv {
            ferry_pid: ferry.pid(),
            site_pid: site.pid().unwrap_or(0),
            upstream_pid: upstream.pid().unwrap_or(0),
            ferry,
            site,
            upstream,
        };
        if let Err(e) = probe(env.site.port).await {
            return Err(format!(
                "{e}\n--- ferry log tail ---\n{}\n--- site broker log tail ---\n{}",
                env.ferry.log_tail(),
                env.site.log_tail()
            ));
        }
        Ok(env)
    }
}

impl Drop for ExternalEnv {
    fn drop(&mut self) {
        // Ferry before the brokers it is a client of.
        self.ferry.kill();
    }
}

/// Publishes one envelope every 200 ms as device `bench-probe` on the site
/// broker until a `stored` receipt for one of them comes back.
async fn probe(port: u16) -> Result<(), String> {
    let device = DeviceId::new("bench-probe").expect("a device id");
    let topics = DeviceTopics::new("devices", &device);
    let mut opts = Options::new("probe", "127.0.0.1", port, device.as_str());
    opts.subscriptions = vec![topics.ack()];
    let (session, mut events) = Session::<()>::start(opts);
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut up = false;
    let mut n = 0;
    let result = loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                break Err(format!(
                    "external mode: no `stored` receipt for a probe on the site broker (port {port}) within {READY_TIMEOUT:?}"
                ));
            }
            _ = tick.tick(), if up => {
                n += 1;
                let msg_id = MsgId::new(format!("probe-{n}")).expect("a msg_id");
                let body = WireEnvelope::json(msg_id, json!("probe")).to_bytes();
                session.send(topics.up("probe"), body, false);
            }
            event = events.recv() => match event {
                Some(Event::Up { .. }) => up = true,
                Some(Event::Down) => up = false,
                Some(Event::Message(m)) => {
                    let stored = serde_json::from_slice::<Receipt>(&m.payload)
                        .is_ok_and(|r| r.status == ReceiptStatus::Stored);
                    if stored {
                        break Ok(());
                    }
                }
                Some(_) => {}
                None => break Err("external mode: the probe's session ended".into()),
            },
        }
    };
    session.close(None, Duration::from_secs(1)).await;
    result
}

/// The `ferry` binary in its own temp dir, as a client of the site broker;
/// killed on drop.
pub struct SiteClient {
    pub gateway: String,
    pub log_path: PathBuf,
    /// The admin server's port (its `/metrics`).
    pub admin_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl SiteClient {
    fn start(mut config: RawConfig) -> Result<SiteClient, String> {
        let dir = tempfile::Builder::new()
            .prefix("ferry-gw-")
            .tempdir()
            .map_err(|e| format!("temp dir for ferry: {e}"))?;
        // Unused in external mode; a free port rather than 1883.
        config.south.listen = format!("127.0.0.1:{}", free_port());
        let admin_port = std::iter::repeat_with(free_port)
            .find(|p| !config.south.listen.ends_with(&format!(":{p}")))
            .expect("a free port");
        config.admin.listen = format!("127.0.0.1:{admin_port}");
        config.gateway.data_dir = dir.path().join(&config.gateway.data_dir);
        let config_path = dir.path().join("ferry.toml");
        fs::write(&config_path, to_toml(&config)).map_err(|e| format!("write ferry.toml: {e}"))?;
        let log_path = dir.path().join("ferry.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("open ferry.log: {e}"))?;
        let child = ferry_command()
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| format!("ferry.log: {e}"))?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn ferry: {e}"))?;
        Ok(SiteClient {
            gateway: config.gateway.id.clone(),
            log_path,
            admin_port,
            dir,
            child: Some(child),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    pub fn log_tail(&self) -> String {
        file_tail(&self.log_path, 60)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }
}

impl Drop for SiteClient {
    fn drop(&mut self) {
        self.kill();
    }
}
