//! The wire contract of docs/PROTOCOL.md as plain types and functions, for
//! both sides: the gateway and the devices' and backends' clients build
//! and read every message and topic through this module. No I/O here.
//!
//! - [`topics`]: every topic, for one device ([`topics::DeviceTopics`]), one
//!   gateway's north side ([`topics::NorthTopics`]) and the gateway's
//!   parsing of what arrives ([`topics::Topics`]).
//! - [`envelope`]: the payload envelope, and the gateway's intake checks.
//! - [`receipt`]: uplink receipts to devices, delivery receipts north.
//! - [`ack`]: the backend's `ok`/`nack` for uplinks.
//! - [`control`]: `confirm`, `pull`, `read`, `nack`, `status` from devices,
//!   and the status both devices and the gateway publish.
//! - [`inbox`]: downlink batches to devices.
//! - [`north`]: the uplink message the backend receives.
//! - [`plain`]: plain devices' topics (no envelope) and ferry's ids for
//!   their messages.
//! - [`user_props`]: an MQTT 5 publish's user properties, bounded, as the
//!   `props` the backend receives.
//! - [`alert`]: the kinds of alert the gateway publishes.
//! - [`depth`]: how deep a JSON text nests, checked before any of the
//!   above parses what a peer sent.
//!
//! Each wire type derives `Serialize` and `Deserialize`, so what one side
//! writes the other reads with the same type; the unit tests parse the
//! examples of docs/PROTOCOL.md verbatim.

pub mod ack;
pub mod alert;
pub mod control;
pub mod depth;
pub mod envelope;
pub mod inbox;
pub mod north;
pub mod plain;
pub mod plain_down;
#[cfg(test)]
mod props;
pub mod receipt;
mod sniff;
pub mod sparkplug;
pub mod topics;
pub mod user_props;

/// The largest MQTT packet there is: the remaining length is at most
/// 268,435,455, plus 5 bytes of fixed header.
pub const MQTT_MAX_PACKET: usize = 268_435_455 + 5;

/// Bytes of a QoS 1 PUBLISH packet with this topic and payload (MQTT 3.1.1:
/// fixed header, topic length and name, packet id, payload).
pub fn publish_packet_len(topic_len: usize, payload_len: usize) -> usize {
    let remaining = 2 + topic_len + 2 + payload_len;
    let header = match remaining {
        0..=127 => 2,
        128..=16_383 => 3,
        16_384..=2_097_151 => 4,
        _ => 5,
    };
    header + remaining
}

/// Appends `{"seq":N,` and `object` without its opening brace: a stored
/// JSON object gains its `seq` without being parsed again. `object` is a
/// non-empty JSON object.
pub(crate) fn push_with_seq(out: &mut Vec<u8>, seq: crate::ids::Seq, object: &[u8]) {
    debug_assert!(object.len() > 2 && object[0] == b'{');
    out.extend_from_slice(b"{\"seq\":");
    out.extend_from_slice(seq.0.to_string().as_bytes());
    out.push(b',');
    out.extend_from_slice(&object[1..]);
}

/// Milliseconds since the Unix epoch, the protocol's clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_packet_lengths_count_the_variable_header() {
        assert_eq!(publish_packet_len(1, 0), 2 + 2 + 1 + 2);
        assert_eq!(publish_packet_len(10, 113), 2 + 127);
        assert_eq!(publish_packet_len(10, 114), 3 + 128);
        assert_eq!(publish_packet_len(0, 2_097_151 - 4), 4 + 2_097_151);
    }
}
