//! Sparkplug B 3.0 (Eclipse Sparkplug over MQTT) as plain types and
//! functions: its topics, its host STATE messages, and its protobuf
//! payloads. No I/O here.
//!
//! - [`parse_topic`] and [`parse_state_topic`] read the
//!   `spBv1.0/{group}/{message_type}/{edge_node}[/{device}]` and
//!   `spBv1.0/STATE/{host_id}` topics.
//! - [`parse_state`] reads a host's STATE JSON.
//! - [`summarise`] reads what sequence checking needs from a payload;
//!   [`SeqCheck`] checks one edge node's `seq` and `bdSeq` as 3.0 defines
//!   them.
//! - [`mark_historical`] re-encodes a payload with every metric marked
//!   historical, losing nothing else.
//! - [`proto`] holds the payload messages, written by hand after Eclipse
//!   Tahu's `sparkplug_b.proto` (vendored in `vendor/tahu/`).
//! - [`encode_example`] and [`encode_death_example`] make real payloads
//!   for tests.
//! - [`edge`]: edge nodes as ferry devices (their topics, the body ferry
//!   stores, each node's checks).

pub mod edge;
mod ext;
pub mod proto;
mod seq;
#[cfg(test)]
mod tests;
mod topic;

pub use seq::{SeqCheck, Summary, Verdict};
pub use topic::{parse_state_topic, parse_topic, Kind, Topic, NAMESPACE};

use prost::Message;
use proto::payload::{metric, Metric};
use proto::{DataType, Payload, PayloadFields};

/// The name of the metric carrying the birth/death sequence number.
pub const BD_SEQ: &str = "bdSeq";

/// A host application's STATE message (Sparkplug 3.0 JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct State {
    /// Whether the host is online.
    pub online: bool,
    /// When the host said so, ms since the epoch.
    pub timestamp: Option<u64>,
}

/// Reads a STATE payload, `{"online": true, "timestamp": 1668114759262}`:
/// `online` is required, `timestamp` optional, other members ignored.
pub fn parse_state(payload: &[u8]) -> Result<State, SparkplugError> {
    use super::depth::{nested_deeper_than, MAX_DEPTH};
    if nested_deeper_than(payload, MAX_DEPTH) {
        return Err(SparkplugError::State(format!(
            "JSON nested deeper than {MAX_DEPTH} levels"
        )));
    }
    serde_json::from_slice(payload).map_err(|e| SparkplugError::State(e.to_string()))
}

/// Decodes a Sparkplug B payload.
pub fn decode(payload: &[u8]) -> Result<Payload, SparkplugError> {
    Payload::decode(payload).map_err(SparkplugError::Decode)
}

/// Decodes a payload and summarises it. `bd_seq` is the `long_value` (or
/// `int_value`) of the first metric named `bdSeq`.
pub fn summarise(payload: &[u8]) -> Result<Summary, SparkplugError> {
    let payload = decode(payload)?;
    Ok(Summary {
        seq: payload.seq,
        timestamp: payload.timestamp,
        bd_seq: bd_seq(&payload.metrics),
        metrics: payload.metrics.len(),
    })
}

fn bd_seq(metrics: &[Metric]) -> Option<u64> {
    let metric = metrics.iter().find(|m| m.name.as_deref() == Some(BD_SEQ))?;
    match metric.value {
        Some(metric::Value::LongValue(v)) => Some(v),
        Some(metric::Value::IntValue(v)) => Some(u64::from(v)),
        _ => None,
    }
}

/// Decodes a payload, sets `is_historical` on each of its metrics (the
/// payload's own, not those nested in a template), and encodes it again.
/// Every other field, extensions included, is kept.
pub fn mark_historical(payload: &[u8]) -> Result<Vec<u8>, SparkplugError> {
    let mut payload = decode(payload)?;
    for metric in &mut payload.metrics {
        metric.is_historical = Some(true);
    }
    Ok(payload.encode_to_vec())
}

/// Why a Sparkplug payload could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SparkplugError {
    /// The bytes are not a protobuf `Payload`.
    #[error("not a Sparkplug B payload: {0}")]
    Decode(prost::DecodeError),
    /// A STATE payload that is not the JSON Sparkplug 3.0 defines.
    #[error("bad Sparkplug STATE payload: {0}")]
    State(String),
}

/// The `timestamp` of the payloads [`encode_example`] makes.
pub const EXAMPLE_TIMESTAMP: u64 = 1_668_114_759_262;

/// A real payload for tests: timestamp [`EXAMPLE_TIMESTAMP`], `seq`, a
/// `bdSeq` metric (Int64) first when given, then one Double metric per
/// `(name, value)`.
pub fn encode_example(seq: u64, bd_seq: Option<u64>, metrics: &[(&str, f64)]) -> Vec<u8> {
    let bd_seq = bd_seq.map(bd_seq_metric);
    let doubles = metrics.iter().map(|&(name, value)| Metric {
        name: Some(name.to_owned()),
        datatype: Some(DataType::Double as u32),
        value: Some(metric::Value::DoubleValue(value)),
        ..Default::default()
    });
    Payload::new(PayloadFields {
        timestamp: Some(EXAMPLE_TIMESTAMP),
        metrics: bd_seq.into_iter().chain(doubles).collect(),
        seq: Some(seq),
        ..Default::default()
    })
    .encode_to_vec()
}

/// A real NDEATH payload for tests: timestamp [`EXAMPLE_TIMESTAMP`], no
/// `seq`, and the `bdSeq` metric.
pub fn encode_death_example(bd_seq: u64) -> Vec<u8> {
    Payload::new(PayloadFields {
        timestamp: Some(EXAMPLE_TIMESTAMP),
        metrics: vec![bd_seq_metric(bd_seq)],
        ..Default::default()
    })
    .encode_to_vec()
}

fn bd_seq_metric(bd_seq: u64) -> Metric {
    Metric {
        name: Some(BD_SEQ.to_owned()),
        datatype: Some(DataType::Int64 as u32),
        value: Some(metric::Value::LongValue(bd_seq)),
        ..Default::default()
    }
}
