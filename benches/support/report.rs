//! How the benches print figures: durations, memory, quantiles, CPU per
//! thread and counter deltas, and a summary of ferry's log.

use std::collections::BTreeMap;

use super::procfs::TCP_EXT_KEYS;

/// The WARN line ferry writes for every downlink confirm timeout.
pub const CONFIRM_TIMEOUT_LINE: &str = "downlink batch not confirmed in time; resending";

pub fn secs(ms: f64) -> String {
    format!("{:.2} s", ms / 1000.0)
}

pub fn mib(kib: Option<u64>) -> String {
    kib.map_or("n/a".to_string(), |k| {
        format!(
            "{:.1} MiB ({:.1} MB)",
            k as f64 / 1024.0,
            k as f64 * 1.024 / 1000.0
        )
    })
}

/// The q-quantile of sorted values.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub fn dist(label: &str, mut v: Vec<f64>, of: usize) {
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

/// The `n` threads that used the most CPU between two
/// [`super::procfs::thread_ticks`] readings `wall_s` apart, as
/// "name 42%, …" (100% = one core).
pub fn busiest_threads(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    hz: f64,
    wall_s: f64,
    n: usize,
) -> String {
    let mut threads: Vec<(&String, u64)> = after
        .iter()
        .map(|(k, v)| (k, v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect();
    threads.sort_by_key(|t| std::cmp::Reverse(t.1));
    threads
        .iter()
        .take(n)
        .map(|(k, v)| format!("{k} {:.0}%", *v as f64 / hz / wall_s * 100.0))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How much each of [`TCP_EXT_KEYS`] grew between two
/// [`super::procfs::tcp_ext`] readings, as "Key +d, …".
pub fn tcp_ext_delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> String {
    TCP_EXT_KEYS
        .iter()
        .map(|k| {
            let d = after.get(*k).unwrap_or(&0) - before.get(*k).unwrap_or(&0);
            format!("{k} +{d}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `x`, and its ratio to `b` (the compare bench's path (b)) when there is one.
pub fn with_ratio(x: f64, b: Option<f64>, digits: usize) -> String {
    match b.filter(|b| *b > 0.0) {
        Some(b) => format!("{x:.digits$} (×{:.2})", x / b),
        None => format!("{x:.digits$}"),
    }
}

pub fn pass(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "FAIL"
    }
}

/// Counts of the interesting lines of a piece of ferry's log.
pub fn log_summary(log: &str) {
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
