//! Uplink receipts to devices (`{prefix}/{device}/ack`).
//!
//! A receipt states a fact already committed to the store; building one is
//! the last step after a commit, never a promise.

use serde::Serialize;

use crate::ids::{MsgId, Seq};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReceiptStatus {
    Stored,
    Delivered,
    Failed,
    Rejected,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Receipt {
    /// `null` where the message's id could not be read.
    pub msg_id: Option<String>,
    pub status: ReceiptStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
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
            msg_id: msg_id.map(|m| m.as_str().to_string()),
            status: ReceiptStatus::Rejected,
            seq: None,
            reason: Some(reason.into()),
            dead_letter: Some(dead_letter),
        }
    }

    fn of(msg_id: &MsgId, status: ReceiptStatus, seq: Seq) -> Receipt {
        Receipt {
            msg_id: Some(msg_id.as_str().to_string()),
            status,
            seq: Some(seq.0),
            reason: None,
            dead_letter: None,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a receipt serializes")
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
}

/// A receipt north on `{prefix}/receipts`, for one downlink delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NorthReceipt {
    pub msg_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    pub ts: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl NorthReceipt {
    pub fn of(event: &crate::downlink::record::DeliveryEvent, ts: i64) -> NorthReceipt {
        NorthReceipt {
            msg_id: Some(event.msg_id.to_string()),
            device: Some(event.device.to_string()),
            status: event.state.receipt_status(),
            seq: Some(event.seq.0),
            ts,
            reason: event.reason.clone(),
        }
    }
}
