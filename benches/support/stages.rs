//! ferry's uplink stages over one phase, from its `/metrics`: the
//! `ferry_uplink_stage_seconds` buckets scraped before and after the
//! phase, the difference taken, and p50/p99 estimated from it.
//!
//! The estimate interpolates linearly inside the bucket the quantile falls
//! in (as Prometheus's `histogram_quantile` does), so it is only as fine
//! as the buckets (0.1 ms doubling); a quantile in the last finite bucket's
//! overflow is reported as that bound, with `>`.

/// The stages, in the order of an uplink's life (the labels ferry uses).
pub const STAGES: [&str; 5] = [
    "queued",
    "commit",
    "receipt",
    "north_publish",
    "backend_ack",
];

/// One scrape's cumulative buckets per stage: (upper bound, count), in
/// order, `+Inf` last.
#[derive(Debug, Clone, Default)]
pub struct StageScrape {
    buckets: Vec<(&'static str, Vec<(f64, f64)>)>,
}

impl StageScrape {
    /// Reads the stage buckets out of a `/metrics` body.
    pub fn parse(text: &str) -> StageScrape {
        let buckets = STAGES
            .iter()
            .map(|&stage| {
                let tail = format!(",stage=\"{stage}\"}}");
                let mut b: Vec<(f64, f64)> = text
                    .lines()
                    .filter_map(|l| {
                        let rest = l.strip_prefix("ferry_uplink_stage_seconds_bucket{le=\"")?;
                        let (le, rest) = rest.split_once('"')?;
                        let value = rest.strip_prefix(tail.as_str())?.trim();
                        let le = if le == "+Inf" {
                            f64::INFINITY
                        } else {
                            le.parse().ok()?
                        };
                        Some((le, value.parse().ok()?))
                    })
                    .collect();
                b.sort_by(|x, y| x.0.total_cmp(&y.0));
                (stage, b)
            })
            .collect();
        StageScrape { buckets }
    }

    /// What was observed between `before` and `self`.
    pub fn since(&self, before: &StageScrape) -> StageScrape {
        let buckets = self
            .buckets
            .iter()
            .map(|(stage, after)| {
                let earlier = before.buckets.iter().find(|(s, _)| s == stage);
                let diff = after
                    .iter()
                    .map(|&(le, n)| {
                        let was = earlier
                            .and_then(|(_, b)| b.iter().find(|(l, _)| *l == le))
                            .map_or(0.0, |(_, n)| *n);
                        (le, n - was)
                    })
                    .collect();
                (*stage, diff)
            })
            .collect();
        StageScrape { buckets }
    }

    /// One line per stage: count, p50 and p99 in ms.
    pub fn lines(&self) -> Vec<String> {
        self.buckets
            .iter()
            .map(|(stage, b)| {
                let n = b.last().map_or(0.0, |(_, n)| *n);
                format!(
                    "{stage:>13}: {n:>7.0} observed, p50 {}, p99 {}",
                    quantile_ms(b, 0.5),
                    quantile_ms(b, 0.99)
                )
            })
            .collect()
    }
}

/// The `q` quantile of cumulative buckets, in ms, interpolated inside its
/// bucket.
fn quantile_ms(buckets: &[(f64, f64)], q: f64) -> String {
    let total = buckets.last().map_or(0.0, |(_, n)| *n);
    if total <= 0.0 {
        return "n/a".into();
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, n) in buckets {
        if n >= rank {
            if le.is_infinite() {
                return format!(">{:.2} ms", lower.0 * 1e3);
            }
            let share = if n > lower.1 {
                (rank - lower.1) / (n - lower.1)
            } else {
                0.0
            };
            return format!("{:.2} ms", (lower.0 + (le - lower.0) * share) * 1e3);
        }
        lower = (le, n);
    }
    "n/a".into()
}

/// Prints the stages of the phase between the scrapes `before` and
/// `after` (ferry's paths; nothing for the others).
pub fn print_phase(
    phase: &str,
    before: Option<Result<String, String>>,
    after: Option<Result<String, String>>,
) {
    let (Some(before), Some(after)) = (before, after) else {
        return;
    };
    match (before, after) {
        (Ok(before), Ok(after)) => {
            let phase_only = StageScrape::parse(&after).since(&StageScrape::parse(&before));
            println!(
                "  {phase} uplink stages (ferry_uplink_stage_seconds, this phase only; p50/p99 interpolated inside 0.1 ms-doubling buckets):"
            );
            for line in phase_only.lines() {
                println!("    {line}");
            }
        }
        (Err(e), _) | (_, Err(e)) => println!("  {phase} uplink stages: not scraped ({e})"),
    }
}
