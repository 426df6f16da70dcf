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
//!
//! ```text
//! cargo bench --bench storm -- [--devices 2000] [--per-device 100] [--batch 200]
//!     [--payload-bytes 100] [--confirm-timeout-ms 10000] [--sync full|normal]
//!     [--timeout-s 120] [--setup-timeout-s 300] [--log-level FILTER] [--save-log FILE]
//! ```

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use support::{
    clock_ticks_per_s, cpu_ticks, reset_peak_rss, thread_ticks, vm_kib, CargoBench, Env,
};

/// The WARN line ferry writes for every confirm timeout.
const CONFIRM_TIMEOUT_LINE: &str = "downlink batch not confirmed in time; resending";
/// conf/ferry.toml's log filter (the harness default is plain "info").
const PRODUCTION_LOG_LEVEL: &str = "info,rumqttd=warn";
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
        args
    }
}

// ------------------------------------------------------------ /proc helpers

/// Counters of the `TcpExt:` lines of /proc/net/netstat (system-wide).
fn tcp_ext() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("TcpExt:")).collect();
    let mut out = BTreeMap::new();
    if let [names, values, ..] = lines[..] {
        for (n, v) in names
            .split_whitespace()
            .zip(values.split_whitespace())
            .skip(1)
        {
            if let Ok(v) = v.parse() {
                out.insert(n.to_string(), v);
            }
        }
    }
    out
}

const TCP_EXT_KEYS: [&str; 5] = [
    "ListenOverflows",
    "ListenDrops",
    "SyncookiesSent",
    "TCPReqQFullDoCookies",
    "TCPReqQFullDrop",
];

/// (accept queue now, backlog) of the listening socket on 127.0.0.1:port.
fn accept_queue(port: u16) -> Option<(u64, u64)> {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Some((f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?))
}

// -------------------------------------------------------------- environment

fn start_env(args: &Args) -> Env {
    Env::start("storm-gw", |c| {
        c.store.sync = args.sync.clone();
        c.log.level = args.log_level.clone();
        c.downlink.batch_size = args.batch;
        c.downlink.confirm_timeout_ms = args.confirm_timeout_ms;
        // Above the storm's devices: a CONNECT beyond it gets no CONNACK.
        c.south.max_connections = args.devices.max(10_000);
    })
}

// ------------------------------------------------------------------ backend

/// What the backend heard, counted by its event task.
#[derive(Default)]
struct BackendStats {
    /// Distinct (message, device) pairs with a `stored` receipt.
    stored: AtomicU64,
    /// Distinct (message, device) pairs with a `delivered` receipt.
    delivered: AtomicU64,
    receipts: AtomicU64,
    /// Receipts with another status (expired, failed, rejected, read).
    other: AtomicU64,
    /// Receipts the bench could not attribute to one of its pairs.
    foreign: AtomicU64,
    connects: AtomicU64,
}

fn device_name(i: usize) -> String {
    format!("dev-{i}")
}

fn device_index(name: &str) -> Option<u64> {
    name.strip_prefix("dev-")?.parse().ok()
}

/// `{msg_prefix}{k}` → k (1-based).
fn msg_index(prefix: &str, msg_id: &str) -> Option<u64> {
    msg_id.strip_prefix(prefix)?.parse().ok()
}

