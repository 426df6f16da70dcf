//! Uplink benchmark: N devices → the real `ferry` binary (SQLite store) →
//! a real Mosquitto upstream → one backend that acks everything.
//!
//! The south side is ferry's embedded broker (`--south embedded`, the
//! default), or a second Mosquitto as the site broker with ferry as its
//! client (`--south external`, docs/EXTERNAL.md); the devices connect to
//! whichever broker that is.
//!
//! It measures what a device and a backend see, nothing internal:
//! - stored-receipt throughput: `stored` receipts per second, first publish
//!   to last `stored`;
//! - end-to-end throughput: first publish to the last `delivered` receipt
//!   (the backend committed it and said `ok`, ferry told the device);
//! - stored-receipt latency (just before `publish` → `stored` arrives),
//!   p50/p90/p99/max, in a saturation phase and in a paced phase;
//! - ferry's peak RSS (VmHWM) and the CPU each process used.
//!
//! Phases: *saturation* (every device keeps at most `--window` messages
//! without a `stored` receipt outstanding, as a real device would) and then
//! *paced* (a fixed schedule per device at half the saturation stored rate,
//! or `--rate`). Every loop is bounded by `--timeout-s` per phase; a phase
//! that runs out of time reports what arrived and says `INCOMPLETE`. The
//! devices and the backend are in `support::load` and `support::backend`.
//!
//! ```text
//! cargo bench --bench uplink -- [--devices 100] [--messages-per-device 2000]
//!     [--payload-bytes 200] [--rate R] [--window 64] [--mode both|saturation|paced]
//!     [--south embedded|external] [--site-conf LINE]... [--mqtt 3.1.1|5]
//!     [--sync full|normal] [--max-inflight N]
//!     [--timeout-s 120] [--quiet-wait-s 120]
//! ```

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use ferry::config::RawConfig;
use ferry::mqtt::MqttVersion;

use support::backend::AckingBackend;
use support::cpu::{wait_for_quiet_machine, CpuSnapshot, CpuUse, Watched};
use support::external::{ExternalEnv, SITE_BROKER};
use support::load::{Fleet, PhaseCtx, Seen};
use support::{cores, vm_kib, CargoBench, Env};

/// The gateway's id in this bench.
const GATEWAY: &str = "bench-gw";

// ---------------------------------------------------------------- arguments

/// Which phases to run.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
enum Mode {
    Both,
    Saturation,
    Paced,
}

/// Which broker the devices talk to.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
enum South {
    /// ferry's own broker.
    Embedded,
    /// A second Mosquitto, with ferry as its client.
    External,
}

/// Uplink benchmark: N devices → ferry → Mosquitto → one backend.
#[derive(Parser, Clone, Debug)]
#[command(name = "uplink")]
struct Args {
    /// Devices (N).
    #[arg(long, default_value_t = 100)]
    devices: usize,
    /// Messages each device sends per phase.
    #[arg(long, default_value_t = 2000)]
    messages_per_device: usize,
    /// Payload of each message, bytes.
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Total msgs/s for the paced phase; 0 = half the saturation stored rate.
    #[arg(long, value_name = "MSGS_PER_S", default_value_t = 0.0)]
    rate: f64,
    /// Most messages a device keeps without a `stored` receipt.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Phases to run.
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    mode: Mode,
    /// The south broker: ferry's own, or a site Mosquitto (south.mode = "external").
    #[arg(long, value_enum, default_value_t = South::Embedded)]
    south: South,
    /// With `--south external`: a line added to the site broker's
    /// mosquitto.conf (repeatable), e.g. "set_tcp_nodelay true".
    #[arg(long, value_name = "LINE")]
    site_conf: Vec<String>,
    /// The MQTT version the devices (publishers) connect with.
    #[arg(long, value_name = "3.1.1|5", default_value = "3.1.1", value_parser = support::parse_mqtt_version)]
    mqtt: MqttVersion,
    /// store.sync.
    #[arg(long, default_value = "full", value_parser = ["full", "normal"])]
    sync: String,
    /// north.max_inflight (ferry's default when not given).
    #[arg(long, value_name = "N")]
    max_inflight: Option<u32>,
    /// Bound on each phase, seconds.
    #[arg(long = "timeout-s", value_name = "S", default_value = "120", value_parser = support::parse_secs)]
    timeout: Duration,
    /// How long to wait for other work on the machine to finish first, seconds.
    #[arg(long = "quiet-wait-s", value_name = "S", default_value = "120", value_parser = support::parse_secs)]
    quiet_wait: Duration,
    #[command(flatten)]
    _cargo: CargoBench,
}

impl Args {
    /// The flags, checked; exits with a usage error on a bad one.
    fn parse_checked() -> Args {
        let args = Args::parse();
        if args.devices == 0 || args.messages_per_device == 0 || args.window == 0 {
            support::invalid::<Args>(
                "--devices, --messages-per-device and --window must be at least 1".into(),
            );
        }
        if !(args.rate >= 0.0 && args.rate.is_finite()) {
            support::invalid::<Args>("--rate must be a number ≥ 0".into());
        }
        args
    }

