//! Receipts north (`{prefix}/receipts`): queued, sent in messages of a
//! bounded size, and kept until the upstream broker acknowledges the message
//! that carries them. Pure; the downlink task does the sending.
//!
//! - A message is one receipt object, or an array of at most
//!   [`PER_MESSAGE`] receipts and about [`MESSAGE_BYTES`] bytes.
//! - A message handed to the north session stays here until it is
//!   `published` (PUBACKed). When the link drops, every unacknowledged
//!   message is sent again, with its id, before anything new.
//! - A message the upstream drops the link on (`refused`) is split into one
//!   message per receipt; a single receipt refused `max_strikes` times is
//!   given up and handed back to be dead-lettered.
//! - At most `max_held` receipts wait here; past it the oldest are dropped
//!   and counted (they live in memory only).

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::protocol::receipt::NorthReceipt;

/// Most receipts in one message north.
pub const PER_MESSAGE: usize = 500;
/// A message is closed once its body reaches this size.
pub const MESSAGE_BYTES: usize = 64 << 10;

#[derive(Debug)]
struct Message {
    /// Where it stands among the others: its first id, then its place if it
    /// was split out of a larger one.
    order: (u64, u32),
    receipts: Vec<NorthReceipt>,
    body: Bytes,
    strikes: u32,
}

#[derive(Debug)]
pub struct Receipts {
    queued: VecDeque<NorthReceipt>,
    /// Handed to the north session, not yet acknowledged, by id.
    sent: BTreeMap<u64, Message>,
    /// To send again before anything new, in their original order.
    resend: BTreeMap<(u64, u32), (u64, Message)>,
    next_id: u64,
    max_held: usize,
    /// Receipts dropped because more than `max_held` waited.
    pub dropped: u64,
}

impl Receipts {
    pub fn new(max_held: usize) -> Receipts {
        Receipts {
            queued: VecDeque::new(),
            sent: BTreeMap::new(),
            resend: BTreeMap::new(),
            next_id: 1,
            max_held,
            dropped: 0,
        }
    }

    /// Receipts not yet acknowledged by the upstream, all told.
    pub fn held(&self) -> usize {
        self.queued.len()
            + self
                .sent
                .values()
                .chain(self.resend.values().map(|(_, m)| m))
                .map(|m| m.receipts.len())
                .sum::<usize>()
    }

    /// Queues receipts; returns how many old ones had to be dropped.
    pub fn extend(&mut self, receipts: impl IntoIterator<Item = NorthReceipt>) -> usize {
        self.queued.extend(receipts);
        let over = self.queued.len().saturating_sub(self.max_held);
        self.queued.drain(..over);
        self.dropped += over as u64;
        over
    }