/// Consumes the backend's events until the bench ends.
async fn backend_events(
    mut backend: BackendClient,
    stats: Arc<BackendStats>,
    msg_prefix: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut stored = HashSet::new();
    let mut delivered = HashSet::new();
    loop {
        let ev = tokio::select! {
            ev = backend.events.recv() => ev,
            _ = stop.changed() => return,
        };
        let Some(ev) = ev else { return };
        let r = match ev {
            BackendEvent::Receipt(r) => r,
            BackendEvent::Connected => {
                stats.connects.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            _ => continue,
        };
        stats.receipts.fetch_add(1, Ordering::Relaxed);
        let key = r["msg_id"]
            .as_str()
            .and_then(|m| msg_index(&msg_prefix, m))
            .zip(r["device"].as_str().and_then(device_index))
            .map(|(k, d)| (d << 20) | k);
        let Some(key) = key else {
            stats.foreign.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        match r["status"].as_str() {
            Some("stored") => {
                if stored.insert(key) {
                    stats.stored.fetch_add(1, Ordering::Relaxed);
                }
            }
            Some("delivered") => {
                if delivered.insert(key) {
                    stats.delivered.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                stats.other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

// ------------------------------------------------------------------ devices

/// Counters every device task adds to, read by the sampler.
#[derive(Default)]
struct Live {
    connected: AtomicU64,
    received: AtomicU64,
    done: AtomicU64,
}

/// One device's view of the storm (times in ms since the storm began).
#[derive(Default, Debug)]
struct DeviceReport {
    connected_ms: Option<f64>,
    first_msg_ms: Option<f64>,
    done_ms: Option<f64>,
    connects: u32,
    disconnects: u32,
    received: u64,
    batches: u32,
    empty_batches: u32,
    duplicates: u64,
    /// A new message whose seq is not the next one (a gap).
    seq_errors: u64,
    /// A msg_id not of this run, or one received twice under two seqs.
    msg_errors: u64,
    /// Message k arrived with seq ≠ k (possible only if intake reordered).
    order_mismatches: u64,
    tombstones: u64,
}

async fn device_task(
    mut client: DeviceClient,
    per_device: usize,
    msg_prefix: Arc<str>,
    live: Arc<Live>,
    origin: Instant,
    mut stop: watch::Receiver<bool>,
) -> DeviceReport {
    let mut r = DeviceReport::default();
    let mut seen = vec![false; per_device + 1];
    let ms = || origin.elapsed().as_secs_f64() * 1000.0;
    loop {
        let ev = tokio::select! {
            ev = client.events.recv() => ev,
            _ = stop.changed() => break,
        };
        let Some(ev) = ev else { break };
        match ev {
            DeviceEvent::Connected => {
                r.connects += 1;
                if r.connected_ms.is_none() {
                    r.connected_ms = Some(ms());
                    live.connected.fetch_add(1, Ordering::Relaxed);
                }
            }
            DeviceEvent::Disconnected => r.disconnects += 1,
            DeviceEvent::Receipt(_) => {}
            DeviceEvent::Inbox {
                messages,
                duplicates,
                ..
            } => {
                r.batches += 1;
                r.duplicates += duplicates as u64;
                let Some(last) = messages.last().map(|m| m.seq) else {
                    r.empty_batches += 1;
                    continue;
                };
                // Committed at once: confirm before counting.
                client.confirm(last);
                if r.first_msg_ms.is_none() {
                    r.first_msg_ms = Some(ms());
                }
                for m in &messages {
                    if m.seq != r.received + 1 {
                        r.seq_errors += 1;
                    }
                    if m.status.is_some() {
                        r.tombstones += 1;
                    }
                    match msg_index(&msg_prefix, &m.msg_id) {
                        Some(k) if (1..=per_device as u64).contains(&k) => {
                            if seen[k as usize] {
                                r.msg_errors += 1;
                            }
                            seen[k as usize] = true;
                            if k != m.seq {
                                r.order_mismatches += 1;
                            }
                        }
                        _ => r.msg_errors += 1,
                    }
                    r.received += 1;
                }
                live.received
                    .fetch_add(messages.len() as u64, Ordering::Relaxed);
                if r.done_ms.is_none() && r.received >= per_device as u64 {
                    r.done_ms = Some(ms());
                    live.done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    r
}

// ------------------------------------------------------------------ sampler

/// One second of the storm.
struct Row {
    t_s: f64,
    connected: u64,
    received: u64,
    done: u64,
    delivered_north: u64,
    ferry_cpu_pct: f64,
    bench_cpu_pct: f64,
    ferry_rss_kib: u64,
    /// The busiest ferry thread in this second, and its CPU %.
    top_thread: (String, f64),
    accept_q_max: Option<u64>,
    overflows: u64,
}

struct Sampled {
    rows: Vec<Row>,
    accept_q_max: Option<u64>,
    backlog: Option<u64>,
}

/// Samples the accept queue every 100 ms and writes a timeline row every
/// second until `stop` is set.
fn sampler(
    origin: Instant,
    port: u16,
    ferry_pid: u32,
    live: Arc<Live>,
    stats: Arc<BackendStats>,
    stop: Arc<AtomicBool>,
) -> Sampled {
    let hz = clock_ticks_per_s();
    let me = std::process::id();
    let mut rows = Vec::new();
    let mut q_all: Option<u64> = None;
    let mut backlog = None;
    let mut q_sec: Option<u64> = None;
    let mut last = (
        origin,
        cpu_ticks(ferry_pid),
        cpu_ticks(me),
        tcp_ext().get("ListenOverflows").copied().unwrap_or(0),
    );
    let mut last_threads = thread_ticks(ferry_pid);
    let mut next_row = origin + Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) {
        if let Some((q, b)) = accept_queue(port) {
            q_sec = Some(q_sec.map_or(q, |m| m.max(q)));
            q_all = Some(q_all.map_or(q, |m| m.max(q)));
            backlog = Some(b);
        }
        let now = Instant::now();
        if now >= next_row {
            let (f, b) = (cpu_ticks(ferry_pid), cpu_ticks(me));
            let ov = tcp_ext().get("ListenOverflows").copied().unwrap_or(0);
            let dt = now.duration_since(last.0).as_secs_f64().max(1e-3);
            let threads = thread_ticks(ferry_pid);
            let top_thread = threads
                .iter()
                .map(|(k, v)| (k, v.saturating_sub(*last_threads.get(k).unwrap_or(&0))))
                .max_by_key(|(_, d)| *d)
                .map(|(k, d)| {
                    let name = k.split(" (").next().unwrap_or(k).to_string();
                    (name, d as f64 / hz / dt * 100.0)
                })
                .unwrap_or_default();
            last_threads = threads;
            rows.push(Row {
                t_s: now.duration_since(origin).as_secs_f64(),
                connected: live.connected.load(Ordering::Relaxed),
                received: live.received.load(Ordering::Relaxed),
                done: live.done.load(Ordering::Relaxed),
                delivered_north: stats.delivered.load(Ordering::Relaxed),
                ferry_cpu_pct: f.saturating_sub(last.1) as f64 / hz / dt * 100.0,
                bench_cpu_pct: b.saturating_sub(last.2) as f64 / hz / dt * 100.0,
                ferry_rss_kib: vm_kib(ferry_pid, "VmRSS").unwrap_or(0),
                top_thread,
                accept_q_max: q_sec.take(),
                overflows: ov.saturating_sub(last.3),
            });
            last = (now, f, b, ov);
            next_row += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Sampled {
        rows,
        accept_q_max: q_all,
        backlog,
    }
}

// ------------------------------------------------------------------- report

fn secs(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or("n/a".to_string(), |k| {
        format!(
            "{:.1} MiB ({:.1} MB)",
            k as f64 / 1024.0,
            k as f64 * 1.024 / 1000.0
        )
    })
}

/// The q-quantile of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn dist(label: &str, mut v: Vec<f64>, of: usize) {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        println!("  {label}: none of {of}");
        return;
    }
    println!(
        "  {label} (n = {}/{of}): p50 {} p90 {} p99 {} max {}",
        v.len(),
        secs(quantile(&v, 0.5)),
        secs(quantile(&v, 0.9)),
        secs(quantile(&v, 0.99)),
        secs(*v.last().unwrap_or(&0.0)),
    );
}

fn pass(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "FAIL"
    }
}

/// Counts of the interesting lines of a piece of ferry's log.
fn log_summary(log: &str) {
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    println!(
        "  ferry log (storm part): {} lines, WARN {}, ERROR {}, batches sent {}, batches confirmed {}, confirm timeouts {}",
        log.lines().count(),
        count(" WARN "),
        count(" ERROR "),
        count("downlink batch sent"),
        count("downlink batch confirmed"),
        count(CONFIRM_TIMEOUT_LINE),
    );
    // The distinct WARN/ERROR messages (fields stripped), most frequent first.
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for l in log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
    {
        let key: String = l
            .split_once(" WARN ")
            .or_else(|| l.split_once(" ERROR "))
            .map(|(_, rest)| rest)
            .unwrap_or(l)
            .split(" device=")
            .next()
            .unwrap_or("")
            .chars()
            .take(160)
            .collect();
        // Numbers (connection ids, seqs) vary: group by the message's shape.
        let mut shape = String::with_capacity(key.len());
        for c in key.chars() {
            if !c.is_ascii_digit() {
                shape.push(c);
            } else if !shape.ends_with('#') {
                shape.push('#');
            }
        }
        *kinds.entry(shape).or_default() += 1;
    }
    let mut kinds: Vec<_> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    for (k, n) in kinds.iter().take(8) {
        println!("    {n} × {k}");
    }
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
    let env = start_env(&args);
    let hz = clock_ticks_per_s();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("ferry reconnect-storm benchmark");
    println!(
        "  devices {}, messages per device {}, deliveries {total}, batch_size {}, confirm_timeout_ms {}, payload ~{} B",
        args.devices, args.per_device, args.batch, args.confirm_timeout_ms, args.payload_bytes
    );
    println!(
        "  store sync {}, log level {:?}, south max_connections {}, fd limit {nofile}, cores {cores}",
        args.sync,
        args.log_level,
        args.devices.max(10_000)
    );

    // ------------------------------------------------ setup: queue everything
    let run = support::harness::boot_id();
    let msg_prefix = format!("storm-{run}-");
    let stats = Arc::new(BackendStats::default());
    let mut backend = BackendClient::connect(BackendOptions {
        // Only a safety net: a resend is answered again and deduplicated.
        resend_after: Duration::from_secs(30),
        ..BackendOptions::new("127.0.0.1", env.mosquitto.port, env.ferry.gateway.clone())
    });
    let setup_start = Instant::now();
    let setup_deadline = setup_start + args.setup_timeout;
    // Wait for the backend's subscriptions and the gateway's `online`.
    let mut connected = false;
    let mut online = false;
    while !(connected && online) {
        let left = setup_deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, backend.events.recv()).await {
            Ok(Some(BackendEvent::Connected)) => connected = true,
            Ok(Some(BackendEvent::Status(s))) => online = s["online"] == json!(true),
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                return Err(format!(
                    "backend connected {connected}, gateway online {online} after {:?}\n{}",
                    args.setup_timeout,
                    env.ferry.log_tail()
                ))
            }
        }
    }
    stats.connects.fetch_add(1, Ordering::Relaxed);
    let names: Vec<String> = (0..args.devices).map(device_name).collect();
    let text = "x".repeat(args.payload_bytes);
    let mut envelopes = 0;
    for k in 1..=args.per_device {
        for chunk in names.chunks(MAX_TO) {
            let to: Vec<&str> = chunk.iter().map(String::as_str).collect();
            backend.send_down(
                &to,
                json!({"msg_id": format!("{msg_prefix}{k}"), "payload": {"k": k, "text": text}}),
            );
            envelopes += 1;
        }
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let backend_task = tokio::spawn(backend_events(
        backend,
        stats.clone(),
        msg_prefix.clone(),
        stop_rx.clone(),
    ));
    while stats.stored.load(Ordering::Relaxed) < total && Instant::now() < setup_deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let setup_s = setup_start.elapsed().as_secs_f64();
    let stored = stats.stored.load(Ordering::Relaxed);
    let rows = env
        .ferry
        .query_i64("SELECT count(*) FROM down_delivery", []);
    println!(
        "setup: {envelopes} envelopes on ferry/{{gw}}/down → {stored}/{total} `stored` receipts in {setup_s:.1} s ({:.0} deliveries/s); down_delivery rows {rows}",
        stored as f64 / setup_s.max(1e-3)
    );
    if stored < total {
        println!(
            "setup: INCOMPLETE after {:?}; ferry log tail:",
            args.setup_timeout
        );
        for l in env.ferry.log_tail().lines() {
            println!("  | {l}");
        }
        return Err("setup did not queue every delivery".into());
    }
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
    for name in &names {
        let client = DeviceClient::connect(DeviceOptions::new(
            "127.0.0.1",
            env.ferry.south_port,
            name.clone(),
        ));
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
    let marks: Vec<String> = MARKS_S
        .iter()
        .filter(|s| **s * 1000.0 <= drain_seen_ms.max(1000.0))
        .map(|s| {
            let c = connected_ms.iter().filter(|t| **t <= s * 1000.0).count();
            format!("{s} s: {c}")
        })
        .collect();
    println!("  connected by {}", marks.join(", "));
    dist("connect time", connected_ms.clone(), n);
    dist("first batch after connect", connect_to_first, n);
    dist("first message", first_ms, n);
    dist("device drained", done_ms.clone(), n);
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
    let mut threads: Vec<(String, u64)> = ferry_threads_after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(ferry_threads_before.get(k).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, v)| *v > 0)
        .collect();
    threads.sort_by_key(|t| std::cmp::Reverse(t.1));
    let threads: Vec<String> = threads
        .iter()
        .take(8)
        .map(|(k, v)| format!("{k} {:.0}%", *v as f64 / hz / storm_wall * 100.0))
        .collect();
    println!("  ferry threads: {}", threads.join(", "));
    let net: Vec<String> = TCP_EXT_KEYS
        .iter()
        .map(|k| {
            let d = net_after.get(*k).unwrap_or(&0) - net_before.get(*k).unwrap_or(&0);
            format!("{k} +{d}")
        })
        .collect();
    println!(
        "  kernel TcpExt (system-wide, during the storm): {}",
        net.join(", ")
    );
    println!(
        "  south listener accept queue: max sampled {} (every 100 ms), backlog {}",
        sampled.accept_q_max.map_or("n/a".into(), |q| q.to_string()),
        sampled.backlog.map_or("n/a".into(), |b| b.to_string())
    );
    log_summary(storm_log);
    println!("  timeline (per second; received = messages at devices, north = `delivered` receipts at the backend, accept q = max sampled, ov = ListenOverflows):");
    println!(
        "    {:>6} {:>9} {:>8} {:>7} {:>8} {:>9} {:>21} {:>9} {:>9} {:>8} {:>6}",
        "t",
        "connected",
        "received",
        "drained",
        "north",
        "ferry cpu",
        "busiest ferry thread",
        "bench cpu",
        "ferry RSS",
        "accept q",
        "ov"
    );
    for r in &sampled.rows {
        println!(
            "    {:>5.1}s {:>9} {:>8} {:>7} {:>8} {:>8.0}% {:>16} {:>3.0}% {:>8.0}% {:>5.0} MiB {:>8} {:>6}",
            r.t_s,
            r.connected,
            r.received,
            r.done,
            r.delivered_north,
            r.ferry_cpu_pct,
            r.top_thread.0,
            r.top_thread.1,
            r.bench_cpu_pct,
            r.ferry_rss_kib as f64 / 1024.0,
            r.accept_q_max.map_or("-".into(), |q| q.to_string()),
            r.overflows
        );
    }
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
