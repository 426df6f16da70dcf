//! Downlink batches on `{south}/{device}/inbox` (docs/PROTOCOL.md, South):
//! `{"messages": [...], "more": bool}`, each message the stored envelope
//! with its `seq`, or a tombstone for a delivery given up before it was sent.
//!
//! [`InboxBatch`] is the shape a device reads; the gateway writes batches
//! with [`encode_batch`], splicing stored bytes rather than re-encoding them
//! ([`inbox_batch`] is the same for queue entries as stored, [`InboxRow`]).

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::envelope::WireEnvelope;
use super::push_with_seq;
use crate::ids::{MsgId, Seq};
use crate::state::DeliveryState;

/// One inbox batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InboxBatch {
    pub messages: Vec<InboxEntry>,
    /// More is waiting after this batch.
    pub more: bool,
}

/// A message of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum InboxEntry {
    Tombstone(Tombstone),
    Message(InboxEnvelope),
}

impl InboxEntry {
    pub fn seq(&self) -> Seq {
        match self {
            InboxEntry::Tombstone(t) => t.seq,
            InboxEntry::Message(m) => m.seq,
        }
    }

    pub fn msg_id(&self) -> &MsgId {
        match self {
            InboxEntry::Tombstone(t) => &t.msg_id,
            InboxEntry::Message(m) => &m.envelope.msg_id,
        }
    }
}

/// A stored downlink envelope with the device's `seq` (its `ts` is the
/// envelope's, or the time it was stored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InboxEnvelope {
    pub seq: Seq,
    #[serde(flatten)]
    pub envelope: WireEnvelope,
}

/// `{"seq", "msg_id", "status"}`: a delivery the gateway gave up on before
/// sending it; it still takes its place so seqs stay contiguous.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub seq: Seq,
    pub msg_id: MsgId,
    pub status: TombstoneStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TombstoneStatus {
    /// `ttl_s` passed, or pushed out by the queue cap.
    Expired,
    /// Dead-lettered for this device.
    Failed,
}

impl TombstoneStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TombstoneStatus::Expired => "expired",
            TombstoneStatus::Failed => "failed",
        }
    }
}

/// One entry of a batch as the gateway holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Outgoing<'a> {
    /// A stored inbox entry: the envelope's JSON object, without `seq`.
    Stored {
        seq: Seq,
        entry: &'a [u8],
    },
    Tombstone(Tombstone),
}

/// Room enough for a tombstone's JSON, to size a batch's buffer.
const TOMBSTONE_ROOM: usize = 64;

/// An inbox batch: `{"messages": [...], "more": bool}`. Stored entries are
/// spliced, not re-parsed: `{"seq":N,` + the stored object minus its `{`.
pub fn encode_batch(entries: &[Outgoing<'_>], more: bool) -> Bytes {
    let mut out = Vec::with_capacity(
        32 + entries
            .iter()
            .map(|e| match e {
                Outgoing::Stored { entry, .. } => entry.len() + 24,
                Outgoing::Tombstone(_) => TOMBSTONE_ROOM,
            })
            .sum::<usize>(),
    );
    out.extend_from_slice(b"{\"messages\":[");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match e {
            Outgoing::Stored { seq, entry } => push_with_seq(&mut out, *seq, entry),
            Outgoing::Tombstone(t) => {
                serde_json::to_writer(&mut out, t).expect("a tombstone serializes")
            }
        }
    }
    out.extend_from_slice(format!("],\"more\":{more}}}").as_bytes());
    Bytes::from(out)
}

/// A queue entry as stored: its envelope's JSON object without `seq`, or
/// no body for a delivery given up before it was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxRow<'a> {
    pub seq: Seq,
    pub msg_id: &'a MsgId,
    pub state: DeliveryState,
    pub body: Option<&'a [u8]>,
}

