//! `[store]`, checked: how the store commits, how much disk it may use,
//! how long it keeps what, and each peer's share of the dead letters
//! refused at the door.

use std::time::Duration;

use super::check::{in_range, ConfigError, Problems};
use super::raw::RawStore;

/// How hard the store pushes each commit to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// fsync on every commit: a `stored` receipt survives a power cut.
    Full,
    /// WAL without fsync per commit: survives a crash of ferry only.
    Normal,
}

impl SyncMode {
    /// `store.sync`'s value: "full" or "normal".
    fn parse(value: &str) -> Result<SyncMode, ConfigError> {
        match value {
            "full" => Ok(SyncMode::Full),
            "normal" => Ok(SyncMode::Normal),
            other => Err(ConfigError::new(
                "store.sync",
                format!("must be \"full\" or \"normal\" (got {other:?})"),
            )),
        }
    }
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub sync: SyncMode,
    pub max_batch: usize,
    /// `store.max_db_bytes`: the disk budget (pages in use plus the WAL).
    pub max_db_bytes: u64,
    /// `store.retention_days`: how long delivered messages are kept.
    pub retention: Duration,
    /// `store.dead_letter_retention_days`.
    pub dead_letter_retention: Duration,
    /// `store.min_dedup_s`: how long a dedup key outlives a message pruned
    /// at the disk budget, at least.
    pub min_dedup: Duration,
    /// What the dead letters refused at the door may hold.
    pub refusals: RefusalShares,
}

/// The dead letters a peer's refusals may fill before the rest of them
/// are summed in one row: per peer (`store.dead_letter_share_rows`,
/// `store.dead_letter_share_bytes`) and all peers together
/// (`store.dead_letter_total_bytes`, held to [`TOTAL_SHARE_OF_BUDGET`] of
/// the disk budget).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalShares {
    pub rows: u64,
    pub bytes: u64,
    pub total_bytes: u64,
}

/// All refusals together never take more than this fraction (1/N) of
/// `store.max_db_bytes`, whatever `store.dead_letter_total_bytes` says.
pub const TOTAL_SHARE_OF_BUDGET: u64 = 20;

pub(super) fn check(raw: &RawStore, p: &mut Problems) -> Option<StoreConfig> {
    let sync = p.take(SyncMode::parse(&raw.sync));
    p.take(in_range("store.max_batch", raw.max_batch, 1, 100_000));
    // Below 1 MiB the WAL of a few commits alone would fill it; above
    // 1 PiB is a typo. There is no "unlimited": a full disk stalls
    // every commit, a reached budget only refuses new messages.
    p.take(in_range(
        "store.max_db_bytes",
        raw.max_db_bytes,
        1 << 20,
        1 << 50,
    ));
    p.take(in_range(
        "store.retention_days",
        raw.retention_days,
        1,
        36_500,
    ));
    p.take(in_range(
        "store.dead_letter_retention_days",
        raw.dead_letter_retention_days,
        1,
        36_500,
    ));
    p.take(in_range(
        "store.min_dedup_s",
        raw.min_dedup_s,
        1,
        31_536_000,
    ));
    p.take(in_range(
        "store.dead_letter_share_rows",
        raw.dead_letter_share_rows,
        1,
        10_000_000,
    ));
    p.take(in_range(
        "store.dead_letter_share_bytes",
        raw.dead_letter_share_bytes,
        16 << 10,
        1 << 40,
    ));
    p.take(in_range(
        "store.dead_letter_total_bytes",
        raw.dead_letter_total_bytes,
        16 << 10,
        1 << 45,
    ));
    let days = |n: u32| Duration::from_secs(u64::from(n) * 86_400);
    Some(StoreConfig {
        sync: sync?,
        max_batch: raw.max_batch,
        max_db_bytes: raw.max_db_bytes,
        retention: days(raw.retention_days),
        dead_letter_retention: days(raw.dead_letter_retention_days),
        min_dedup: Duration::from_secs(raw.min_dedup_s),
        refusals: RefusalShares {
            rows: raw.dead_letter_share_rows,
            bytes: raw.dead_letter_share_bytes,
            total_bytes: raw
                .dead_letter_total_bytes
                .min(raw.max_db_bytes / TOTAL_SHARE_OF_BUDGET),
        },
    })
}
