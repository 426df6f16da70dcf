//! What the benchmarks share, so that each bench file reads as one
//! benchmark:
//! - [`harness`]: the integration tests' harness (Mosquitto, the `ferry`
//!   binary, raw MQTT), compiled in;
//! - [`Env`] here: the gateway with production settings on a real
//!   Mosquitto upstream; [`external`]: the same with ferry as a client of a
//!   second Mosquitto, the site broker;
//! - [`load`]: uplink devices on [`ferry::mqtt::Session`], windowed or
//!   paced, and what they saw; [`drain`]: devices draining their inboxes
//!   in a reconnect storm;
//! - [`plain`]: plain MQTT publishers and a consumer, for the brokers
//!   ferry is compared with; [`arrivals`]: the end-to-end consumer's tally;
//!   [`paths`]: the compare bench's four paths through brokers and ferry;
//! - [`backend`]: the backends (one that acks every uplink, one that
//!   counts downlink receipts);
//! - [`procfs`], [`cpu`]: readings from /proc and CPU use over a phase;
//! - [`timeline`]: the storm's per-second timeline, sampled on a thread;
//! - [`report`]: how figures are printed; [`stages`]: ferry's uplink
//!   stage histograms over a phase, from two scrapes of its `/metrics`;
//! - the pieces of the benches' clap flags that are alike.
//!
//! No bench polls an MQTT event loop of its own: every client is a
//! [`ferry::mqtt::Session`] (or the harness's hand-encoded `RawMqtt`).
#![allow(dead_code)]

pub mod arrivals;
pub mod backend;
pub mod cpu;
pub mod drain;
pub mod external;
pub mod load;
pub mod paths;
pub mod plain;
pub mod procfs;
pub mod report;
pub mod stages;
pub mod timeline;

use std::time::Duration;

use ferry::config::RawConfig;
use ferry::ids::DeviceId;
use ferry::mqtt::MqttVersion;

/// The integration tests' harness, compiled into each bench as well.
#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports)]
pub mod harness;

use harness::{Ferry, FerryOpts, Mosquitto};

#[allow(unused_imports)]
pub use procfs::{
    clock_ticks_per_s, cores, cpu_ticks, raise_fd_limit, reset_peak_rss, thread_ticks, vm_kib,
};

// -------------------------------------------------------------------- flags

/// `cargo bench` runs every bench binary with `--bench`: accepted, ignored.
#[derive(clap::Args, Debug, Clone)]
pub struct CargoBench {
    #[arg(long = "bench", hide = true)]
    _bench: bool,
}

/// A clap value parser: whole seconds as a `Duration`.
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    s.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| format!("`{s}` is not a whole number of seconds"))
}

/// Exits with clap's usage error for a flag value that parsed but is out of
/// range.
pub fn invalid<A: clap::CommandFactory>(message: String) -> ! {
    A::command()
        .error(clap::error::ErrorKind::ValueValidation, message)
        .exit()
}

/// A clap value parser: an MQTT version as the config writes it, "3.1.1"
/// or "5".
pub fn parse_mqtt_version(s: &str) -> Result<MqttVersion, String> {
    MqttVersion::parse("--mqtt", s).map_err(|e| e.reason)
}

/// Whether device `i` connects with MQTT 5 when `share` (0..=1) of a fleet
/// does: spread evenly over the indices (0.5 = every other device, from the
/// second), so `floor(n · share)` of the first n devices speak MQTT 5.
pub fn speaks_v5(i: usize, share: f64) -> bool {
    ((i + 1) as f64 * share).floor() > (i as f64 * share).floor()
}

/// The benches' device `i`: `dev-{i}`.
pub fn device_id(i: usize) -> DeviceId {
    DeviceId::new(format!("dev-{i}")).expect("dev-{i} is a device id")
}

// -------------------------------------------------------------- environment

/// The gateway and its upstream, torn down (ferry first) on drop.
pub struct Env {
    pub ferry: Ferry,
    pub mosquitto: Mosquitto,
    pub ferry_pid: u32,
    pub mosquitto_pid: u32,
}

impl Env {
    /// Mosquitto, and ferry as `gateway` on it with [`production_opts`],
    /// then `change`.
    pub fn start(gateway: &str, change: impl FnOnce(&mut RawConfig)) -> Env {
        Env::start_opts(gateway, |opts| opts.with(change))
    }

    /// [`Env::start`], changing the whole options (e.g. device passwords).
    pub fn start_opts(gateway: &str, change: impl FnOnce(FerryOpts) -> FerryOpts) -> Env {
        let mosquitto = Mosquitto::start();
        let ferry = Ferry::start(change(production_opts(gateway, mosquitto.port)));
        Env {
            ferry_pid: ferry.pid().unwrap_or(0),
            mosquitto_pid: mosquitto.pid().unwrap_or(0),
            ferry,
            mosquitto,
        }
    }
}

/// ferry as `gateway` on the upstream at `north_port`, with the production
/// timings of conf/ferry.toml (not the tests' short ones). The per-device
/// input limits stay out of the way, as in [`FerryOpts::new`]: a bench
/// device sends far faster than `south.rate_per_s` lets a field device.
pub fn production_opts(gateway: &str, north_port: u16) -> FerryOpts {
    let production = RawConfig::default();
    FerryOpts::new(gateway, north_port).with(|c| {
        c.north.ack_timeout_ms = production.north.ack_timeout_ms;
        c.north.keep_alive_s = production.north.keep_alive_s;
        c.retry = production.retry;
    })
}
