//! Whose data fills the store while it is at its disk budget:
//! `ferry_disk_budget_holder{kind, holder}`, one series per kind (the
//! largest holder of undelivered uplinks, of downlink queues, of the dead
//! letters' shares), set by each alert check while the store is over its
//! budget and empty otherwise.

use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

/// `(kind, holder, value)` of each series now.
static HOLDERS: Mutex<Vec<(&'static str, String, i64)>> = Mutex::new(Vec::new());

/// One kind's largest holder while the store is at its budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetHolder {
    /// `uplinks` (undelivered messages), `downlinks` (queued deliveries)
    /// or `dead_letter_bytes` (a share of the dead letters, in bytes).
    pub kind: &'static str,
    /// A device id, or a dead-letter share (`device:{id}`, `backend`, ...).
    pub holder: String,
    pub value: i64,
}

/// Replaces the series: `holders` while at the budget, none otherwise.
pub fn set_budget_holders(holders: &[BudgetHolder]) {
    if let Ok(mut now) = HOLDERS.lock() {
        *now = holders
            .iter()
            .map(|h| (h.kind, h.holder.clone(), h.value))
            .collect();
    }
}

#[derive(Debug)]
pub(super) struct Holders;

impl Collector for Holders {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let gauge = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "disk_budget_holder",
            "While the store is at store.max_db_bytes: the largest holder of each kind (undelivered uplinks and queued downlinks by device, in messages; dead letters by share, in bytes); no series otherwise",
            None,
            gauge.metric_type(),
        )?;
        let now = HOLDERS.lock().map(|h| h.clone()).unwrap_or_default();
        for (kind, holder, value) in now {
            let labels = [("kind", kind.to_string()), ("holder", holder)];
            let metric = family.encode_family(&labels)?;
            ConstGauge::new(value).encode(metric)?;
        }
        Ok(())
    }
}
