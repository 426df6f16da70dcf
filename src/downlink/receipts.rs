//! Receipts north (`{prefix}/receipts`), in memory: a bounded window onto
//! the outbox table, sent in messages of a bounded size, each receipt kept
//! until the upstream broker acknowledges the message that carries it.
//! Pure; the downlink task does the reading, sending and deleting.
//!
//! - Every receipt is a committed outbox row ([`OutboxReceipt`]); memory
//!   holds at most `max_held` of them. Rows beyond that stay in the table
//!   only and are read back in pages ([`Receipts::next_page`]) as
//!   acknowledgements make room, oldest first. Nothing is ever dropped.
//! - Invariant: every outbox row with an id below `behind` is in memory
//!   (or acknowledged); when `behind` is `None` and no page is being read,
//!   every row is. Outbox ids grow in commit order and are never reused.
//! - A message is one receipt object, or an array of at most
//!   [`PER_MESSAGE`] receipts and about [`MESSAGE_BYTES`] bytes.
//! - A message handed to the north session stays here until it is
//!   `published` (PUBACKed), which hands back its rows to delete. When the
//!   link drops, every unacknowledged message is sent again, with its id,
//!   before anything new.
//! - A message the upstream drops the link on (`refused`) is split into one
//!   message per receipt; a single receipt refused `max_strikes` times is
//!   given up and handed back to be dead-lettered.

use std::collections::{BTreeMap, HashSet, VecDeque};

use bytes::{BufMut, Bytes, BytesMut};

use crate::store::record::downlink::OutboxReceipt;

/// Most receipts in one message north.
pub const PER_MESSAGE: usize = 500;
/// A message is closed once its body reaches this size.
pub const MESSAGE_BYTES: usize = 64 << 10;

#[derive(Debug)]
struct Message {
    /// Where it stands among the others: its first id, then its place if it
    /// was split out of a larger one.
    order: (u64, u32),
    rows: Vec<OutboxReceipt>,
    body: Bytes,
    strikes: u32,
}

#[derive(Debug)]
pub struct Receipts {
    queued: VecDeque<OutboxReceipt>,
    /// Handed to the north session, not yet acknowledged, by id.
    sent: BTreeMap<u64, Message>,
    /// To send again before anything new, in their original order.
    resend: BTreeMap<(u64, u32), (u64, Message)>,
    next_id: u64,
    /// The outbox ids of every receipt held here.
    held: HashSet<i64>,
    max_held: usize,
    /// Rows from this id on may be in the table and not here.
    behind: Option<i64>,
    /// A page is being read.
    loading: bool,
}

impl Receipts {
    /// Starts with everything in the table still to be read.
    pub fn new(max_held: usize) -> Receipts {
        Receipts {
            queued: VecDeque::new(),
            sent: BTreeMap::new(),
            resend: BTreeMap::new(),
            next_id: 1,
            held: HashSet::new(),
            max_held: max_held.max(1),
            behind: Some(0),
            loading: false,
        }
    }

    /// Receipts held here, not yet acknowledged by the upstream.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Receipts just committed. They join the queue if nothing older waits
    /// in the table and there is room; otherwise a page reads them later.
    pub fn extend(&mut self, rows: impl IntoIterator<Item = OutboxReceipt>) {
        let mut rows: Vec<_> = rows.into_iter().collect();
        rows.sort_by_key(|r| r.id);
        for r in rows {
            if self.held.contains(&r.id) {
                continue;
            }
            if self.behind.is_none() && !self.loading && self.held.len() < self.max_held {
                self.held.insert(r.id);
                self.queued.push_back(r);
            } else {
                self.behind = Some(self.behind.map_or(r.id, |b| b.min(r.id)));
            }
        }
    }

    /// The page to read next, `(from id, limit)`, when rows wait in the
    /// table and at least a message's worth of room is free.
    pub fn next_page(&mut self) -> Option<(i64, usize)> {
        let room = self.max_held.saturating_sub(self.held.len());
        if self.loading || room < PER_MESSAGE.min(self.max_held) {
            return None;
        }
        let from = self.behind.take()?;
        self.loading = true;
        Some((from, room))
    }

