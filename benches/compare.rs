//! Compare benchmark (issue 20): the same load, one path after another,
//! through
//! - (a) Mosquitto direct: publishers → one Mosquitto → the consumer;
//! - (b) a Mosquitto → Mosquitto bridge: publishers → a local Mosquitto
//!   with persistence and a `connection` to an upstream Mosquitto →
//!   the consumer on the upstream;
//! - (c) ferry embedded: devices → ferry's own broker → ferry (SQLite,
//!   `store.sync = full`) → the upstream Mosquitto → the backend;
//! - (d) ferry external: devices → a site Mosquitto → ferry as its client
//!   → the upstream Mosquitto → the backend (docs/EXTERNAL.md);
//! - (e) ferry embedded, plain devices: (a)'s publishers, whose PUBACK
//!   comes after the commit, on `south.plain_topics`, then as (c).
//!
//! Every path carries the same envelopes (`support::arrivals`: each
//! payload stamped with its send time, padded to `--payload-bytes`), QoS 1,
//! from `--publishers` clients that each keep at most `--window` messages
//! unacknowledged by the first hop (Mosquitto's PUBACK; ferry's `stored`
//! receipt). ferry's per-device limits are lifted (as in every bench), so
//! it takes the same load.
//!
//! Two phases per path: *saturated* (`--per` messages each, as fast as the
//! window allows) and *paced* (`--paced-per` messages each, `--rate`
//! msgs/s in total). The table: saturated end-to-end throughput; the
//! paced phase's end-to-end and first-hop latency p50/p99/p999; CPU per
//! message of every broker and gateway process; their peak RSS; each
//! figure also as a ratio to (b); for ferry, its uplink stages in the
//! paced phase (`support::stages`). The consumer counts every message
//! id: one missing or duplicated fails the run (exit 1).
//!
//! ```text
//! cargo bench --bench compare -- [--quick] [--publishers 100] [--per 2000]
//!     [--paced-per 500] [--rate 10000] [--payload-bytes 200] [--window 64]
//!     [--only a,b,c,d,e] [--timeout-s 120] [--quiet-wait-s 60]
//!     [--batch-max 1] [--batch-linger-ms 5]
//! ```

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use ferry::config::RawConfig;
use ferry::mqtt::MqttVersion;
use hdrhistogram::Histogram;

use support::arrivals::Arrived;
use support::cpu::{wait_for_quiet_machine, CpuSnapshot};
use support::load::{Fleet, PhaseCtx};
use support::paths::{Path, Setup};
use support::plain::PlainFleet;
use support::report::with_ratio;
use support::{cores, vm_kib, CargoBench};

/// The gateway's id in this bench.
const GATEWAY: &str = "bench-gw";
/// After the last expected arrival, how long the consumer keeps counting
/// (a duplicate that comes late still fails the run).
const SETTLE: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------- arguments

/// Compare benchmark: Mosquitto direct, a Mosquitto bridge, ferry embedded
/// and ferry external, under the same load.
#[derive(Parser, Clone, Debug)]
#[command(name = "compare")]
struct Args {
    /// A small run (20 publishers × 250, paced 20 × 250) that finishes in
    /// well under a minute; explicit size flags still win.
    #[arg(long)]
    quick: bool,
    /// Publishers (devices) [default: 100; --quick 20].
    #[arg(long)]
    publishers: Option<usize>,
    /// Messages each publisher sends in the saturated phase [default: 2000; --quick 250].
    #[arg(long)]
    per: Option<usize>,
    /// Messages each publisher sends in the paced phase [default: 500; --quick 250].
    #[arg(long)]
    paced_per: Option<usize>,
    /// Total msgs/s of the paced phase.
    #[arg(long, value_name = "MSGS_PER_S", default_value_t = 10_000.0)]
    rate: f64,
    /// Payload of each message (the stamp's padding), bytes.
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Most messages a publisher keeps unacknowledged by the first hop.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// ferry's `north.batch_max`: most uplinks in one publish north (1: no batches).
    #[arg(long, default_value_t = 1)]
    batch_max: usize,
    /// ferry's `north.batch_linger_ms`.
    #[arg(long, default_value_t = 5)]
    batch_linger_ms: u64,
    /// The paths to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "a,b,c,d")]
    only: Vec<Path>,
    /// Bound on each phase, seconds.
    #[arg(long = "timeout-s", value_name = "S", default_value = "120", value_parser = support::parse_secs)]
    timeout: Duration,
    /// How long to wait for other work on the machine to finish first, seconds.
    #[arg(long = "quiet-wait-s", value_name = "S", default_value = "60", value_parser = support::parse_secs)]
    quiet_wait: Duration,
    #[command(flatten)]
    _cargo: CargoBench,
}

