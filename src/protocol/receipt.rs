//! Receipts: uplink receipts to devices (`{south}/{device}/ack`,
//! [`Receipt`]) and delivery receipts to the backend (`{north}/receipts`,
//! [`NorthReceipt`], one object or an array).
//!
//! A receipt states a fact already committed to the store; building one is
//! the last step after a commit, never a promise.

use serde::{Deserialize, Serialize};

use super::envelope::RejectCode;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::state::DeliveryState;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReceiptStatus {
    Stored,
    Delivered,
    Failed,
    Rejected,
}

/// An uplink receipt, as the device reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// `null` where the message's id could not be read.
    pub msg_id: Option<MsgId>,
    pub status: ReceiptStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<Seq>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The dead-letter row of a `rejected` message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<i64>,
}

impl Receipt {
    pub fn stored(msg_id: &MsgId, seq: Seq) -> Receipt {
        Receipt::of(msg_id, ReceiptStatus::Stored, seq)
    }

    pub fn delivered(msg_id: &MsgId, seq: Seq) -> Receipt {
        Receipt::of(msg_id, ReceiptStatus::Delivered, seq)
    }

    pub fn failed(msg_id: &MsgId, seq: Seq, reason: impl Into<String>) -> Receipt {
        Receipt {
            reason: Some(reason.into()),
            ..Receipt::of(msg_id, ReceiptStatus::Failed, seq)
        }
    }

    pub fn rejected(
        msg_id: Option<&MsgId>,
        reason: impl Into<String>,
        dead_letter: i64,
    ) -> Receipt {
        Receipt {
            msg_id: msg_id.cloned(),
            status: ReceiptStatus::Rejected,
            seq: None,
            reason: Some(reason.into()),
            dead_letter: Some(dead_letter),
        }
    }

    /// `rejected` before the store: nothing was kept (no dead letter), and
    /// the device keeps the message and resends it (reason `rate`).
    pub fn refused(msg_id: Option<&MsgId>, reason: impl Into<String>) -> Receipt {
        Receipt {
            msg_id: msg_id.cloned(),
            status: ReceiptStatus::Rejected,
            seq: None,
            reason: Some(reason.into()),
            dead_letter: None,
        }
    }

    /// Whether the device should keep the message and resend it after its
    /// receipt timeout: a `rejected` with reason code `rate` or
    /// `disk_budget`, the retryable rejections (docs/PROTOCOL.md).
    pub fn is_retryable(&self) -> bool {
        self.status == ReceiptStatus::Rejected
            && self
                .reason
                .as_deref()
                .and_then(|r| r.split(':').next())
                .is_some_and(|code| {
                    code == RejectCode::Rate.as_str() || code == RejectCode::DiskBudget.as_str()
                })
    }

    fn of(msg_id: &MsgId, status: ReceiptStatus, seq: Seq) -> Receipt {
        Receipt {
            msg_id: Some(msg_id.clone()),
            status,
            seq: Some(seq),
            reason: None,
            dead_letter: None,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a receipt serializes")
    }
}

/// Where a downlink delivery stands, as told north (`failed` is a dead
/// letter; `rejected` a downlink that was not accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NorthStatus {
    Stored,
    Delivered,
    Read,
    Expired,
    Failed,
    Rejected,
}

