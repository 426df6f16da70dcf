//! Downlink records: a message for one or more devices, inbox batches,
//! cursors and how they moved, the delivery events and the receipts
//! committed with them, and the words of every reason a delivery ends
//! with. Plain data.

use bytes::Bytes;

use super::refusal::Refusal;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::inbox::InboxRow;
use crate::protocol::receipt::Delivery;
use crate::state::DeliveryState;

/// Why a delivery was given up on, in the words receipts and dead letters
/// carry.
pub mod reason {
    /// The queue cap pushed a delivery out before it was delivered.
    pub fn queue_cap(cap: u64) -> String {
        format!("queue_cap: more than {cap} undelivered")
    }

    /// The message's `ttl_s` passed before delivery.
    pub const TTL: &str = "ttl: ttl_s passed before delivery";

    /// The device nacked the delivery.
    pub fn nacked(reason: &str) -> String {
        format!("nacked: {reason}")
    }

    /// A downlink for a plain device whose body has no payload to send
    /// bare (`south.plain_down`).
    pub const NOT_PLAIN: &str = "malformed: no payload or payload_b64 to send to a plain device";

    /// A downlink refused at intake, with its dead letter.
    pub fn rejected(reason: &str, dead_letter: i64) -> String {
        format!("{reason} (dead letter {dead_letter})")
    }

    /// A receipt north the upstream broker dropped the link on every time.
    pub fn receipt_undeliverable(attempts: u32) -> String {
        format!("undeliverable: the upstream broker closed the connection on this receipt {attempts} times")
    }
}

/// A validated downlink message for one or more devices.
#[derive(Debug, Clone)]
pub struct DownIntake {
    pub msg_id: MsgId,
    /// The inbox entry as JSON, without `seq`.
    pub body: Bytes,
    /// When the backend's publish reached ferry.
    pub received_ms: i64,
    pub stored_ms: i64,
    /// On the store clock: `ttl_s` counts time in the store.
    pub expires_ms: Option<i64>,
    pub to: Vec<DeviceId>,
    /// Whether it came on `down/{device}` (its one device named by the
    /// topic): a refusal at the disk budget then names the device.
    pub by_topic: bool,
    pub queue_cap: u64,
}

/// A receipt for the backend as committed in the outbox, in the same
/// transaction as the state change it reports; it stays there until the
/// upstream broker acknowledges the message that carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxReceipt {
    /// Its row in the outbox: ids grow in commit order and are never reused.
    pub id: i64,
    /// The receipt as JSON, as it goes north.
    pub body: Bytes,
}

/// A delivery that changed state (or, for intake, exists): one receipt north.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryEvent {
    pub device: DeviceId,
    pub seq: Seq,
    pub msg_id: MsgId,
    pub state: DeliveryState,
    pub reason: Option<String>,
}

impl DeliveryEvent {
    /// The fields its receipt north reports.
    pub fn delivery(&self) -> Delivery<'_> {
        Delivery {
            device: &self.device,
            msg_id: &self.msg_id,
            seq: self.seq,
            state: self.state,
            reason: self.reason.as_deref(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DownIntakeOutcome {
    /// One per addressed device: its delivery's current state; `new` ones are `Stored`.
    pub queued: Vec<(DeliveryEvent, bool)>,
    /// Deliveries pushed out by the queue cap.
    pub expired: Vec<DeliveryEvent>,
    /// The receipts of all of them, committed in the outbox.
    pub receipts: Vec<OutboxReceipt>,
    /// Deliveries refused at the disk budget (not queued; answered
    /// `rejected` with reason `disk_budget`, receipts included above).
    pub refused: usize,
}

/// One entry of an inbox batch; `body: None` is a tombstone.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchEntry {
    pub seq: Seq,
    pub msg_id: MsgId,
    pub state: DeliveryState,
    pub body: Option<Bytes>,
}

impl BatchEntry {
    /// The entry as an inbox batch carries it.
    pub fn row(&self) -> InboxRow<'_> {
        InboxRow {
            seq: self.seq,
            msg_id: &self.msg_id,
            state: self.state,
            body: self.body.as_deref(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchRead {
    pub entries: Vec<BatchEntry>,
    /// The device's last assigned seq.
    pub head: Seq,
    /// Deliveries that expired (ttl) while being read.
    pub expired: Vec<DeliveryEvent>,
    /// Their receipts, committed in the outbox.
    pub receipts: Vec<OutboxReceipt>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursors {
    pub head: Seq,
    pub delivered_upto: Seq,
    pub read_upto: Seq,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CursorMove {
    pub cursors: Cursors,
    /// How far a confirm or read reached, as the store took it (never past
    /// what was sent); `None` for a nack. Below the cursor when the device
    /// confirmed a batch replayed from behind it.
    pub confirmed: Option<Seq>,
    pub events: Vec<DeliveryEvent>,
    /// For each delivery confirmed, how long after its message was stored
    /// (milliseconds; for the delivery latency).
    pub delivered_after_ms: Vec<i64>,
    /// Their receipts, committed in the outbox.
    pub receipts: Vec<OutboxReceipt>,
}

/// Deliveries of messages whose ttl passed, expired by a sweep.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Swept {
    pub events: Vec<DeliveryEvent>,
    /// Deliveries `ferry dlq replay` sent again, `stored` under a new seq
    /// (taken in the same pass).
    pub replayed: Vec<DeliveryEvent>,
    /// Their receipts, committed in the outbox.
    pub receipts: Vec<OutboxReceipt>,
}

/// A rejected downlink, dead-lettered, and its `rejected` receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The dead letter that holds it, or why there is none.
    pub refusal: Refusal,
    pub receipt: OutboxReceipt,
}