/// The sizes in force.
#[derive(Clone, Copy)]
struct Sizes {
    publishers: usize,
    per: usize,
    paced_per: usize,
}

impl Args {
    fn parse_checked() -> (Args, Sizes) {
        let args = Args::parse();
        let (p, n, m) = if args.quick {
            (20, 250, 250)
        } else {
            (100, 2000, 500)
        };
        let sizes = Sizes {
            publishers: args.publishers.unwrap_or(p),
            per: args.per.unwrap_or(n),
            paced_per: args.paced_per.unwrap_or(m),
        };
        if sizes.publishers == 0 || sizes.per == 0 || sizes.paced_per == 0 || args.window == 0 {
            support::invalid::<Args>(
                "--publishers, --per, --paced-per and --window must be at least 1".into(),
            );
        }
        if !(args.rate > 0.0 && args.rate.is_finite()) {
            support::invalid::<Args>("--rate must be a number > 0".into());
        }
        if args.only.is_empty() {
            support::invalid::<Args>("--only needs at least one of a, b, c, d, e".into());
        }
        (args, sizes)
    }

    fn configure(&self, c: &mut RawConfig) {
        c.south.max_payload_bytes = 65536.max(self.payload_bytes + 1024);
        c.north.batch_max = self.batch_max;
        c.north.batch_linger_ms = self.batch_linger_ms;
    }
}

// ------------------------------------------------------------------- phases

struct PhaseOut {
    expected: u64,
    /// Acknowledged by the first hop (PUBACK / `stored`).
    first_hop: u64,
    first_publish_ns: u64,
    /// Publish → first-hop acknowledgement, µs.
    first_hop_us: Histogram<u64>,
    arrived: Arrived,
    /// (process, CPU seconds) over the phase.
    cpu_s: Vec<(String, f64)>,
    /// This bench's own CPU and the machine's, % of one core.
    bench_pct: f64,
    machine_pct: f64,
    /// Problems: each one line; any fails the run.
    problems: Vec<String>,
}

impl PhaseOut {
    fn e2e_rate(&self) -> f64 {
        let a = &self.arrived;
        if a.distinct == 0 || a.last_ns <= self.first_publish_ns {
            return 0.0;
        }
        a.distinct as f64 / ((a.last_ns - self.first_publish_ns) as f64 / 1e9)
    }

    fn cpu_us_per_msg(&self) -> f64 {
        self.cpu_s.iter().map(|(_, s)| s).sum::<f64>() * 1e6 / self.expected.max(1) as f64
    }
}

