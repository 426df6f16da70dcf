//! How the benches print figures: durations, memory, quantiles, and a
//! summary of ferry's log.

use std::collections::BTreeMap;

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