    /// The next message to send and its id, now counted as sent.
    pub fn next_message(&mut self) -> Option<(u64, Bytes)> {
        if let Some((_, (id, m))) = self.resend.pop_first() {
            let body = m.body.clone();
            self.sent.insert(id, m);
            return Some((id, body));
        }
        let mut receipts = Vec::new();
        let mut bytes = 2;
        while let Some(r) = self.queued.front() {
            let size = serde_json::to_vec(r).map_or(0, |v| v.len()) + 1;
            if !receipts.is_empty()
                && (receipts.len() >= PER_MESSAGE || bytes + size > MESSAGE_BYTES)
            {
                break;
            }
            bytes += size;
            receipts.push(self.queued.pop_front().expect("front exists"));
        }
        if receipts.is_empty() {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let body = body(&receipts);
        self.sent.insert(
            id,
            Message {
                order: (id, 0),
                receipts,
                body: body.clone(),
                strikes: 0,
            },
        );
        Some((id, body))
    }

    /// The session could not take message `id`: it goes first next time.
    pub fn unsend(&mut self, id: u64) {
        if let Some(m) = self.sent.remove(&id) {
            self.resend.insert(m.order, (id, m));
        }
    }

    /// The upstream acknowledged message `id`.
    pub fn published(&mut self, id: u64) {
        self.sent.remove(&id);
    }

    /// The link dropped: everything unacknowledged goes again.
    pub fn link_down(&mut self) {
        for (id, m) in std::mem::take(&mut self.sent) {
            self.resend.insert(m.order, (id, m));
        }
    }

    /// The upstream dropped the link on message `id`. Returns the receipt
    /// given up on, once a lone receipt was refused `max_strikes` times.
    pub fn refused(&mut self, id: u64, max_strikes: u32) -> Option<NorthReceipt> {
        let mut m = match self.sent.remove(&id) {
            Some(m) => m,
            None => {
                let order = self.resend.iter().find(|(_, (i, _))| *i == id)?.0;
                let order = *order;
                self.resend.remove(&order)?.1
            }
        };
        m.strikes += 1;
        if m.receipts.len() > 1 {
            // Find the one it chokes on: one message per receipt, in its place.
            for (i, r) in m.receipts.into_iter().enumerate() {
                let single = Message {
                    order: (m.order.0, i as u32 + 1),
                    body: body(std::slice::from_ref(&r)),
                    receipts: vec![r],
                    strikes: 0,
                };
                let id = self.next_id;
                self.next_id += 1;
                self.resend.insert(single.order, (id, single));
            }
            return None;
        }
        if m.strikes >= max_strikes {
            return m.receipts.pop();
        }
        self.resend.insert(m.order, (id, m));
        None
    }
}

/// One receipt as an object, several as an array.
fn body(receipts: &[NorthReceipt]) -> Bytes {
    let v = if receipts.len() == 1 {
        serde_json::to_vec(&receipts[0])
    } else {
        serde_json::to_vec(receipts)
    };
    Bytes::from(v.expect("receipts serialize"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(n: u64) -> NorthReceipt {
        NorthReceipt {
            msg_id: Some(format!("m-{n}")),
            device: Some("d".into()),
            status: "stored",
            seq: Some(n),
            ts: 1,
            reason: None,
        }
    }

    fn seqs(body: &Bytes) -> Vec<u64> {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        match v {
            serde_json::Value::Array(items) => {
                items.iter().map(|i| i["seq"].as_u64().unwrap()).collect()
            }
            one => vec![one["seq"].as_u64().unwrap()],
        }
    }

    #[test]
    fn receipts_go_in_bounded_messages_and_stay_until_acknowledged() {
        let mut r = Receipts::new(10_000);
        r.extend((1..=1200).map(receipt));
        let (a, body_a) = r.next_message().unwrap();
        let (b, _) = r.next_message().unwrap();
        let (c, body_c) = r.next_message().unwrap();
        assert_eq!(seqs(&body_a).len(), PER_MESSAGE);
        assert_eq!(seqs(&body_c), (1001..=1200).collect::<Vec<_>>());
        assert!(r.next_message().is_none());
        r.published(b);
        assert_eq!(r.held(), 1200 - PER_MESSAGE);
        r.link_down();
        assert_eq!(
            r.next_message().map(|(id, _)| id),
            Some(a),
            "resent first, same id"
        );
        assert_eq!(r.next_message().map(|(id, _)| id), Some(c));
        r.published(a);
        r.published(c);
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn a_message_is_closed_at_its_byte_budget() {
        let mut r = Receipts::new(10_000);
        let mut big = receipt(1);
        big.reason = Some("x".repeat(MESSAGE_BYTES / 3));
        r.extend([big.clone(), big.clone(), big, receipt(4)]);
        let (_, first) = r.next_message().unwrap();
        assert_eq!(seqs(&first), vec![1, 1]);
    }

    #[test]
    fn a_refused_message_is_split_and_a_lone_refused_receipt_is_given_up() {
        let mut r = Receipts::new(10_000);
        r.extend((1..=3).map(receipt));
        let (id, _) = r.next_message().unwrap();
        r.extend([receipt(4)]);
        assert_eq!(r.refused(id, 2), None);
        let singles: Vec<_> = (0..3).map(|_| r.next_message().unwrap()).collect();
        assert_eq!(
            singles.iter().map(|(_, b)| seqs(b)).collect::<Vec<_>>(),
            vec![vec![1], vec![2], vec![3]],
            "one per receipt, ahead of the new one"
        );
        let (lone, _) = singles[1].clone();
        assert_eq!(r.refused(lone, 2), None, "first strike");
        r.link_down();
        assert_eq!(r.refused(lone, 2).unwrap().seq, Some(2), "given up");
        assert_eq!(r.held(), 3);
    }

    #[test]
    fn past_the_cap_the_oldest_are_dropped_and_counted() {
        let mut r = Receipts::new(5);
        assert_eq!(r.extend((1..=7).map(receipt)), 2);
        assert_eq!(r.dropped, 2);
        let (_, body) = r.next_message().unwrap();
        assert_eq!(seqs(&body), vec![3, 4, 5, 6, 7]);
    }
}
