//! The counts without labels: one [`Count`] variant per condition, each one
//! `ferry_<name>_total` counter made at start. Where the condition happens,
//! [`super::count()`] bumps it and returns the running total for the log line
//! beside it.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;

/// A condition counted with no labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// A CONNECT the embedded broker's connect hook refused.
    DevicesRefused,
    /// A device publish over `south.max_payload_bytes`.
    OversizedFromDevices,
    /// A device publish outside the device's own topics.
    UnauthorizedFromDevices,
    /// A device envelope or control nested too deep.
    NestedTooDeepFromDevices,
    /// A device publish over `south.rate_per_s`/`burst`.
    RateLimitedFromDevices,
    /// A device uplink past `south.max_inflight_per_device`.
    InflightLimitedFromDevices,
    /// An upstream message over `north.max_packet_bytes`.
    OversizedFromUpstream,
    /// A backend downlink nested too deep.
    NestedTooDeepFromBackend,
    /// An admin HTTP connection closed at once, at the connection limit.
    AdminConnectionsRefused,
    /// The store reached `store.max_db_bytes`.
    DiskBudgetReached,
    /// An alert dropped unsent: the in-memory queue was full.
    AlertsDropped,
    /// An uplink's ack timeout not counted: the backend acked only older
    /// sends (there, but behind); the uplink was sent again.
    UplinkResendsBackendBehind,
    /// A refusal at the door summed in a summary dead letter: its sender's
    /// dead-letter share (or all shares together) was full.
    RefusalsSummarised,
    /// A plain device publish (no envelope, `south.plain_topics`) taken.
    PlainFromDevices,
    /// ... of them QoS 0: stored, best effort (nothing tells the device).
    PlainQos0FromDevices,
    /// A plain device publish over a per-device limit: not acknowledged,
    /// its connection closed (QoS 1, 2: the device sends it again), or
    /// not kept (QoS 0).
    PlainWithheldFromDevices,
    /// A Sparkplug B edge node's publish taken (`[south.sparkplug]`).
    SparkplugFromDevices,
    /// ... whose `seq` was not the one due (a gap, a repeat, an NBIRTH
    /// not at 0): logged and counted, never fixed.
    SparkplugSeqGaps,
    /// ... an NBIRTH or NDEATH without a `bdSeq` metric.
    SparkplugBdSeqMissing,
    /// ... data before its node's NBIRTH (or after its NDEATH), an NDEATH
    /// of another session's `bdSeq`, a message without `seq`.
    SparkplugOutOfSession,
    /// ... whose payload is not Sparkplug B protobuf (stored as it came).
    SparkplugUndecodable,
    /// ... stored marked historical: north was down or the primary host
    /// not online.
    SparkplugHistorical,
}

impl Count {
    /// In the order they are exposed.
    pub(super) const ALL: [Count; 22] = [
        Count::DevicesRefused,
        Count::OversizedFromDevices,
        Count::UnauthorizedFromDevices,
        Count::NestedTooDeepFromDevices,
        Count::RateLimitedFromDevices,
        Count::InflightLimitedFromDevices,
        Count::OversizedFromUpstream,
        Count::NestedTooDeepFromBackend,
        Count::AdminConnectionsRefused,
        Count::DiskBudgetReached,
        Count::AlertsDropped,
        Count::UplinkResendsBackendBehind,
        Count::RefusalsSummarised,
        Count::PlainFromDevices,
        Count::PlainQos0FromDevices,
        Count::PlainWithheldFromDevices,
        Count::SparkplugFromDevices,
        Count::SparkplugSeqGaps,
        Count::SparkplugBdSeqMissing,
        Count::SparkplugOutOfSession,
        Count::SparkplugUndecodable,
        Count::SparkplugHistorical,
    ];

