//! The pruner: deletes what is past its retention (`store.retention_days`,
//! `store.dead_letter_retention_days`) in batches of [`BATCH`] rows, one
//! store request at a time, so the pipeline's requests are committed in
//! between and never wait behind a long delete.
//!
//! A pass runs shortly after start and then every [`EVERY`]; while the
//! store is at its disk budget, every [`UNDER_PRESSURE_EVERY`], and then
//! delivered messages go whatever their age (oldest first) so new ones can
//! be taken again. Nothing undelivered is ever deleted (see
//! [`crate::store::prune`]). Ages are counted on the store clock as well
//! as the wall clock: a row goes only once it is old on both.

use std::time::Duration;

use tracing::{debug, info, warn};

use crate::shutdown::Shutdown;
use crate::store::clock::Now;
use crate::store::prune::{Cutoffs, Pruned};
use crate::store::Store;

/// Rows of each kind per store request.
pub const BATCH: usize = 500;
/// The first pass, after start (the pipeline's start-up reads go first).
const FIRST: Duration = Duration::from_secs(1);
/// Between passes.
const EVERY: Duration = Duration::from_secs(60);
/// Between passes while the store is at its disk budget, and how often
/// the pruner looks whether it is.
const UNDER_PRESSURE_EVERY: Duration = Duration::from_secs(1);

/// What a pass deletes before, `now` being now on both clocks: the
/// retention back from it on each (a row must be that old on both, see
/// [`crate::store::prune`]).
pub fn cutoffs(now: Now, retention: Retention, pressure: bool) -> Cutoffs {
    let before = |d: Duration| {
        let d = d.as_millis().min(i64::MAX as u128) as i64;
        Now {
            wall_ms: now.wall_ms.saturating_sub(d),
            store_ms: now.store_ms.saturating_sub(d),
        }
    };
    Cutoffs {
        // Under pressure: everything delivered, whatever either clock says,
        // leaving its dedup key for `min_dedup`.
        delivered: if pressure {
            Now {
                wall_ms: i64::MAX,
                store_ms: i64::MAX,
            }
        } else {
            before(retention.delivered)
        },
        dead: before(retention.dead),
        keys: before(if pressure {
            retention.min_dedup.min(retention.delivered)
        } else {
            retention.delivered
        }),
        keep_keys: pressure,
        limit: BATCH,
    }
}

/// How long what is finished is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// `store.retention_days`: delivered messages, and their dedup keys.
    pub delivered: Duration,
    /// `store.dead_letter_retention_days`.
    pub dead: Duration,
    /// `store.min_dedup_s`: a dedup key under the disk budget, at least.
    pub min_dedup: Duration,
}

/// Runs until shutdown begins or the store stops.
/// `retention` may change while it runs: each pass takes the latest.
pub async fn run(
    store: Store,
    retention: tokio::sync::watch::Receiver<Retention>,
    mut shutdown: Shutdown,
) {
    // Woken every second: a pass is due every EVERY, and at once (and
    // then every second) while the store is at its disk budget.
    let mut last_pass: Option<tokio::time::Instant> = None;
    let mut first = true;
    loop {
        let wait = if first { FIRST } else { UNDER_PRESSURE_EVERY };
        first = false;
        tokio::select! {
            _ = shutdown.begun() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        if !pass_due(last_pass.map(|t| t.elapsed()), store.budget().over()) {
            continue;
        }
        last_pass = Some(tokio::time::Instant::now());
        let pressure = store.budget().over();
        let retention = *retention.borrow();
        let mut total = Pruned::default();
        loop {
            let c = cutoffs(store.now(), retention, pressure);
            match store.prune(c).await {
                Ok(p) => {
                    total.uplinks += p.uplinks;
                    total.downlinks += p.downlinks;
                    total.dead_letters += p.dead_letters;
                    total.keys += p.keys;
                    if !p.more(BATCH) {
                        break;
                    }
                }
                Err(e) if e.is_fatal() => return,
                Err(e) => {
                    warn!(event = "prune_failed", error = %e, "pruning failed; tried again at the next pass");
                    break;
                }
            }
            if shutdown.flush_by().is_some() {
                return;
            }
        }
        if total.any() {
            info!(
                event = "pruned",
                uplinks = total.uplinks,
                downlinks = total.downlinks,
                dead_letters = total.dead_letters,
                dedup_keys = total.keys,
                disk_budget_pressure = pressure,
                "pruned past retention"
            );
        } else {
            debug!(disk_budget_pressure = pressure, "nothing to prune");
        }
    }
}

/// Whether a pass is due, `since` the last one (`None`: there was none).
fn pass_due(since: Option<Duration>, over_budget: bool) -> bool {
    over_budget || since.is_none_or(|s| s >= EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_due_at_start_every_minute_and_at_once_at_the_budget() {
        assert!(pass_due(None, false));
        assert!(!pass_due(Some(Duration::from_secs(1)), false));
        assert!(pass_due(Some(EVERY), false));
        assert!(pass_due(Some(Duration::from_secs(1)), true));
    }

    const DAY: Duration = Duration::from_secs(86_400);

    fn kept(delivered_days: u32, dead_days: u32) -> Retention {
        Retention {
            delivered: delivered_days * DAY,
            dead: dead_days * DAY,
            min_dedup: Duration::from_secs(3600),
        }
    }

    #[test]
    fn cutoffs_are_the_retentions_before_now_on_both_clocks() {
        let day = 86_400_000;
        // The wall clock a year ahead of the store clock.
        let now = Now {
            wall_ms: 465 * day,
            store_ms: 100 * day,
        };
        let c = cutoffs(now, kept(30, 90), false);
        assert_eq!(c.delivered.wall_ms, 435 * day);
        assert_eq!(c.delivered.store_ms, 70 * day);
        assert_eq!(c.dead.wall_ms, 375 * day);
        assert_eq!(c.dead.store_ms, 10 * day);
        // Keys go with their retention; a message past it leaves none.
        assert_eq!(c.keys, c.delivered);
        assert!(!c.keep_keys);
        assert_eq!(c.limit, BATCH);
        // A retention past the epoch, or past the store's age, does not wrap.
        let c = cutoffs(Now::at(5), kept(36_500, 36_500), false);
        assert!(c.dead.wall_ms < 0 && c.dead.store_ms < 0);
    }

    #[test]
    fn under_pressure_anything_delivered_goes_leaving_its_key_and_dead_letters_keep_their_retention(
    ) {
        let now = Now::at(100 * 86_400_000);
        let c = cutoffs(now, kept(30, 90), true);
        assert_eq!(c.delivered.wall_ms, i64::MAX);
        assert_eq!(c.delivered.store_ms, i64::MAX);
        assert!(c.keep_keys);
        assert_eq!(c.keys.wall_ms, now.wall_ms - 3_600_000);
        assert_eq!(c.keys.store_ms, now.store_ms - 3_600_000);
        assert_eq!(c.dead, cutoffs(now, kept(30, 90), false).dead);
        // A key is never kept past the retention itself.
        let short = Retention {
            delivered: Duration::from_secs(60),
            ..kept(30, 90)
        };
        assert_eq!(cutoffs(now, short, true).keys.wall_ms, now.wall_ms - 60_000);
    }
}
