//! Reconnect-storm benchmark: N devices, each with M downlink messages
//! queued while it was away, all connect to the real `ferry` binary at once
//! (with the client library's backoff and jitter) and drain their inboxes.
//!
//! Setup (not part of the storm's figures): a real Mosquitto upstream, the
//! gateway, and a backend (`ferry::client::backend`) that publishes M
//! envelopes on `ferry/{gw}/down`, each addressed to every device, and waits
//! for all N·M `stored` receipts.
//!
//! Storm: N `ferry::client::device::DeviceClient`s are started at once; each
//! confirms every inbox batch as soon as it has it. Measured from the moment
//! the first one is started:
//! - time until every device had its first `Connected` (and a timeline);
//! - drain time: until all N·M messages arrived (each device checks its seqs
//!   are 1..=M, contiguous, each message once; duplicates are counted);
//! - time until the backend had all N·M `delivered` receipts;
//! - confirm timeouts: ferry's WARN "downlink batch not confirmed in time;
//!   resending" lines (must be 0);
//! - ferry's peak RSS (VmHWM), for setup and storm separately, the bench
//!   process's own, CPU per process and per ferry thread;
//! - the kernel's listen-queue counters (system-wide) and the south
//!   listener's accept queue, sampled.
//!
//! Everything is bounded by `--timeout-s` (storm) and `--setup-timeout-s`;
//! a run that runs out of time reports what arrived and says INCOMPLETE.
//! The devices, the receipt counter, the timeline and the report helpers
//! are in `support::{drain, backend, timeline, report}`.
//!
//! ```text
//! cargo bench --bench storm -- [--devices 2000] [--per-device 100] [--batch 200]
//!     [--payload-bytes 100] [--confirm-timeout-ms 10000] [--sync full|normal]
//!     [--timeout-s 120] [--setup-timeout-s 300] [--log-level FILTER] [--save-log FILE]
//!     [--passwords] [--v5-share 0.5]
//! ```

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use ferry::client::device::{DeviceClient, DeviceOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use support::backend::{queue_downlinks, DownlinkLoad, Queued};
use support::drain::{by_version, device_task, DeviceReport, Live};
use support::procfs::tcp_ext;
use support::report::{
    busiest_threads, dist, log_summary, mib, pass, secs, tcp_ext_delta, CONFIRM_TIMEOUT_LINE,
};
use support::timeline::{self, connected_by, sampler};
use support::{
    clock_ticks_per_s, cpu_ticks, device_id, reset_peak_rss, speaks_v5, thread_ticks, vm_kib,
    CargoBench, Env,
};

/// conf/ferry.toml's log filter (the harness default is plain "info").
const PRODUCTION_LOG_LEVEL: &str = "info,rumqttd=warn,rustls::msgs::handshake=error";
/// Most device ids in one `to` list (keeps an envelope well under
/// south.max_payload_bytes = 64 KiB, which also bounds downlinks).
const MAX_TO: usize = 4000;
/// Marks of the connect timeline, in seconds.
const MARKS_S: [f64; 10] = [0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0];
/// Targets from the issue.
const TARGET_DRAIN_S: f64 = 30.0;
const TARGET_RSS_MB: f64 = 300.0;

// ---------------------------------------------------------------- arguments

/// Reconnect storm: N devices with M downlinks queued each connect at once
/// and drain their inboxes.
#[derive(Parser, Clone, Debug)]
#[command(name = "storm")]
struct Args {
    /// Devices (N).
    #[arg(long, default_value_t = 2000)]
    devices: usize,
    /// Downlink messages queued per device (M).
    #[arg(long, default_value_t = 100)]
    per_device: usize,
    /// downlink.batch_size, 1..=1000.
    #[arg(long, default_value_t = 200)]
    batch: usize,
    /// Approximate payload of each downlink, bytes.
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// downlink.confirm_timeout_ms, at least 100.
    #[arg(long, default_value_t = 10_000)]
    confirm_timeout_ms: u64,
    /// store.sync.
    #[arg(long, default_value = "full", value_parser = ["full", "normal"])]
    sync: String,
    /// Bound on the storm, seconds.
    #[arg(long = "timeout-s", value_name = "S", default_value = "120", value_parser = support::parse_secs)]
    timeout: Duration,
    /// Bound on the setup (queueing every message), seconds.
    #[arg(long = "setup-timeout-s", value_name = "S", default_value = "300", value_parser = support::parse_secs)]
    setup_timeout: Duration,
    /// ferry's log filter.
    #[arg(long, value_name = "FILTER", default_value = PRODUCTION_LOG_LEVEL)]
    log_level: String,
    /// Copy ferry's log here at the end (its temp dir is removed).
    #[arg(long, value_name = "FILE")]
    save_log: Option<String>,
    /// Devices log in with passwords (south.auth = "password"): the storm
    /// then includes one argon2 verification per device.
    #[arg(long)]
    passwords: bool,
    /// Share of the devices that connect with MQTT 5, 0..=1, spread evenly
    /// (0.5 = every other device); the others connect with MQTT 3.1.1.
    #[arg(long, value_name = "SHARE", default_value_t = 0.0)]
    v5_share: f64,
    #[command(flatten)]
    _cargo: CargoBench,
}

impl Args {
    /// The flags, checked; exits with a usage error on a bad one.
    fn parse_checked() -> Args {
        let args = Args::parse();
        if args.devices == 0 || args.per_device == 0 {
            support::invalid::<Args>("--devices and --per-device must be at least 1".into());
        }
        if !(1..=1000).contains(&args.batch) {
            support::invalid::<Args>("--batch must be in 1..=1000 (downlink.batch_size)".into());
        }
        if args.confirm_timeout_ms < 100 {
            support::invalid::<Args>("--confirm-timeout-ms must be at least 100".into());
        }
        if !(0.0..=1.0).contains(&args.v5_share) {
            support::invalid::<Args>("--v5-share must be in 0..=1".into());
        }
        args
    }
}

// -------------------------------------------------------------- environment

fn start_env(args: &Args, names: &[String]) -> Env {
    Env::start_opts("storm-gw", |opts| {
        let opts = opts.with(|c| {
            c.store.sync = args.sync.clone();
            c.log.level = args.log_level.clone();
            c.downlink.batch_size = args.batch;
            c.downlink.confirm_timeout_ms = args.confirm_timeout_ms;
            // Above the storm's devices: a CONNECT beyond it gets no CONNACK.
            c.south.max_connections = args.devices.max(10_000);
        });
        if !args.passwords {
            return opts;
        }
        let logins: Vec<(String, String)> =
            names.iter().map(|n| (n.clone(), password_of(n))).collect();
        let logins: Vec<(&str, &str)> = logins
            .iter()
            .map(|(n, p)| (n.as_str(), p.as_str()))
            .collect();
        opts.with_passwords(&logins)
    })
}

/// A device's password in a `--passwords` run.
fn password_of(device: &str) -> String {
    format!("pw-{device}")
}

// --------------------------------------------------------------------- main

fn main() {
    let args = Args::parse_checked();
    // Each device is a socket here and one in ferry (which inherits this).
    let nofile = support::raise_fd_limit((args.devices as u64 * 2 + 1024).max(8192));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(bench(args, nofile)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    // Device tasks may still hold sockets; don't wait for them.
    rt.shutdown_timeout(Duration::from_secs(1));
}

async fn bench(args: Args, nofile: u64) -> Result<(), String> {
    let total = (args.devices * args.per_device) as u64;
    if nofile < args.devices as u64 + 256 {
        return Err(format!(
            "RLIMIT_NOFILE is {nofile}, too low for {} devices",
            args.devices
        ));
    }
    let names: Vec<String> = (0..args.devices)
        .map(|i| device_id(i).to_string())
        .collect();
    let env = start_env(&args, &names);
    let hz = clock_ticks_per_s();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("ferry reconnect-storm benchmark");
    // What `speaks_v5` gives the first N devices.
    let v5 = (args.devices as f64 * args.v5_share).floor() as usize;
    println!(
        "  devices {} (MQTT 3.1.1 {}, MQTT 5 {v5}), messages per device {}, deliveries {total}, batch_size {}, confirm_timeout_ms {}, payload ~{} B",
        args.devices, args.devices - v5, args.per_device, args.batch, args.confirm_timeout_ms, args.payload_bytes
    );
    println!(
        "  store sync {}, log level {:?}, south max_connections {}, fd limit {nofile}, cores {cores}, passwords {}",
        args.sync,
        args.log_level,
        args.devices.max(10_000),
        args.passwords
    );

    // ------------------------------------------------ setup: queue everything
    let run = support::harness::boot_id();
    let msg_prefix = format!("storm-{run}-");
    let setup_start = Instant::now();
    let setup_deadline = setup_start + args.setup_timeout;
    let (stop_tx, stop_rx) = watch::channel(false);
    let load = DownlinkLoad {
        port: env.mosquitto.port,
        gateway: &env.ferry.gateway,
        devices: &names,
        per_device: args.per_device,
        payload_bytes: args.payload_bytes,
        msg_prefix: &msg_prefix,
        max_to: MAX_TO,
    };
    let Queued {
        stats,
        task: backend_task,
        envelopes,
    } = queue_downlinks(load, setup_deadline, stop_rx.clone())
        .await
        .map_err(|e| {
            let (limit, tail) = (args.setup_timeout, env.ferry.log_tail());
            format!("setup: INCOMPLETE after {limit:?}: {e}; ferry log tail:\n{tail}")
        })?;
    let setup_s = setup_start.elapsed().as_secs_f64();
    let rows = env
        .ferry
        .query_i64("SELECT count(*) FROM down_delivery", []);
    println!(
        "setup: {envelopes} envelopes on ferry/{{gw}}/down → {total}/{total} `stored` receipts in {setup_s:.1} s ({:.0} deliveries/s); down_delivery rows {rows}",
        total as f64 / setup_s.max(1e-3)
    );
    // Let the store settle (WAL checkpoint, receipts) before the storm.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let setup_hwm = vm_kib(env.ferry_pid, "VmHWM");
    let setup_rss = vm_kib(env.ferry_pid, "VmRSS");
    let hwm_reset = reset_peak_rss(env.ferry_pid);
    println!(
        "setup: ferry peak RSS (VmHWM) {}, RSS before the storm {}",
        mib(setup_hwm),
        mib(setup_rss)
    );

    // -------------------------------------------------------------- storm
    let log_offset = env.ferry.log().len();
    let net_before = tcp_ext();
    let ferry_threads_before = thread_ticks(env.ferry_pid);
    let cpu_before = [
        cpu_ticks(env.ferry_pid),
        cpu_ticks(std::process::id()),
        cpu_ticks(env.mosquitto_pid),
    ];
    let live = Arc::new(Live::default());
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let origin = Instant::now();
    let sampler_handle = {
        let (live, stats, stop) = (live.clone(), stats.clone(), sampler_stop.clone());
        let (port, pid) = (env.ferry.south_port, env.ferry_pid);
        std::thread::spawn(move || sampler(origin, port, pid, live, stats, stop))
    };
    let deadline = origin + args.timeout;
    let prefix: Arc<str> = Arc::from(msg_prefix.as_str());
    let mut devices: Vec<JoinHandle<DeviceReport>> = Vec::with_capacity(args.devices);
    for (i, name) in names.iter().enumerate() {
        let mut opts = DeviceOptions::new("127.0.0.1", env.ferry.south_port, name.clone());
        if speaks_v5(i, args.v5_share) {
            opts = opts.v5();
        }
        opts.password = args.passwords.then(|| password_of(name));
        let client = DeviceClient::connect(opts);
        devices.push(tokio::spawn(device_task(
            client,
            args.per_device,
            prefix.clone(),
            live.clone(),
            origin,
            stop_rx.clone(),
        )));
    }
    let spawned_ms = origin.elapsed().as_secs_f64() * 1000.0;
    while live.received.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain_seen_ms = origin.elapsed().as_secs_f64() * 1000.0;
    // The confirms' effect: every delivery `delivered` north.
    let north_deadline = deadline.max(Instant::now() + Duration::from_secs(15));
    while stats.delivered.load(Ordering::Relaxed) < total && Instant::now() < north_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivered_north = stats.delivered.load(Ordering::Relaxed);
    let delivered_north_ms = origin.elapsed().as_secs_f64() * 1000.0;
    let storm_wall = origin.elapsed().as_secs_f64();
    let cpu_after = [
        cpu_ticks(env.ferry_pid),
        cpu_ticks(std::process::id()),
        cpu_ticks(env.mosquitto_pid),
    ];
    let ferry_threads_after = thread_ticks(env.ferry_pid);
    let net_after = tcp_ext();
    let storm_hwm = vm_kib(env.ferry_pid, "VmHWM");
    let ferry_rss_now = vm_kib(env.ferry_pid, "VmRSS");
    let bench_hwm = vm_kib(std::process::id(), "VmHWM");
    sampler_stop.store(true, Ordering::Relaxed);
    let _ = stop_tx.send(true);
    let mut reports = Vec::with_capacity(devices.len());
    for d in devices {
        match tokio::time::timeout(Duration::from_secs(10), d).await {
            Ok(Ok(r)) => reports.push(r),
            _ => reports.push(DeviceReport::default()),
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), backend_task).await;
    let sampled = sampler_handle.join().map_err(|_| "sampler panicked")?;
    let log = env.ferry.log();
    let storm_log = log.get(log_offset..).unwrap_or("");
    // The whole log: setup has no devices, so any is the storm's.
    let confirm_timeouts = log
        .lines()
        .filter(|l| l.contains(CONFIRM_TIMEOUT_LINE))
        .count();

    // ------------------------------------------------------------- report
    let n = args.devices;
    let connected_ms: Vec<f64> = reports.iter().filter_map(|r| r.connected_ms).collect();
    let done_ms: Vec<f64> = reports.iter().filter_map(|r| r.done_ms).collect();
    let first_ms: Vec<f64> = reports.iter().filter_map(|r| r.first_msg_ms).collect();
    let connect_to_first: Vec<f64> = reports
        .iter()
        .filter_map(|r| Some(r.first_msg_ms? - r.connected_ms?))
        .collect();
    let all_connected = connected_ms.len() == n;
    let received: u64 = reports.iter().map(|r| r.received).sum();
    let all_drained = done_ms.len() == n && received == total;
    let max = |v: &[f64]| v.iter().copied().fold(f64::NAN, f64::max);
    let sum = |f: fn(&DeviceReport) -> u64| reports.iter().map(f).sum::<u64>();
    let status = if all_drained && delivered_north == total {
        "complete"
    } else {
        "INCOMPLETE"
    };
    println!(
        "storm ({status}; {n} clients started within {}):",
        secs(spawned_ms)
    );
    println!(
        "  all connected: {} ({}/{n} devices connected)",
        if all_connected {
            secs(max(&connected_ms))
        } else {
            "never".into()
        },
        connected_ms.len()
    );
    println!(
        "  connected by {}",
        connected_by(&MARKS_S, &connected_ms, drain_seen_ms.max(1000.0))
    );
    dist("connect time", connected_ms.clone(), n);
    dist("first batch after connect", connect_to_first, n);
    dist("first message", first_ms, n);
    dist("device drained", done_ms.clone(), n);
    if v5 > 0 {
        by_version(&reports, |i| speaks_v5(i, args.v5_share));
    }
    println!(
        "  drained: {} ({received}/{total} messages, {}/{n} devices complete)",
        if all_drained {
            secs(max(&done_ms))
        } else {
            "never".into()
        },
        done_ms.len()
    );
    println!(
        "  all `delivered` receipts north: {} ({delivered_north}/{total})",
        if delivered_north == total {
            secs(delivered_north_ms)
        } else {
            "never".into()
        }
    );
    println!(
        "  duplicates dropped by devices {}, seq gaps {}, wrong/repeated msg_ids {}, msg order ≠ seq {}, tombstones {}",
        sum(|r| r.duplicates),
        sum(|r| r.seq_errors),
        sum(|r| r.msg_errors),
        sum(|r| r.order_mismatches),
        sum(|r| r.tombstones)
    );
    println!(
        "  inbox batches {} (with no new message {}), device reconnects after first connect {}, disconnects {}",
        sum(|r| r.batches as u64),
        sum(|r| r.empty_batches as u64),
        sum(|r| r.connects.saturating_sub(1) as u64),
        sum(|r| r.disconnects as u64)
    );
    println!("  confirm timeouts (ferry WARN \"{CONFIRM_TIMEOUT_LINE}\"): {confirm_timeouts}");
    println!(
        "  receipts north: {} total, other statuses {}, unattributed {}",
        stats.receipts.load(Ordering::Relaxed),
        stats.other.load(Ordering::Relaxed),
        stats.foreign.load(Ordering::Relaxed)
    );
    println!(
        "  ferry peak RSS (VmHWM): {} overall{}; RSS now {}",
        mib(if hwm_reset {
            storm_hwm.max(setup_hwm)
        } else {
            storm_hwm
        }),
        if hwm_reset {
            format!(", storm only {}, setup {}", mib(storm_hwm), mib(setup_hwm))
        } else {
            String::new()
        },
        mib(ferry_rss_now)
    );
    println!(
        "  bench process ({n} clients + backend) peak RSS: {}",
        mib(bench_hwm)
    );
    let pct =
        |i: usize| cpu_after[i].saturating_sub(cpu_before[i]) as f64 / hz / storm_wall * 100.0;
    println!(
        "  cpu over {:.1} s (100% = one core): ferry {:.0}%, bench {:.0}%, mosquitto {:.0}%",
        storm_wall,
        pct(0),
        pct(1),
        pct(2)
    );
    println!(
        "  ferry threads: {}",
        busiest_threads(
            &ferry_threads_before,
            &ferry_threads_after,
            hz,
            storm_wall,
            8
        )
    );
    println!(
        "  kernel TcpExt (system-wide, during the storm): {}",
        tcp_ext_delta(&net_before, &net_after)
    );
    println!(
        "  south listener accept queue: max sampled {} (every 100 ms), backlog {}",
        sampled.accept_q_max.map_or("n/a".into(), |q| q.to_string()),
        sampled.backlog.map_or("n/a".into(), |b| b.to_string())
    );
    log_summary(storm_log);
    timeline::print(&sampled.rows);
    let peak_mb = |k: Option<u64>| k.map_or(f64::NAN, |k| k as f64 * 1.024 / 1000.0);
    let peak = peak_mb(if hwm_reset {
        storm_hwm.max(setup_hwm)
    } else {
        storm_hwm
    });
    let drain_s = max(&done_ms) / 1000.0;
    println!(
        "targets: drained ≤ {TARGET_DRAIN_S} s {} ({}), peak RSS ≤ {TARGET_RSS_MB} MB {} ({peak:.1} MB), confirm timeouts = 0 {} ({confirm_timeouts}), all {total} delivered once in order {}",
        pass(all_drained && drain_s <= TARGET_DRAIN_S),
        if all_drained { format!("{drain_s:.2} s") } else { "not drained".into() },
        pass(peak <= TARGET_RSS_MB),
        pass(confirm_timeouts == 0),
        pass(all_drained && sum(|r| r.seq_errors) == 0 && sum(|r| r.msg_errors) == 0),
    );
    if status != "complete" {
        println!("ferry log tail:");
        for l in env.ferry.log_tail().lines() {
            println!("  | {l}");
        }
    }
    if let Some(path) = &args.save_log {
        match std::fs::write(path, &log) {
            Ok(()) => println!("ferry log saved to {path}"),
            Err(e) => println!("ferry log not saved to {path}: {e}"),
        }
    }
    drop(env);
    Ok(())
}