    /// ferry's config beyond the production defaults.
    fn configure(&self, c: &mut RawConfig) {
        c.south.max_payload_bytes = 65536.max(self.payload_bytes + 1024);
        c.store.sync = self.sync.clone();
        if let Some(m) = self.max_inflight {
            c.north.max_inflight = m as usize;
        }
    }
}

// -------------------------------------------------------------- environment

/// ferry and the brokers around it, in either mode.
enum Setup {
    Embedded(Box<Env>),
    External(Box<ExternalEnv>),
}

impl Setup {
    async fn start(args: &Args) -> Result<Setup, String> {
        Ok(match args.south {
            South::Embedded => {
                Setup::Embedded(Box::new(Env::start(GATEWAY, |c| args.configure(c))))
            }
            South::External => Setup::External(Box::new(
                ExternalEnv::start(GATEWAY, &args.site_conf, |c| args.configure(c)).await?,
            )),
        })
    }

    /// Where the devices connect.
    fn device_port(&self) -> u16 {
        match self {
            Setup::Embedded(env) => env.ferry.south_port,
            Setup::External(env) => env.site.port,
        }
    }

    fn upstream_port(&self) -> u16 {
        match self {
            Setup::Embedded(env) => env.mosquitto.port,
            Setup::External(env) => env.upstream.port,
        }
    }

    fn ferry_pid(&self) -> u32 {
        match self {
            Setup::Embedded(env) => env.ferry_pid,
            Setup::External(env) => env.ferry_pid,
        }
    }

    /// The processes whose CPU the report shows.
    fn watched(&self) -> Watched {
        let mut watched = vec![("ferry".to_string(), self.ferry_pid())];
        match self {
            Setup::Embedded(env) => watched.push(("mosquitto".into(), env.mosquitto_pid)),
            Setup::External(env) => {
                watched.push(("site mosquitto".into(), env.site_pid));
                watched.push(("upstream mosquitto".into(), env.upstream_pid));
            }
        }
        watched.push(("bench clients".into(), std::process::id()));
        watched.retain(|(_, pid)| *pid != 0);
        watched
    }

    fn log_tail(&self) -> String {
        match self {
            Setup::Embedded(env) => env.ferry.log_tail(),
            Setup::External(env) => env.ferry.log_tail(),
        }
    }
}

// ------------------------------------------------------------------- phases

struct PhaseResult {
    name: String,
    rate_target: Option<f64>,
    expected: u64,
    seen: Seen,
    cpu: CpuUse,
    elapsed: Duration,
}

impl PhaseResult {
    fn complete(&self) -> bool {
        let s = &self.seen;
        s.stored == self.expected && s.delivered + s.failed == self.expected
    }
}

async fn run_phase(
    args: &Args,
    name: &str,
    port: u16,
    rate_target: Option<f64>,
    watched: &Watched,
) -> Result<PhaseResult, String> {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let ctx = Arc::new(PhaseCtx {
        run_id: format!("b{unix_ms:x}{}", &name[..1]),
        port,
        mqtt: args.mqtt,
        devices: args.devices,
        messages: args.messages_per_device,
        window: args.window,
        payload: "x".repeat(args.payload_bytes).into(),
        stamp: false,
        period: rate_target.map(|r| Duration::from_secs_f64(args.devices as f64 / r)),
        origin: Instant::now(),
        deadline: tokio::time::Instant::now() + args.timeout,
    });
    // Every device connected and subscribed before anyone publishes.
    let fleet = Fleet::connect(ctx).await?;
    let cpu_before = CpuSnapshot::take(watched);
    let wall = Instant::now();
    let seen = fleet.run().await?;
    Ok(PhaseResult {
        name: name.to_string(),
        rate_target,
        expected: (args.devices * args.messages_per_device) as u64,
        seen,
        elapsed: wall.elapsed(),
        cpu: CpuSnapshot::take(watched).since(&cpu_before, watched),
    })
}

