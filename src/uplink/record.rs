//! The uplink's records: what intake hands the store, what the store hands
//! back, and the moves the engine asks for. Plain data; the store persists
//! these and depends on this module, never the reverse.

use bytes::Bytes;

use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::envelope::{north_body, Envelope, Stamp};
use crate::state::MessageState;

/// The reason written for a message whose `ttl_s` ran out.
pub const EXPIRED_REASON: &str = "expired: ttl_s passed before the backend acked";

/// A validated uplink message on its way in, its north body built.
#[derive(Debug, Clone)]
pub struct Intake {
    pub device: DeviceId,
    pub msg_id: MsgId,
    pub stream: String,
    /// The north body without `seq` ([`north_body`]).
    pub body: Bytes,
    pub stored_ms: i64,
    pub expires_ms: Option<i64>,
    pub no_retry: bool,
}

impl Intake {
    /// Stamps `envelope` for the store; the JSON work happens here, on the
    /// caller's thread, not on the store's writer.
    pub fn new(
        gateway: &str,
        device: DeviceId,
        stream: String,
        envelope: Envelope,
        stored_ms: i64,
    ) -> Intake {
        let stamp = Stamp {
            gateway,
            device: &device,
            stream: &stream,
            stored_ms,
        };
        let body = Bytes::from(north_body(&envelope.fields, &stamp));
        Intake {
            expires_ms: envelope
                .ttl
                .map(|t| stored_ms.saturating_add(t.as_millis() as i64)),
            no_retry: !envelope.retry,
            msg_id: envelope.msg_id,
            device,
            stream,
            body,
            stored_ms,
        }
    }
}

/// A stored message waiting for the backend.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingMessage {
    pub id: i64,
    pub device: DeviceId,
    pub msg_id: MsgId,
    pub seq: Seq,
    pub stream: String,
    pub body: Bytes,
    pub expires_ms: Option<i64>,
    pub no_retry: bool,
    pub attempts: u32,
}

/// What a repeated `(device, msg_id)` already is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    pub msg_id: MsgId,
    pub seq: Seq,
    pub state: MessageState,
    /// Why it died, for a `failed` receipt.
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum IntakeOutcome {
    Stored(PendingMessage),
    Duplicate(Duplicate),
}

/// Move a stored message to a final state.
#[derive(Debug, Clone)]
pub struct Transition {
    pub device: DeviceId,
    pub msg_id: MsgId,
    pub to: MessageState,
    pub attempts: u32,
    /// For `Dead`: the reason (`code: detail`), also written to the dead letter.
    pub reason: Option<String>,
    pub at_ms: i64,
}

impl Transition {
    /// The reason its dead letter carries.
    pub fn dead_reason(&self) -> &str {
        self.reason.as_deref().unwrap_or("dead")
    }
}

/// What a committed transition moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub id: i64,
    pub seq: Seq,
}

/// A failed attempt that counted towards `retry.max_attempts`.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub id: i64,
    pub attempts: u32,
    pub next_attempt_ms: i64,
    pub error: String,
    pub at_ms: i64,
}

impl AttemptRecord {
    /// The line its message's history gets.
    pub fn detail(&self) -> String {
        format!("attempt {} failed: {}", self.attempts, self.error)
    }
}
