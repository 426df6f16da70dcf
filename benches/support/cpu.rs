//! CPU use over a phase, from /proc: the machine, each watched process and
//! ferry's threads; and a wait for the machine to go quiet first (other
//! builds on the same 2 cores distort every figure).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::procfs::{clock_ticks_per_s, cpu_ticks, machine_busy_ticks, thread_ticks};

/// Processes whose CPU time a report shows: (label, pid). The one labelled
/// `ferry` also has its threads shown.
pub type Watched = Vec<(String, u32)>;

/// Samples machine-wide CPU for a second at a time until it is nearly idle,
/// at most `wait`; returns the last sample in % of one core.
pub async fn wait_for_quiet_machine(wait: Duration) -> f64 {
    let end = Instant::now() + wait;
    loop {
        let (t0, b0) = (Instant::now(), machine_busy_ticks());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let secs = t0.elapsed().as_secs_f64();
        let busy =
            100.0 * machine_busy_ticks().saturating_sub(b0) as f64 / clock_ticks_per_s() / secs;
        if busy < 20.0 || Instant::now() >= end {
            if busy >= 20.0 {
                eprintln!(
                    "warning: the machine is {busy:.0}% busy with other work; figures will be low"
                );
            }
            return busy;
        }
    }
}

/// CPU counters at one instant: the machine, each watched process, and the
/// threads of ferry.
pub struct CpuSnapshot {
    at: Instant,
    machine: u64,
    procs: Vec<u64>,
    /// Ticks per thread of ferry, keyed by `comm (tid)`.
    threads: BTreeMap<String, u64>,
}

/// CPU used over a phase, in % of one core.
#[derive(Default)]
pub struct CpuUse {
    pub machine: f64,
    pub procs: Vec<(String, f64)>,
    /// The busiest threads of ferry: `comm (tid)`, %.
    pub ferry_threads: Vec<(String, f64)>,
}

impl CpuSnapshot {
    pub fn take(watched: &Watched) -> CpuSnapshot {
        let procs = watched.iter().map(|(_, pid)| cpu_ticks(*pid)).collect();
        let threads = watched
            .iter()
            .find(|(label, _)| label == "ferry")
            .map(|(_, pid)| thread_ticks(*pid))
            .unwrap_or_default();
        CpuSnapshot {
            at: Instant::now(),
            machine: machine_busy_ticks(),
            procs,
            threads,
        }
    }

    pub fn since(&self, before: &CpuSnapshot, watched: &Watched) -> CpuUse {
        let secs = self.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let pct = |ticks: u64| 100.0 * ticks as f64 / clock_ticks_per_s() / secs;
        let procs = watched
            .iter()
            .zip(self.procs.iter().zip(&before.procs))
            .map(|((label, _), (now, then))| (label.clone(), pct(now.saturating_sub(*then))))
            .collect();
        let mut ferry_threads: Vec<(String, f64)> = self
            .threads
            .iter()
            .map(|(thread, now)| {
                let then = before.threads.get(thread).copied().unwrap_or(0);
                (thread.clone(), pct(now.saturating_sub(then)))
            })
            .filter(|(_, p)| *p >= 1.0)
            .collect();
        ferry_threads.sort_by(|a, b| b.1.total_cmp(&a.1));
        ferry_threads.truncate(8);
        CpuUse {
            machine: pct(self.machine.saturating_sub(before.machine)),
            procs,
            ferry_threads,
        }
    }
}
