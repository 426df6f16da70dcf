//! Uplink records: a validated message on its way in (its north body built
//! on the caller's thread), a stored message waiting for the backend, what
//! a repeated `(device, msg_id)` already is, and the moves asked of a
//! stored message (a final state, a failed attempt). Plain data.

use bytes::Bytes;

use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::envelope::Envelope;
use crate::protocol::north::{north_body, Stamp};
use crate::protocol::receipt::Receipt;
use crate::state::MessageState;
use crate::store::clock::Now;

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
    /// When ferry took the device's publish; [`Intake::new`] assumes
    /// `stored_ms`, [`Intake::received_at`] says otherwise.
    pub received_ms: i64,
    pub stored_ms: i64,
    /// On the store clock: `ttl_s` counts time in the store.
    pub expires_ms: Option<i64>,
    pub no_retry: bool,
}

impl Intake {
    /// What storing it costs, as the disk budget estimates it: its body,
    /// its ids (in the row and in the dedup index) and a row's overhead.
    pub fn cost(&self) -> u64 {
        let ids = self.device.as_str().len() + self.msg_id.as_str().len();
        (self.body.len() + self.stream.len() + 2 * ids) as u64 + 96
    }

    /// Stamps `envelope` for the store at `now`: `stored_ms` on the wall
    /// clock, its expiry on the store clock. The JSON work happens here,
    /// on the caller's thread, not on the store's writer.
    pub fn new(
        gateway: &str,
        device: DeviceId,
        stream: String,
        envelope: Envelope,
        now: Now,
    ) -> Intake {
        let stored_ms = now.wall_ms;
        let stamp = Stamp {
            gateway,
            device: &device,
            stream: &stream,
            stored_ms,
        };
        let body = Bytes::from(north_body(&envelope, &stamp));
        Intake {
            expires_ms: envelope
                .ttl
                .map(|t| now.store_ms.saturating_add(t.as_millis() as i64)),
            no_retry: !envelope.retry,
            msg_id: envelope.msg_id,
            device,
            stream,
            body,
            received_ms: stored_ms,
            stored_ms,
        }
    }

    /// The same message, taken from the device at `received_ms`.
    pub fn received_at(self, received_ms: i64) -> Intake {
        Intake {
            received_ms,
            ..self
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
    /// On the store clock.
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

impl Duplicate {
    /// The answer to a duplicate: its current receipt, with its original seq.
    pub fn receipt(self) -> Receipt {
        match self.state {
            MessageState::Stored => Receipt::stored(&self.msg_id, self.seq),
            MessageState::Delivered => Receipt::delivered(&self.msg_id, self.seq),
            MessageState::Dead => Receipt::failed(
                &self.msg_id,
                self.seq,
                self.reason.unwrap_or_else(|| "dead".into()),
            ),
        }
    }
}

/// What intake hands the uplink engine.
#[derive(Debug, Clone, PartialEq)]
pub enum ToEngine {
    /// Newly stored; its `stored` receipt is out. `committed`: when its
    /// commit returned (monotonic), for the stage histograms.
    Stored {
        msg: PendingMessage,
        committed: std::time::Instant,
    },
    /// A duplicate of a message that was still `stored` when intake looked.
    /// The engine answers it: it alone knows whether a `delivered` or
    /// `failed` for it is already out, and a receipt must never go back
    /// from those to `stored` (docs/PROTOCOL.md: receipts in state order).
    Duplicate {
        device: DeviceId,
        msg_id: MsgId,
        seq: Seq,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum IntakeOutcome {
    Stored(PendingMessage),
    Duplicate(Duplicate),
    /// New, and not stored: the store is at its disk budget (`detail`:
    /// the reason's words after its code).
    AtBudget {
        msg_id: MsgId,
        detail: String,
    },
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
    /// When it was stored (for the delivery latency).
    pub stored_ms: i64,
    /// Attempts counted when it moved.
    pub attempts: u32,
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