    /// A page asked for with `limit` came back.
    pub fn loaded(&mut self, rows: Vec<OutboxReceipt>, limit: usize) {
        self.loading = false;
        let full = rows.len() >= limit;
        let last = rows.last().map(|r| r.id);
        for r in rows {
            if self.held.insert(r.id) {
                self.queued.push_back(r);
            }
        }
        if let (true, Some(last)) = (full, last) {
            let next = last + 1;
            self.behind = Some(self.behind.map_or(next, |b| b.min(next)));
        }
    }

    /// A page read failed: it is asked for again later.
    pub fn load_failed(&mut self, from: i64) {
        self.loading = false;
        self.behind = Some(self.behind.map_or(from, |b| b.min(from)));
    }

    /// The next message to send and its id, now counted as sent.
    pub fn next_message(&mut self) -> Option<(u64, Bytes)> {
        if let Some((_, (id, m))) = self.resend.pop_first() {
            let body = m.body.clone();
            self.sent.insert(id, m);
            return Some((id, body));
        }
        let mut rows = Vec::new();
        let mut bytes = 2;
        while let Some(r) = self.queued.front() {
            let size = r.body.len() + 1;
            if !rows.is_empty() && (rows.len() >= PER_MESSAGE || bytes + size > MESSAGE_BYTES) {
                break;
            }
            bytes += size;
            rows.push(self.queued.pop_front().expect("front exists"));
        }
        if rows.is_empty() {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let body = body(&rows);
        self.sent.insert(
            id,
            Message {
                order: (id, 0),
                rows,
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

    /// The upstream acknowledged message `id`: the outbox rows it carried,
    /// to delete.
    pub fn published(&mut self, id: u64) -> Vec<i64> {
        let Some(m) = self.sent.remove(&id) else {
            return Vec::new();
        };
        let ids: Vec<i64> = m.rows.iter().map(|r| r.id).collect();
        for id in &ids {
            self.held.remove(id);
        }
        ids
    }

    /// The link dropped: everything unacknowledged goes again.
    pub fn link_down(&mut self) {
        for (id, m) in std::mem::take(&mut self.sent) {
            self.resend.insert(m.order, (id, m));
        }
    }

    /// The upstream dropped the link on message `id`. Returns the receipt
    /// given up on, once a lone receipt was refused `max_strikes` times; it
    /// is no longer held.
    pub fn refused(&mut self, id: u64, max_strikes: u32) -> Option<OutboxReceipt> {
        let mut m = match self.sent.remove(&id) {
            Some(m) => m,
            None => {
                let order = *self.resend.iter().find(|(_, (i, _))| *i == id)?.0;
                self.resend.remove(&order)?.1
            }
        };
        m.strikes += 1;
        if m.rows.len() > 1 {
            // Find the one it chokes on: one message per receipt, in its place.
            for (i, r) in m.rows.into_iter().enumerate() {
                let single = Message {
                    order: (m.order.0, i as u32 + 1),
                    body: r.body.clone(),
                    rows: vec![r],
                    strikes: 0,
                };
                let id = self.next_id;
                self.next_id += 1;
                self.resend.insert(single.order, (id, single));
            }
            return None;
        }
        if m.strikes >= max_strikes {
            let r = m.rows.pop()?;
            self.held.remove(&r.id);
            return Some(r);
        }
        self.resend.insert(m.order, (id, m));
        None
    }
}

/// One receipt as an object, several as an array.
fn body(rows: &[OutboxReceipt]) -> Bytes {
    if let [one] = rows {
        return one.body.clone();
    }
    let mut out = BytesMut::with_capacity(2 + rows.iter().map(|r| r.body.len() + 1).sum::<usize>());
    out.put_u8(b'[');
    for (i, r) in rows.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(&r.body);
    }
    out.put_u8(b']');
    out.freeze()
}

#[cfg(test)]
mod tests;