async fn run_phase(
    setup: &Setup,
    args: &Args,
    publishers: usize,
    messages: usize,
    rate: Option<f64>,
) -> Result<PhaseOut, String> {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let run_id = format!("c{unix_ms:x}{}", if rate.is_some() { "p" } else { "s" });
    let deadline = tokio::time::Instant::now() + args.timeout;
    let ctx = Arc::new(PhaseCtx {
        run_id: run_id.clone(),
        port: setup.port,
        mqtt: MqttVersion::V311,
        devices: publishers,
        messages,
        window: args.window,
        payload: "x".repeat(args.payload_bytes).into(),
        stamp: true,
        period: rate.map(|r| Duration::from_secs_f64(publishers as f64 / r)),
        origin: Instant::now(),
        deadline,
    });
    let expected = (publishers * messages) as u64;
    setup.arrivals.begin(&format!("{run_id}-"), ctx.origin);
    let mut problems = Vec::new();
    let bench_pid = std::process::id();
    let mut watched = setup.watched.clone();
    watched.push(("bench".into(), bench_pid));

    let (first_hop, first_publish_ns, first_hop_us, before, wall) = if setup.path.has_devices() {
        let fleet = Fleet::connect(ctx.clone()).await?;
        let before = CpuSnapshot::take(&watched);
        let wall = Instant::now();
        let s = fleet.run().await?;
        for (what, n) in [
            ("failed receipts", s.failed),
            ("rejected receipts", s.rejected),
            ("duplicate receipts", s.duplicate_receipts),
            ("receipt order/seq errors", s.order_or_seq_errors),
            ("device connections dropped", s.drops),
            ("devices timed out", s.devices_timed_out),
        ] {
            if n > 0 {
                problems.push(format!("{what}: {n}"));
            }
        }
        if s.stored != expected {
            problems.push(format!("`stored` receipts: {} of {expected}", s.stored));
        }
        (s.stored, s.first_publish_ns, s.latency_us, before, wall)
    } else {
        let fleet = PlainFleet::connect(ctx.clone()).await?;
        let before = CpuSnapshot::take(&watched);
        let wall = Instant::now();
        let p = fleet.run().await;
        for (what, n) in [
            ("publishes refused", p.refused),
            ("publisher connections dropped", p.drops),
            ("publishers timed out", p.publishers_timed_out),
        ] {
            if n > 0 {
                problems.push(format!("{what}: {n}"));
            }
        }
        if p.acked != expected {
            problems.push(format!("PUBACKs: {} of {expected}", p.acked));
        }
        (p.acked, p.first_publish_ns, p.ack_latency_us, before, wall)
    };
    setup.arrivals.wait_for(expected, deadline).await;
    let after = CpuSnapshot::take(&watched);
    let elapsed = wall.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    let arrived = setup
        .arrivals
        .end()
        .ok_or("the consumer's phase was ended by someone else")?;
    if arrived.distinct != expected {
        problems.push(format!(
            "LOST: {} of {expected} messages never reached the consumer",
            expected - arrived.distinct.min(expected)
        ));
    }
    if arrived.duplicates > 0 {
        problems.push(format!(
            "DUPLICATED: {} messages reached the consumer more than once",
            arrived.duplicates
        ));
        // What the gateway said meanwhile (a reconnect, a timeout, ...).
        if setup.path.is_ferry() {
            let said: Vec<String> = setup
                .log_tail()
                .lines()
                .filter(|l| {
                    l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("north_link")
                })
                .map(String::from)
                .collect();
            problems.push(format!("ferry's log meanwhile:\n{}", said.join("\n")));
        }
    }
    if arrived.unstamped > 0 {
        problems.push(format!("{} arrivals had no time stamp", arrived.unstamped));
    }
    let used = after.since(&before, &watched);
    let mut cpu_s: Vec<(String, f64)> = used
        .procs
        .iter()
        .map(|(label, pct)| (label.clone(), pct / 100.0 * elapsed))
        .collect();
    let bench_pct = cpu_s
        .pop()
        .map_or(0.0, |(_, s)| 100.0 * s / elapsed.max(1e-9));
    Ok(PhaseOut {
        expected,
        first_hop,
        first_publish_ns,
        first_hop_us,
        arrived,
        cpu_s,
        bench_pct,
        machine_pct: used.machine,
        problems,
    })
}

// ------------------------------------------------------------------- report

struct PathResult {
    path: Path,
    saturated: PhaseOut,
    paced: PhaseOut,
    /// (process, peak RSS KiB).
    rss_kib: Vec<(String, u64)>,
}

impl PathResult {
    fn rss_mib(&self) -> f64 {
        self.rss_kib.iter().map(|(_, k)| *k as f64).sum::<f64>() / 1024.0
    }
}

fn q_ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

const QS: [f64; 3] = [0.50, 0.99, 0.999];