/// [`encode_batch`] for entries as stored: one without a body (or with one
/// that is not a JSON object) goes as a tombstone.
pub fn inbox_batch<'a>(rows: impl IntoIterator<Item = InboxRow<'a>>, more: bool) -> Bytes {
    let outgoing: Vec<Outgoing<'a>> = rows
        .into_iter()
        .map(|e| match e.body {
            Some(body) if body.len() > 2 && body[0] == b'{' => Outgoing::Stored {
                seq: e.seq,
                entry: body,
            },
            _ => Outgoing::Tombstone(Tombstone {
                seq: e.seq,
                msg_id: e.msg_id.clone(),
                status: match e.state {
                    DeliveryState::Dead => TombstoneStatus::Failed,
                    _ => TombstoneStatus::Expired,
                },
            }),
        })
        .collect();
    encode_batch(&outgoing, more)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::envelope::Payload;

    #[test]
    fn batches_splice_entries_and_tombstones() {
        let (n9, n12) = (MsgId::new("n-9").unwrap(), MsgId::new("n-12").unwrap());
        let entries = [
            InboxRow {
                seq: Seq(41),
                msg_id: &n9,
                state: DeliveryState::Stored,
                body: Some(br#"{"msg_id":"n-9","payload":"shift B"}"#),
            },
            InboxRow {
                seq: Seq(44),
                msg_id: &n12,
                state: DeliveryState::Expired,
                body: None,
            },
        ];
        let bytes = inbox_batch(entries, true);
        assert_eq!(
            &bytes[..],
            br#"{"messages":[{"seq":41,"msg_id":"n-9","payload":"shift B"},{"seq":44,"msg_id":"n-12","status":"expired"}],"more":true}"#
        );
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"messages": [
                {"seq": 41, "msg_id": "n-9", "payload": "shift B"},
                {"seq": 44, "msg_id": "n-12", "status": "expired"}
            ], "more": true})
        );
        let empty: serde_json::Value = serde_json::from_slice(&inbox_batch([], false)).unwrap();
        assert_eq!(empty, serde_json::json!({"messages": [], "more": false}));
    }

    #[test]
    fn the_protocol_examples_parse() {
        let batch: InboxBatch = serde_json::from_str(
            r#"{"messages": [{"seq": 41, "msg_id": "n-9", "ts": 1764470000999, "payload": "shift B starts 14:00"}],
                "more": true}"#,
        )
        .unwrap();
        let mut envelope = WireEnvelope::json(
            MsgId::new("n-9").unwrap(),
            serde_json::json!("shift B starts 14:00"),
        );
        envelope.ts = Some(1764470000999);
        assert_eq!(
            batch,
            InboxBatch {
                messages: vec![InboxEntry::Message(InboxEnvelope {
                    seq: Seq(41),
                    envelope
                })],
                more: true
            }
        );
        let tombstone: InboxEntry =
            serde_json::from_str(r#"{"seq": 44, "msg_id": "n-12", "status": "expired"}"#).unwrap();
        assert_eq!(
            tombstone,
            InboxEntry::Tombstone(Tombstone {
                seq: Seq(44),
                msg_id: MsgId::new("n-12").unwrap(),
                status: TombstoneStatus::Expired
            })
        );
        let empty: InboxBatch = serde_json::from_str(r#"{"messages": [], "more": false}"#).unwrap();
        assert!(empty.messages.is_empty() && !empty.more);
    }

    #[test]
    fn what_the_gateway_splices_a_device_reads() {
        let (n1, n2) = (MsgId::new("n-1").unwrap(), MsgId::new("n-2").unwrap());
        let entries = [
            InboxRow {
                seq: Seq(7),
                msg_id: &n1,
                state: DeliveryState::Stored,
                body: Some(br#"{"msg_id":"n-1","ts":5,"payload_b64":"aGk=","kind":"order"}"#),
            },
            InboxRow {
                seq: Seq(8),
                msg_id: &n2,
                state: DeliveryState::Dead,
                body: None,
            },
        ];
        let batch: InboxBatch = serde_json::from_slice(&inbox_batch(entries, false)).unwrap();
        let InboxEntry::Message(m) = &batch.messages[0] else {
            panic!("a message: {batch:?}")
        };
        assert_eq!((m.seq, m.envelope.ts), (Seq(7), Some(5)));
        assert_eq!(m.envelope.payload, Payload::Base64("aGk=".into()));
        assert_eq!(m.envelope.extra["kind"], "order");
        assert_eq!(batch.messages[1].seq(), Seq(8));
        assert!(matches!(
            &batch.messages[1],
            InboxEntry::Tombstone(Tombstone {
                status: TombstoneStatus::Failed,
                ..
            })
        ));
        let again: InboxBatch =
            serde_json::from_slice(&serde_json::to_vec(&batch).unwrap()).unwrap();
        assert_eq!(again, batch);
    }
}