impl NorthStatus {
    pub const ALL: [NorthStatus; 6] = [
        NorthStatus::Stored,
        NorthStatus::Delivered,
        NorthStatus::Read,
        NorthStatus::Expired,
        NorthStatus::Failed,
        NorthStatus::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NorthStatus::Stored => "stored",
            NorthStatus::Delivered => "delivered",
            NorthStatus::Read => "read",
            NorthStatus::Expired => "expired",
            NorthStatus::Failed => "failed",
            NorthStatus::Rejected => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<NorthStatus> {
        NorthStatus::ALL.into_iter().find(|n| n.as_str() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_match_the_protocol_examples() {
        let id = MsgId::new("a-000017").unwrap();
        assert_eq!(
            String::from_utf8(Receipt::stored(&id, Seq(17)).to_bytes()).unwrap(),
            r#"{"msg_id":"a-000017","status":"stored","seq":17}"#
        );
        assert_eq!(
            String::from_utf8(
                Receipt::rejected(None, "malformed: expected JSON object", 12).to_bytes()
            )
            .unwrap(),
            r#"{"msg_id":null,"status":"rejected","reason":"malformed: expected JSON object","dead_letter":12}"#
        );
        let failed: serde_json::Value = serde_json::from_slice(
            &Receipt::failed(&id, Seq(17), "nacked: unknown sensor").to_bytes(),
        )
        .unwrap();
        assert_eq!(failed["status"], "failed");
        assert_eq!(failed["reason"], "nacked: unknown sensor");
    }

    #[test]
    fn the_protocol_examples_are_receipts() {
        let id = MsgId::new("a-000017").unwrap();
        let examples = [
            (
                r#"{"msg_id": "a-000017", "status": "stored", "seq": 17}"#,
                Receipt::stored(&id, Seq(17)),
            ),
            (
                r#"{"msg_id": "a-000017", "status": "delivered", "seq": 17}"#,
                Receipt::delivered(&id, Seq(17)),
            ),
            (
                r#"{"msg_id": null, "status": "rejected", "reason": "malformed: expected JSON object", "dead_letter": 12}"#,
                Receipt::rejected(None, "malformed: expected JSON object", 12),
            ),
            (
                r#"{"msg_id": "a-000018", "status": "rejected", "reason": "rate: over 200 publishes per second, burst 400"}"#,
                Receipt::refused(
                    Some(&MsgId::new("a-000018").unwrap()),
                    "rate: over 200 publishes per second, burst 400",
                ),
            ),
        ];
        for (text, receipt) in examples {
            assert_eq!(serde_json::from_str::<Receipt>(text).unwrap(), receipt);
            assert_eq!(
                serde_json::from_slice::<Receipt>(&receipt.to_bytes()).unwrap(),
                receipt
            );
        }
        let failed: Receipt = serde_json::from_str(
            r#"{"msg_id": "a-000017", "status": "failed", "reason": "nacked: unknown sensor"}"#,
        )
        .unwrap();
        assert_eq!((failed.status, failed.seq), (ReceiptStatus::Failed, None));
    }

    #[test]
    fn only_rate_and_disk_budget_rejections_are_retryable() {
        let id = MsgId::new("a-1").unwrap();
        assert!(Receipt::refused(
            Some(&id),
            "disk_budget: the store is at store.max_db_bytes (9 of 8 bytes); resend later"
        )
        .is_retryable());
        assert!(
            Receipt::refused(Some(&id), "rate: more than 256 uplinks in flight").is_retryable()
        );
        assert!(
            Receipt::refused(None, "rate: over 1 publishes per second, burst 1").is_retryable()
        );
        for not in [
            Receipt::rejected(Some(&id), "malformed: nested deeper than 32", 3),
            Receipt::rejected(Some(&id), "unauthorized: rate: x", 3),
            Receipt::refused(Some(&id), "rated: x"),
            Receipt::failed(&id, Seq(1), "rate: x"),
            Receipt::stored(&id, Seq(1)),
        ] {
            assert!(!not.is_retryable(), "{not:?}");
        }
    }

    #[test]
    fn north_receipts_round_trip_one_or_many() {
        let r = NorthReceipt {
            msg_id: Some("n-9".into()),
            device: Some("press-7".into()),
            status: "read",
            seq: Some(41),
            ts: 1764470000999,
            reason: None,
        };
        let one = serde_json::to_vec(&r).unwrap();
        assert_eq!(
            String::from_utf8(one.clone()).unwrap(),
            r#"{"msg_id":"n-9","device":"press-7","status":"read","seq":41,"ts":1764470000999}"#
        );
        assert_eq!(NorthReceipt::parse_many(&one).unwrap(), vec![r.clone()]);
        let rejected = NorthReceipt {
            msg_id: None,
            device: None,
            status: "rejected",
            seq: None,
            ts: 1,
            reason: Some("malformed: missing msg_id".into()),
        };
        let many = serde_json::to_vec(&[r.clone(), rejected.clone()]).unwrap();
        assert_eq!(NorthReceipt::parse_many(&many).unwrap(), vec![r, rejected]);
        assert_eq!(
            NorthReceipt::parse_many(br#"{"msg_id":"m","status":"lost","ts":1}"#).ok(),
            None,
            "only the protocol's statuses"
        );
        for s in NorthStatus::ALL {
            assert_eq!(NorthStatus::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    #[test]
    fn a_delivery_receipt_names_the_device_and_says_failed_for_dead() {
        let (device, msg_id) = (DeviceId::new("pump-7").unwrap(), MsgId::new("n-9").unwrap());
        let delivery = Delivery {
            device: &device,
            msg_id: &msg_id,
            seq: Seq(41),
            state: DeliveryState::Dead,
            reason: Some("nacked: no room"),
        };
        assert_eq!(
            String::from_utf8(serde_json::to_vec(&NorthReceipt::of(delivery, 5)).unwrap()).unwrap(),
            r#"{"msg_id":"n-9","device":"pump-7","status":"failed","seq":41,"ts":5,"reason":"nacked: no room"}"#
        );
        let delivered = Delivery {
            state: DeliveryState::Delivered,
            reason: None,
            ..delivery
        };
        assert_eq!(
            String::from_utf8(serde_json::to_vec(&NorthReceipt::of(delivered, 6)).unwrap())
                .unwrap(),
            r#"{"msg_id":"n-9","device":"pump-7","status":"delivered","seq":41,"ts":6}"#
        );
    }
}

/// A receipt north on `{prefix}/receipts`, for one downlink delivery:
/// `{msg_id, device, status, seq, ts, reason}`. `msg_id` is `null` and
/// `device` absent for a downlink whose id or recipient could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NorthReceipt {
    pub msg_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// One of [`NorthStatus`]'s names.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub ts: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// [`NorthReceipt`] on the way in: a `&'static str` cannot be read, so the
/// status is read as a [`NorthStatus`] (only the protocol's names pass).
#[derive(Deserialize)]
struct ReadNorthReceipt {
    msg_id: Option<String>,
    #[serde(default)]
    device: Option<String>,
    status: NorthStatus,
    #[serde(default)]
    seq: Option<u64>,
    ts: i64,
    #[serde(default)]
    reason: Option<String>,
}

impl<'de> Deserialize<'de> for NorthReceipt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<NorthReceipt, D::Error> {
        let r = ReadNorthReceipt::deserialize(d)?;
        Ok(NorthReceipt {
            msg_id: r.msg_id,
            device: r.device,
            status: r.status.as_str(),
            seq: r.seq,
            ts: r.ts,
            reason: r.reason,
        })
    }
}

impl NorthReceipt {
    /// Its status as the enum; `None` is impossible for a deserialized one.
    pub fn kind(&self) -> Option<NorthStatus> {
        NorthStatus::parse(self.status)
    }

    /// Parses one receipts message: a receipt or an array of them.
    pub fn parse_many(bytes: &[u8]) -> Result<Vec<NorthReceipt>, serde_json::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(NorthReceipt),
            Many(Vec<NorthReceipt>),
        }
        Ok(match serde_json::from_slice(bytes)? {
            OneOrMany::One(r) => vec![r],
            OneOrMany::Many(rs) => rs,
        })
    }

    /// The receipt of `delivery`, stamped `ts`.
    pub fn of(delivery: Delivery<'_>, ts: i64) -> NorthReceipt {
        NorthReceipt {
            msg_id: Some(delivery.msg_id.to_string()),
            device: Some(delivery.device.to_string()),
            status: delivery.state.receipt_status(),
            seq: Some(delivery.seq.0),
            ts,
            reason: delivery.reason.map(str::to_owned),
        }
    }
}

/// A downlink delivery as its receipt north reports it: the fields the
/// wire needs, borrowed from wherever the delivery is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery<'a> {
    pub device: &'a DeviceId,
    pub msg_id: &'a MsgId,
    pub seq: Seq,
    pub state: DeliveryState,
    /// Why it ended, for a `failed` or `expired` receipt.
    pub reason: Option<&'a str>,
}
