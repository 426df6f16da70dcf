//! The wire contract of docs/PROTOCOL.md as plain types and functions:
//! topics, the uplink envelope, receipts and backend acks. No I/O here.

pub mod ack;
pub mod control;
pub mod envelope;
pub mod receipt;
pub mod topics;

/// Milliseconds since the Unix epoch, the protocol's clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