fn latencies(h: &Histogram<u64>, b: Option<&Histogram<u64>>) -> String {
    if h.is_empty() {
        return "n/a".into();
    }
    QS.iter()
        .map(|q| with_ratio(q_ms(h, *q), b.map(|b| q_ms(b, *q)), 2))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn print_table(results: &[PathResult], sizes: Sizes, args: &Args) {
    let b = results.iter().find(|r| r.path == Path::B);
    println!();
    println!(
        "saturated: {} publishers × {} × {} B, window {}; paced: {} × {} at {:.0} msgs/s; QoS 1; (×r) = ratio to (b)",
        sizes.publishers,
        sizes.per,
        args.payload_bytes,
        args.window,
        sizes.publishers,
        sizes.paced_per,
        args.rate
    );
    println!();
    println!(
        "| path | saturated end-to-end msgs/s | paced end-to-end p50 / p99 / p999 ms | paced first hop p50 / p99 / p999 ms (PUBACK; ferry `stored`) | CPU µs/msg saturated | CPU µs/msg paced | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in results {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.path.label(),
            with_ratio(r.saturated.e2e_rate(), b.map(|b| b.saturated.e2e_rate()), 0),
            latencies(
                &r.paced.arrived.latency_us,
                b.map(|b| &b.paced.arrived.latency_us)
            ),
            latencies(&r.paced.first_hop_us, b.map(|b| &b.paced.first_hop_us)),
            with_ratio(
                r.saturated.cpu_us_per_msg(),
                b.map(|b| b.saturated.cpu_us_per_msg()),
                1
            ),
            with_ratio(
                r.paced.cpu_us_per_msg(),
                b.map(|b| b.paced.cpu_us_per_msg()),
                1
            ),
            with_ratio(r.rss_mib(), b.map(PathResult::rss_mib), 1),
        );
    }
    println!();
    for r in results {
        let per_proc = |p: &PhaseOut| {
            p.cpu_s
                .iter()
                .map(|(l, s)| format!("{l} {:.1}", s * 1e6 / p.expected.max(1) as f64))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let rss = r
            .rss_kib
            .iter()
            .map(|(l, k)| format!("{l} {:.1}", *k as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(", ");
        println!("{}:", r.path.label());
        println!(
            "  CPU µs/msg by process: saturated {}; paced {}",
            per_proc(&r.saturated),
            per_proc(&r.paced)
        );
        println!("  peak RSS MiB by process: {rss}");
        for (name, p) in [("saturated", &r.saturated), ("paced", &r.paced)] {
            let foreign = if p.arrived.foreign_ids.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.arrived.foreign_ids.join(", "))
            };
            println!(
                "  {name}: {} expected, {} first-hop acks, {} arrived, {} duplicates, {} foreign{foreign}; machine {:.0}% of {}00%, bench clients {:.0}%",
                p.expected,
                p.first_hop,
                p.arrived.distinct,
                p.arrived.duplicates,
                p.arrived.foreign,
                p.machine_pct,
                cores(),
                p.bench_pct
            );
        }
    }
}

// --------------------------------------------------------------------- main

fn main() {
    let (args, sizes) = Args::parse_checked();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(bench(args, sizes)) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

/// Runs every path; Ok(false) if a message was lost or duplicated (or
/// anything else went wrong that the table would hide).
async fn bench(args: Args, sizes: Sizes) -> Result<bool, String> {
    support::raise_fd_limit(4096);
    let before = wait_for_quiet_machine(args.quiet_wait).await;
    println!("ferry compare benchmark (issue 20)");
    println!(
        "  cores: {}; machine busy before start: {before:.0}% of {}00%",
        cores(),
        cores()
    );
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for &path in &args.only {
        println!("{} ...", path.label());
        let lifetime = args.timeout * 3 + Duration::from_secs(60);
        let setup = Setup::start(path, GATEWAY, lifetime, |c| args.configure(c)).await?;
        let saturated = run_phase(&setup, &args, sizes.publishers, sizes.per, None).await?;
        println!("  saturated: {:.0} msgs/s end to end", saturated.e2e_rate());
        let stages_before = setup.ferry_metrics();
        let paced = run_phase(
            &setup,
            &args,
            sizes.publishers,
            sizes.paced_per,
            Some(args.rate),
        )
        .await?;
        println!(
            "  paced: end to end p50 {:.2} ms, p99 {:.2} ms",
            q_ms(&paced.arrived.latency_us, 0.5),
            q_ms(&paced.arrived.latency_us, 0.99)
        );
        support::stages::print_phase("paced", stages_before, setup.ferry_metrics());
        let rss_kib = setup
            .watched
            .iter()
            .map(|(l, pid)| (l.clone(), vm_kib(*pid, "VmHWM").unwrap_or(0)))
            .collect();
        let mut failed = false;
        for (phase, p) in [("saturated", &saturated), ("paced", &paced)] {
            for problem in &p.problems {
                failures.push(format!("{} {phase}: {problem}", path.label()));
                failed = true;
            }
        }
        if failed {
            println!("  log tail:");
            for line in setup.log_tail().lines() {
                println!("  | {line}");
            }
        }
        let Setup { far, running, .. } = setup;
        far.stop().await;
        drop(running);
        results.push(PathResult {
            path,
            saturated,
            paced,
            rss_kib,
        });
    }
    print_table(&results, sizes, &args);
    if failures.is_empty() {
        println!("\nPASS: every message reached the consumer exactly once on every path");
        Ok(true)
    } else {
        println!();
        for f in &failures {
            println!("FAIL: {f}");
        }
        Ok(false)
    }
}
