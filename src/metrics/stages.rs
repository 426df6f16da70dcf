//! The stages of an uplink's life, each a series of
//! `ferry_uplink_stage_seconds{stage=...}`, so the latency of a `stored`
//! receipt and of a delivery can be taken apart:
//!
//! ```text
//! handed to the writer ─queued─▶ batch starts ─commit─▶ committed
//! committed ─receipt─▶ `stored` receipt handed to the south broker
//! committed ─north_publish─▶ handed to the north session
//! north publish ─backend_ack─▶ the backend's ack applied
//! ```
//!
//! Each is timed on the monotonic clock from an `Instant` carried with the
//! request or the message; none allocates. Finer buckets than the other
//! histograms (0.1 ms doubling to ~1.6 s, then 5 and 15 s): these stages
//! take fractions of a millisecond when all is well.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// A stage of an uplink's life (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Intake handed the request to the writer → the writer began the
    /// batch that committed it.
    Queued,
    /// The batch's apply and commit (fsync), counted once per new uplink
    /// in it.
    Commit,
    /// The commit → its `stored` receipt handed to the south broker.
    Receipt,
    /// The commit → the first publish handed to the north session.
    NorthPublish,
    /// A publish handed north → the backend's `ok` ack applied.
    BackendAck,
}

impl Stage {
    pub const ALL: [Stage; 5] = [
        Stage::Queued,
        Stage::Commit,
        Stage::Receipt,
        Stage::NorthPublish,
        Stage::BackendAck,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Queued => "queued",
            Stage::Commit => "commit",
            Stage::Receipt => "receipt",
            Stage::NorthPublish => "north_publish",
            Stage::BackendAck => "backend_ack",
        }
    }
}

impl EncodeLabelValue for Stage {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct StageLabel {
    pub stage: Stage,
}

/// Seconds, 0.1 ms doubling to ~1.6 s, then 5 and 15 s.
fn stage_buckets() -> Histogram {
    let doubling = (0..15).map(|i| 0.0001 * f64::from(1u32 << i));
    Histogram::new(doubling.chain([5.0, 15.0]))
}

/// The family and each stage's series, made at start and kept at hand (an
/// observation is atomic adds, not a lookup in the family's map).
pub(super) struct Stages {
    pub family: Family<StageLabel, Histogram, fn() -> Histogram>,
    series: [Histogram; Stage::ALL.len()],
}

impl Stages {
    pub fn new() -> Stages {
        let family = Family::new_with_constructor(stage_buckets as fn() -> Histogram);
        let series = Stage::ALL.map(|stage| family.get_or_create(&StageLabel { stage }).clone());
        Stages { family, series }
    }

    pub fn of(&self, stage: Stage) -> &Histogram {
        &self.series[stage as usize]
    }
}