    /// The metric's name under the `ferry_` prefix (the sample adds
    /// `_total`).
    pub(super) fn name(self) -> &'static str {
        match self {
            Count::DevicesRefused => "devices_refused",
            Count::OversizedFromDevices => "oversized_from_devices",
            Count::UnauthorizedFromDevices => "unauthorized_from_devices",
            Count::NestedTooDeepFromDevices => "nested_too_deep_from_devices",
            Count::RateLimitedFromDevices => "rate_limited_from_devices",
            Count::InflightLimitedFromDevices => "inflight_limited_from_devices",
            Count::OversizedFromUpstream => "oversized_from_upstream",
            Count::NestedTooDeepFromBackend => "nested_too_deep_from_backend",
            Count::AdminConnectionsRefused => "admin_connections_refused",
            Count::DiskBudgetReached => "disk_budget_reached",
            Count::AlertsDropped => "alerts_dropped",
            Count::UplinkResendsBackendBehind => "uplink_resends_backend_behind",
            Count::RefusalsSummarised => "refusals_summarised",
            Count::PlainFromDevices => "plain_from_devices",
            Count::PlainQos0FromDevices => "plain_qos0_from_devices",
            Count::PlainWithheldFromDevices => "plain_withheld_from_devices",
            Count::SparkplugFromDevices => "sparkplug_from_devices",
            Count::SparkplugSeqGaps => "sparkplug_seq_gaps",
            Count::SparkplugBdSeqMissing => "sparkplug_bdseq_missing",
            Count::SparkplugOutOfSession => "sparkplug_out_of_session",
            Count::SparkplugUndecodable => "sparkplug_undecodable",
            Count::SparkplugHistorical => "sparkplug_historical",
        }
    }

    pub(super) fn help(self) -> &'static str {
        match self {
            Count::DevicesRefused => "CONNECTs refused by the connect hook: a client id that is no device id, or device authentication",
            Count::OversizedFromDevices => "Device publishes over south.max_payload_bytes",
            Count::UnauthorizedFromDevices => "Device publishes outside the device's own topics",
            Count::NestedTooDeepFromDevices => "Device messages nested deeper than 32 levels",
            Count::RateLimitedFromDevices => "Device publishes over south.rate_per_s/burst",
            Count::InflightLimitedFromDevices => "Device uplinks over south.max_inflight_per_device",
            Count::OversizedFromUpstream => "Upstream messages over north.max_packet_bytes",
            Count::NestedTooDeepFromBackend => "Backend messages nested deeper than 32 levels",
            Count::AdminConnectionsRefused => "Admin HTTP connections closed at once: the server's connection limit was reached",
            Count::DiskBudgetReached => "Times the store reached store.max_db_bytes",
            Count::AlertsDropped => "Alerts dropped: the in-memory queue was full or the upstream refused one",
            Count::UplinkResendsBackendBehind => "Uplink ack timeouts not counted as failures: the backend acked only messages sent earlier (it is there, but behind), so the uplink was sent again after the retry backoff",
            Count::PlainFromDevices => "Plain device publishes (south.plain_topics, no envelope) taken",
            Count::PlainQos0FromDevices => "Plain device publishes at QoS 0 (stored best effort: the device is told nothing)",
            Count::PlainWithheldFromDevices => "Plain device publishes over a per-device limit: not acknowledged and the connection closed (QoS 1, 2: the device sends them again), or not kept (QoS 0)",
            Count::SparkplugFromDevices => "Sparkplug B edge node publishes (spBv1.0, [south.sparkplug]) taken",
            Count::SparkplugSeqGaps => "Sparkplug B publishes whose seq was not the one due (a gap, a repeat, an NBIRTH not at 0): logged, never fixed",
            Count::SparkplugBdSeqMissing => "Sparkplug B NBIRTH or NDEATH publishes without a bdSeq metric",
            Count::SparkplugOutOfSession => "Sparkplug B publishes out of their node's session: data before its NBIRTH or after its NDEATH, an NDEATH of another bdSeq, or no seq",
            Count::SparkplugUndecodable => "Sparkplug B topic publishes whose payload is not Sparkplug B protobuf (stored as they came)",
            Count::SparkplugHistorical => "Sparkplug B publishes stored marked historical: north was down or the primary host not online",
            Count::RefusalsSummarised => "Refusals at the door (malformed, too large, unauthorized, bad topic) summed in one dead letter instead of one each: their sender's dead-letter share, or all shares together, was full",
        }
    }
}

/// The [`Count`] counters, exposed in [`Count::ALL`]'s order. A collector
/// rather than registered metrics because their HELP texts have always
/// been written as they are (the registry would add a full stop).
#[derive(Debug)]
pub(super) struct Counts(pub [Counter; Count::ALL.len()]);

impl Collector for Counts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for c in Count::ALL {
            let counter = &self.0[c as usize];
            let metric =
                encoder.encode_descriptor(c.name(), c.help(), None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_count_sits_at_its_own_place_in_all() {
        for (i, c) in Count::ALL.into_iter().enumerate() {
            assert_eq!(c as usize, i, "{c:?}");
        }
    }
}