// ------------------------------------------------------------------- report

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn print_phase(r: &PhaseResult) {
    let label = match r.rate_target {
        Some(rate) => format!("{} at {rate:.0} msgs/s", r.name),
        None => r.name.clone(),
    };
    let status = if r.complete() {
        "complete"
    } else {
        "INCOMPLETE"
    };
    let s = &r.seen;
    let h = &s.latency_us;
    println!(
        "phase: {label} ({status}, {:.1} s)",
        r.elapsed.as_secs_f64()
    );
    println!(
        "  messages: {} expected, {} published, {} stored, {} delivered",
        r.expected, s.published, s.stored, s.delivered
    );
    println!("  stored throughput: {:.0} msgs/s", s.stored_rate());
    println!("  end-to-end throughput: {:.0} msgs/s", s.e2e_rate());
    println!(
        "  stored latency ms: p50 {} p90 {} p99 {} max {} (n = {})",
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.90)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
        h.len()
    );
    println!(
        "  missing receipts: stored {}, delivered {}",
        r.expected.saturating_sub(s.stored + s.failed),
        r.expected.saturating_sub(s.delivered + s.failed)
    );
    println!(
        "  anomalies: failed {}, rejected {}, duplicate receipts {}, order/seq errors {}, unparsable {}, late from earlier phase {}",
        s.failed, s.rejected, s.duplicate_receipts, s.order_or_seq_errors, s.unparsable, s.foreign
    );
    println!(
        "  device links: connections dropped {}, reconnects {}, resent {}, devices timed out {}",
        s.drops, s.reconnects, s.resent, s.devices_timed_out
    );
    let list = |v: &[(String, f64)]| {
        v.iter()
            .map(|(l, pct)| format!("{l} {pct:.0}%"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ours: f64 = r.cpu.procs.iter().map(|(_, p)| p).sum();
    println!(
        "  cpu (100% = one core): machine {:.0}% of {}00%: {}, everything else {:.0}%",
        r.cpu.machine,
        cores(),
        list(&r.cpu.procs),
        (r.cpu.machine - ours).max(0.0)
    );
    println!("  ferry's busiest threads: {}", list(&r.cpu.ferry_threads));
    let others = r.cpu.machine - ours;
    if others > 25.0 {
        println!(
            "  warning: other work used {others:.0}% CPU during this phase; the figures above are low"
        );
    }
}

// --------------------------------------------------------------------- main

fn main() {
    let args = Args::parse_checked();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(bench(args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn bench(args: Args) -> Result<(), String> {
    let before = wait_for_quiet_machine(args.quiet_wait).await;
    let setup = Setup::start(&args).await?;
    let backend_lifetime = args.timeout * 3 + Duration::from_secs(60);
    let backend = AckingBackend::start(setup.upstream_port(), GATEWAY, backend_lifetime).await?;
    let watched = setup.watched();

    println!("ferry uplink benchmark");
    println!("  devices: {}", args.devices);
    println!("  device MQTT version: {}", args.mqtt.as_str());
    println!("  payload bytes: {}", args.payload_bytes);
    println!("  messages per device: {}", args.messages_per_device);
    println!("  window (unstored per device): {}", args.window);
    match args.south {
        South::Embedded => println!("  south: embedded broker"),
        South::External => println!(
            "  south: external, a site Mosquitto ({}) with ferry as its client",
            SITE_BROKER
                .iter()
                .copied()
                .chain(args.site_conf.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    println!("  store sync: {}", args.sync);
    if let Some(m) = args.max_inflight {
        println!("  north max_inflight: {m}");
    }
    println!("  cores: {}", cores());
    println!(
        "  machine busy before start: {before:.0}% of {}00%",
        cores()
    );

    let port = setup.device_port();
    let mut results = Vec::new();
    let mut saturation_rate = None;
    if args.mode != Mode::Paced {
        let r = run_phase(&args, "saturation", port, None, &watched).await?;
        print_phase(&r);
        saturation_rate = Some(r.seen.stored_rate());
        results.push(r);
    }
    if args.mode != Mode::Saturation {
        let rate = if args.rate > 0.0 {
            Some(args.rate)
        } else {
            saturation_rate.map(|r| r / 2.0).filter(|r| *r > 0.0)
        };
        match rate {
            Some(rate) => {
                let r = run_phase(&args, "paced", port, Some(rate), &watched).await?;
                print_phase(&r);
                results.push(r);
            }
            None => println!("phase: paced skipped (no --rate and no saturation rate)"),
        }
    }

    let stats = &backend.stats;
    println!(
        "backend: {} received, {} acked in {} ack messages, {} unparsable, {} connections dropped",
        stats.received.load(Ordering::Relaxed),
        stats.acked.load(Ordering::Relaxed),
        stats.ack_publishes.load(Ordering::Relaxed),
        stats.unparsable.load(Ordering::Relaxed),
        stats.drops.load(Ordering::Relaxed),
    );
    let kib = |k: Option<u64>| {
        k.map_or("n/a".to_string(), |k| {
            format!("{:.1} MiB", k as f64 / 1024.0)
        })
    };
    println!(
        "gateway memory: peak RSS (VmHWM) {}, RSS now {}",
        kib(vm_kib(setup.ferry_pid(), "VmHWM")),
        kib(vm_kib(setup.ferry_pid(), "VmRSS"))
    );
    backend.stop().await;
    if results.iter().any(|r| !r.complete()) {
        println!("ferry log tail:");
        for line in setup.log_tail().lines() {
            println!("  | {line}");
        }
    }
    drop(setup);
    Ok(())
}
