//! The embedded broker's own counters (the vendored rumqttd keeps them as
//! atomics of its own, vendor/README.md), read at each scrape.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

#[derive(Debug)]
pub(super) struct Broker;

/// `(name, help, counter)`; names are under the `ferry_` prefix.
fn broker_counters() -> [(&'static str, &'static str, &'static AtomicU64); 10] {
    use rumqttd::counters;
    [
        ("broker_subscriptions_refused", "SUBSCRIBEs the embedded broker refused (not the device's own topics, or over the limit)", &counters::SUBSCRIPTIONS_REFUSED),
        ("broker_protocol_violations", "Connections the embedded broker closed for a protocol violation", &counters::PROTOCOL_VIOLATIONS),
        ("broker_tls_handshakes_failed", "TLS handshakes that failed or timed out on the embedded listener", &counters::TLS_HANDSHAKES_FAILED),
        ("broker_certificate_id_refused", "CONNECTs whose client id was not the certificate's CN", &counters::CERTIFICATE_ID_REFUSED),
        ("broker_wills_refused", "CONNECTs refused because their will was on a topic the device may not publish on", &counters::WILLS_REFUSED),
        ("broker_client_ids_refused", "CONNECTs refused for a client id over 64 bytes (or one the broker cannot take), or a CONNECT too large to read", &counters::CLIENT_IDS_REFUSED),
        ("broker_connections_full", "CONNECTs refused because south.max_connections devices were connected", &counters::CONNECTIONS_FULL),
        ("broker_deliveries_over_client_packet_size", "Receipts and batches not sent because they were over the device's MQTT 5 maximum packet size", &counters::DIRECT_TOO_LARGE),
        ("broker_session_messages_left_out", "Deliveries a device's full MQTT session left out (the protocol sends them again)", &counters::SESSION_MESSAGES_DROPPED),
        ("broker_session_messages_over_budget", "Deliveries left out of MQTT sessions because all sessions together held south.max_session_bytes (the protocol sends them again)", &counters::SESSION_MESSAGES_OVER_BUDGET),
    ]
}

/// Connections accepted, by the MQTT version the device spoke.
fn connects_by_protocol() -> [(&'static str, &'static AtomicU64); 3] {
    use rumqttd::counters;
    [
        ("3.1", &counters::CONNECTS_V31),
        ("3.1.1", &counters::CONNECTS_V311),
        ("5", &counters::CONNECTS_V5),
    ]
}

impl Collector for Broker {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, value) in broker_counters() {
            let counter = ConstCounter::new(value.load(Ordering::Relaxed));
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        let bytes = rumqttd::counters::SESSION_BYTES.load(Ordering::Relaxed);
        let gauge = ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
        let metric = encoder.encode_descriptor(
            "broker_session_bytes",
            "What the receipts and batches kept in devices' MQTT sessions cost in memory now, bytes (at most south.max_session_bytes)",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)?;
        let counter = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "broker_connects",
            "Device connections the embedded broker accepted, by MQTT version",
            None,
            counter.metric_type(),
        )?;
        for (protocol, value) in connects_by_protocol() {
            let counter = ConstCounter::new(value.load(Ordering::Relaxed));
            counter.encode(family.encode_family(&[("protocol", protocol)])?)?;
        }
        Ok(())
    }
}
