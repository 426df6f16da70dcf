//! North batches (`north.batch_max` > 1): the engine's first attempts and
//! resends, gathered into one publish on `{prefix}/up` as a JSON array of
//! the bodies each would have had alone (docs/PROTOCOL.md, "North
//! batches").
//!
//! What must always hold:
//! - A body in a batch is byte for byte the body it has alone; a device's
//!   bodies in one batch are in `seq` order (the scheduler hands a
//!   device's first attempts over in `seq` order; a batch keeps the order
//!   it was given, and a resend that comes after a later first attempt is
//!   put back in its place).
//! - A batch holds at most `north.batch_max` bodies and, with its
//!   brackets and commas, at most `max_bytes`; it goes out when full, or
//!   `north.batch_linger_ms` after its first body was added.
//! - A batch not yet published when the link changes is dropped: the
//!   scheduler puts everything in flight back to ready on a link change,
//!   and sends it again itself (publishing it too would send it twice).
//! - A message whose batch the upstream refused goes alone next time, so
//!   a message the upstream cannot take fails by itself and does not take
//!   its batch's other messages with it.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::time::Instant;

use crate::config::NorthConfig;
use crate::ids::{DeviceId, Seq};
use crate::store::record::uplink::PendingMessage;

/// Most messages remembered to go alone after a refused batch; past it
/// the oldest knowledge is dropped (they then go in a batch again, which
/// at worst fails once more).
const MAX_SOLO: usize = 4096;

/// `north.batch_max`, `north.batch_linger_ms` and the bound on a batch's
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// Most bodies in one publish; 1 publishes each alone (no batches).
    pub max: usize,
    /// How long the first body of a batch waits for others.
    pub linger: Duration,
    /// Most bytes of a batch's payload.
    pub max_bytes: usize,
}

impl BatchConfig {
    /// No batches: every message published alone, on its own topic.
    pub const OFF: BatchConfig = BatchConfig {
        max: 1,
        linger: Duration::ZERO,
        max_bytes: 0,
    };

    /// From `[north]`: a batch's payload stays 4 KiB under the packet
    /// limit (room for the topic and the packet's header).
    pub fn of(north: &NorthConfig) -> BatchConfig {
        BatchConfig {
            max: north.batch_max,
            linger: north.batch_linger,
            max_bytes: north.max_packet_bytes.saturating_sub(4096),
        }
    }

    pub fn on(&self) -> bool {
        self.max > 1
    }
}

/// One message in a batch.
#[derive(Debug, Clone)]
pub struct Entry {
    pub device: DeviceId,
    pub seq: Seq,
    /// When its commit returned, on its first publish (the `north_publish`
    /// stage).
    pub committed: Option<Instant>,
}

/// A batch ready to publish: its messages and its payload.
#[derive(Debug)]
pub struct Batch {
    pub entries: Vec<Entry>,
    pub payload: Bytes,
}

/// The batch being gathered.
#[derive(Debug)]
pub struct Batcher {
    cfg: BatchConfig,
    open: Vec<(Entry, Bytes)>,
    /// The payload's bytes so far: brackets and commas included.
    bytes: usize,
    /// When the open batch goes out at the latest.
    due: Option<Instant>,
    /// Messages whose batch was refused: they go alone next time.
    solo: HashSet<(DeviceId, Seq)>,
}

/// What to do with a message handed to [`Batcher::add`].
#[derive(Debug)]
pub enum Added {
    /// It is in the open batch; `full` is a batch that had to go out first
    /// to make room for it, or the open batch if it is now full.
    Gathered { full: Option<Batch> },
    /// Publish it alone, on its own topic.
    Alone(PendingMessage),
}

impl Batcher {
    pub fn new(cfg: BatchConfig) -> Batcher {
        Batcher {
            cfg,
            open: Vec::new(),
            bytes: 0,
            due: None,
            solo: HashSet::new(),
        }
    }

    pub fn on(&self) -> bool {
        self.cfg.on()
    }

    /// When the open batch must go out, if there is one.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Takes a message to publish: into the open batch, or back to be
    /// published alone (batches off, one refused before, or a body too
    /// large to share a publish).
    pub fn add(&mut self, msg: PendingMessage, committed: Option<Instant>, now: Instant) -> Added {
        let refused_before =
            !self.solo.is_empty() && self.solo.remove(&(msg.device.clone(), msg.seq));
        if !self.on() || refused_before || msg.body.len() + 2 > self.cfg.max_bytes {
            return Added::Alone(msg);
        }
        // `[` + bodies joined by `,` + `]`.
        let grows = msg.body.len() + 1;
        let mut full = None;
        if !self.open.is_empty() && self.bytes + grows > self.cfg.max_bytes {
            full = self.take();
        }
        if self.open.is_empty() {
            self.bytes = 1;
            self.due = Some(now + self.cfg.linger);
        }
        self.bytes += grows;
        let entry = Entry {
            device: msg.device,
            seq: msg.seq,
            committed,
        };
        self.open.push((entry, msg.body));
        if full.is_none() && self.open.len() >= self.cfg.max {
            full = self.take();
        }
        Added::Gathered { full }
    }

    /// The open batch, if any, ready to publish; a device's bodies in
    /// `seq` order, devices in the order they first came.
    pub fn take(&mut self) -> Option<Batch> {
        if self.open.is_empty() {
            return None;
        }
        self.due = None;
        let mut rank: HashMap<DeviceId, usize> = HashMap::new();
        let mut ranked: Vec<(usize, Entry, Bytes)> = std::mem::take(&mut self.open)
            .into_iter()
            .map(|(entry, body)| {
                let next = rank.len();
                let r = *rank.entry(entry.device.clone()).or_insert(next);
                (r, entry, body)
            })
            .collect();
        ranked.sort_by_key(|(r, entry, _)| (*r, entry.seq));
        let mut payload = BytesMut::with_capacity(self.bytes);
        let mut entries = Vec::with_capacity(ranked.len());
        payload.put_u8(b'[');
        for (n, (_, entry, body)) in ranked.into_iter().enumerate() {
            if n > 0 {
                payload.put_u8(b',');
            }
            payload.put_slice(&body);
            entries.push(entry);
        }
        payload.put_u8(b']');
        self.bytes = 0;
        Some(Batch {
            entries,
            payload: payload.freeze(),
        })
    }

    /// The link changed: the open batch is dropped (the scheduler sends
    /// its messages again).
    pub fn drop_open(&mut self) {
        self.open.clear();
        self.bytes = 0;
        self.due = None;
    }

    /// The upstream refused a batch: each of its messages goes alone next.
    pub fn refused(&mut self, entries: impl IntoIterator<Item = (DeviceId, Seq)>) {
        for key in entries {
            if self.solo.len() >= MAX_SOLO {
                self.solo.clear();
            }
            self.solo.insert(key);
        }
    }
}

#[cfg(test)]
mod tests;
