//! The config a test starts ferry with: ferry's own [`RawConfig`], the type
//! its loader deserializes, with short test timings, written out by
//! serializing it with `toml`. A test changes the fields it cares about;
//! there is no TOML written by hand that could drift from the loader.

use ferry::config::RawConfig;

use super::mosquitto::TlsListener;
use super::Mode;

/// ferry's config for one test; [`super::Ferry::start`] writes it and
/// starts the gateway on it.
#[derive(Clone, Debug)]
pub struct FerryOpts {
    /// The whole file. `Ferry::start` sets `south.listen` to a free port
    /// and reads a relative `gateway.data_dir` inside the gateway's own
    /// temp dir.
    pub config: RawConfig,
    /// Embedded broker, or a site Mosquitto `Ferry::start` starts for it.
    pub mode: Mode,
    /// Device logins. With any, embedded: `south.auth = "password"`, and
    /// `Ferry::start` writes them to the password file (argon2id); external:
    /// the site broker takes only these devices, by username. Either way
    /// the harness's clients log in with them.
    pub logins: Vec<(String, String)>,
    /// External mode: the site broker also listens with TLS, and ferry
    /// connects to that listener (devices keep the plain one). The test
    /// sets `south.site_tls` to match.
    pub site_tls: Option<TlsListener>,
    /// Extra environment for the `ferry run` process (systemd's
    /// `NOTIFY_SOCKET`, a test hook).
    pub env: Vec<(String, String)>,
    /// The gateway binary to run instead of the one under test (a copy of
    /// it under another name).
    pub binary: Option<std::path::PathBuf>,
}

impl FerryOpts {
    /// ferry's defaults, except for test timings: gateway `gateway`, the
    /// upstream Mosquitto on 127.0.0.1:`north_port`, a 5 s keep-alive,
    /// 2 s ack timeout, resends after 200 ms..2 s, 5 attempts, 1000
    /// devices, the store in `./data` and the log at `info`. The per-device
    /// input limits (`south.rate_per_s`, `south.burst`,
    /// `south.max_inflight_per_device`) are out of the way: test devices
    /// send thousands of messages at once, which a field device may not.
    /// tests/limits.rs sets them, or keeps ferry's defaults
    /// ([`FerryOpts::with_default_limits`]).
    pub fn new(gateway: &str, north_port: u16) -> FerryOpts {
        let mut c = RawConfig::default();
        c.gateway.id = gateway.to_string();
        c.gateway.data_dir = "data".into();
        c.south.listen = "127.0.0.1:0".to_string();
        c.south.max_connections = 1000;
        c.north.host = "127.0.0.1".to_string();
        c.north.port = north_port;
        c.north.keep_alive_s = 5;
        c.north.ack_timeout_ms = 2000;
        c.retry.base_ms = 200;
        c.retry.max_ms = 2000;
        c.retry.max_attempts = 5;
        c.retry.jitter = 0.2;
        c.log.level = "info".to_string();
        // A free port, picked by `Ferry::start` (see `Ferry::admin`).
        c.admin.listen = "127.0.0.1:0".to_string();
        c.south.rate_per_s = 1_000_000.0;
        c.south.burst = 1_000_000;
        c.south.max_inflight_per_device = ferry::config::MAX_UNANSWERED;
        FerryOpts {
            config: c,
            mode: Mode::Embedded,
            logins: Vec::new(),
            site_tls: None,
            env: Vec::new(),
            binary: None,
        }
    }

    /// These options with `change` applied to the config:
    /// `FerryOpts::new("gw", port).with(|c| c.south.max_connections = 3)`.
    pub fn with(mut self, change: impl FnOnce(&mut RawConfig)) -> FerryOpts {
        change(&mut self.config);
        self
    }

    /// These options with `key=value` in ferry's environment.
    pub fn with_env(mut self, key: &str, value: &str) -> FerryOpts {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// `ferry run` runs `binary` (a copy of ferry) instead.
    pub fn with_binary(mut self, binary: &std::path::Path) -> FerryOpts {
        self.binary = Some(binary.to_path_buf());
        self
    }

    /// Devices authenticate with passwords: `(device, password)` pairs (in
    /// embedded mode, in the password file `passwd` in the gateway's temp
    /// dir).
    pub fn with_passwords(mut self, logins: &[(&str, &str)]) -> FerryOpts {
        self.logins = logins
            .iter()
            .map(|(d, p)| (d.to_string(), p.to_string()))
            .collect();
        self
    }

    /// These options with ferry's own per-device input limits.
    pub fn with_default_limits(self) -> FerryOpts {
        let production = RawConfig::default();
        self.with(|c| {
            c.south.rate_per_s = production.south.rate_per_s;
            c.south.burst = production.south.burst;
            c.south.max_inflight_per_device = production.south.max_inflight_per_device;
        })
    }

    /// These options in south mode `mode`.
    pub fn in_mode(mut self, mode: Mode) -> FerryOpts {
        self.mode = mode;
        self
    }

    /// The config file, as `ferry run --config` reads it.
    pub fn to_toml(&self) -> String {
        to_toml(&self.config)
    }
}

/// Any raw config as a TOML file.
/// A `south.listeners` entry on `listen` (port 0: `Ferry::start` gives it
/// a free one) with this transport, on the default path.
pub fn listener(listen: &str, transport: &str) -> ferry::config::RawListener {
    ferry::config::RawListener {
        listen: listen.into(),
        transport: transport.into(),
        path: String::new(),
    }
}

pub fn to_toml(config: &RawConfig) -> String {
    toml::to_string(config).unwrap_or_else(|e| panic!("config to TOML: {e}\n{config:#?}"))
}
