//! Counters kept as atomics by the modules that bump them, read on scrape.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

#[derive(Debug)]
pub(super) struct Legacy;

/// `(name, help, counter)`; names are under the `ferry_` prefix.
fn legacy_counters() -> [(&'static str, &'static str, &'static AtomicU64); 18] {
    use crate::{alerts, north, south, store, uplink};
    [
        ("devices_refused", "CONNECTs refused by the connect hook: a client id that is no device id, or device authentication", &south::auth::REFUSED),
        ("oversized_from_devices", "Device publishes over south.max_payload_bytes", &uplink::intake::OVERSIZED_FROM_DEVICES),
        ("unauthorized_from_devices", "Device publishes outside the device's own topics", &uplink::intake::UNAUTHORIZED_FROM_DEVICES),
        ("nested_too_deep_from_devices", "Device messages nested deeper than 32 levels", &uplink::intake::NESTED_TOO_DEEP_FROM_DEVICES),
        ("rate_limited_from_devices", "Device publishes over south.rate_per_s/burst", &uplink::limits::RATE_LIMITED_FROM_DEVICES),
        ("inflight_limited_from_devices", "Device uplinks over south.max_inflight_per_device", &uplink::limits::INFLIGHT_LIMITED_FROM_DEVICES),
        ("oversized_from_upstream", "Upstream messages over north.max_packet_bytes", &north::OVERSIZED_FROM_UPSTREAM),
        ("nested_too_deep_from_backend", "Backend messages nested deeper than 32 levels", &crate::downlink::NESTED_TOO_DEEP_FROM_BACKEND),
        ("admin_connections_refused", "Admin HTTP connections closed at once: the server's connection limit was reached", &crate::admin::CONNECTIONS_REFUSED),
        ("disk_budget_reached", "Times the store reached store.max_db_bytes", &store::budget::DISK_BUDGET_REACHED),
        ("alerts_dropped", "Alerts dropped: the in-memory queue was full or the upstream refused one", &alerts::ALERTS_DROPPED),
        ("broker_subscriptions_refused", "SUBSCRIBEs the embedded broker refused (not the device's own topics, or over the limit)", &rumqttd::counters::SUBSCRIPTIONS_REFUSED),
        ("broker_protocol_violations", "Connections the embedded broker closed for a protocol violation", &rumqttd::counters::PROTOCOL_VIOLATIONS),
        ("broker_tls_handshakes_failed", "TLS handshakes that failed or timed out on the embedded listener", &rumqttd::counters::TLS_HANDSHAKES_FAILED),
        ("broker_certificate_id_refused", "CONNECTs whose client id was not the certificate's CN", &rumqttd::counters::CERTIFICATE_ID_REFUSED),
        ("broker_wills_refused", "CONNECTs refused because their will was on a topic the device may not publish on", &rumqttd::counters::WILLS_REFUSED),
        ("broker_client_ids_refused", "CONNECTs refused for a client id over 64 bytes (or one the broker cannot take), or a CONNECT too large to read", &rumqttd::counters::CLIENT_IDS_REFUSED),
        ("broker_connections_full", "CONNECTs refused because south.max_connections devices were connected", &rumqttd::counters::CONNECTIONS_FULL),
    ]
}

impl Collector for Legacy {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, value) in legacy_counters() {
            let counter = ConstCounter::new(value.load(Ordering::Relaxed));
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}
