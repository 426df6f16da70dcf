//! The wire contract of docs/PROTOCOL.md as plain types and functions:
//! topics, the uplink envelope, receipts and backend acks. No I/O here.

pub mod ack;
pub mod control;
pub mod envelope;
pub mod receipt;
pub mod topics;

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
