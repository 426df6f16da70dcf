//! The storm's timeline: a row per second (devices connected, messages
//! received, receipts north, ferry's CPU, RSS and busiest thread, the
//! south listener's accept queue and the kernel's listen overflows),
//! sampled on a thread of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backend::ReceiptStats;
use super::drain::Live;
use super::procfs::{accept_queue, clock_ticks_per_s, cpu_ticks, tcp_ext, thread_ticks, vm_kib};

/// One second of the storm.
pub struct Row {
    pub t_s: f64,
    pub connected: u64,
    pub received: u64,
    pub done: u64,
    pub delivered_north: u64,
    pub ferry_cpu_pct: f64,
    pub bench_cpu_pct: f64,
    pub ferry_rss_kib: u64,
    /// The busiest ferry thread in this second, and its CPU %.
    pub top_thread: (String, f64),
    pub accept_q_max: Option<u64>,
    pub overflows: u64,
}

pub struct Sampled {
    pub rows: Vec<Row>,
    pub accept_q_max: Option<u64>,
    pub backlog: Option<u64>,
}

/// Samples the accept queue every 100 ms and writes a timeline row every
/// second until `stop` is set.
pub fn sampler(
    origin: Instant,
    port: u16,
    ferry_pid: u32,
    live: Arc<Live>,
    stats: Arc<ReceiptStats>,
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

/// "0.5 s: 812, 1 s: 2000, …": how many of `connected_ms` (each device's
/// first `Connected`, ms) were in by each of `marks_s` up to `until_ms`.
pub fn connected_by(marks_s: &[f64], connected_ms: &[f64], until_ms: f64) -> String {
    marks_s
        .iter()
        .filter(|s| **s * 1000.0 <= until_ms)
        .map(|s| {
            let c = connected_ms.iter().filter(|t| **t <= s * 1000.0).count();
            format!("{s} s: {c}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The timeline as the storm's report prints it, header first.
pub fn print(rows: &[Row]) {
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
    for r in rows {
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
}
