//! The downlink scheduler: per device, which batch goes out when. No I/O.
//!
//! Rules it keeps (docs/PROTOCOL.md, "Downlink batches"):
//! - Nothing is sent to a device that is not online.
//! - At most one batch per device is unconfirmed. A confirm that moves the
//!   cursor releases the next batch, starting after the new cursor.
//! - No confirm within the timeout → the batch is read and sent again from
//!   the cursor, the timeout doubling per resend (up to 16x), while the
//!   device stays online.
//! - Realtime is catch-up: a new message for a caught-up, online device
//!   is sent by the same read-from-cursor path.
//! - Every read carries a generation, unique across devices and time; a
//!   read answered after the device's situation changed (confirm, pull,
//!   offline) is dropped, not sent.
//! - A device that goes offline is forgotten (its cursors are read again
//!   when it returns), so memory does not grow with every device that ever
//!   connected.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::deadlines::Deadlines;
use crate::downlink::record::Cursors;
use crate::ids::{DeviceId, Seq};

/// A pull this soon after a batch from the cursor went out is answered by it.
const PULL_JOINS_WITHIN: Duration = Duration::from_millis(1000);

#[derive(Debug, Clone)]
pub struct DownConfig {
    pub batch_size: usize,
    pub confirm_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownAction {
    /// Load the device's cursors from the store.
    LoadCursors(DeviceId),
    /// Read a batch; answer with [`DownScheduler::on_read`] passing `gen`.
    Read {
        device: DeviceId,
        after: Seq,
        limit: usize,
        gen: u64,
        reply_empty: bool,
    },
}

/// An unconfirmed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outstanding {
    pub first: Seq,
    pub last: Seq,
    pub size: usize,
    pub sent_at: Instant,
    pub resends: u32,
}

#[derive(Debug, Default)]
struct Device {
    online: bool,
    cursors: Option<Cursors>,
    loading: bool,
    /// A read is out: its generation and where it starts.
    reading: Option<(u64, Seq)>,
    /// A pull joined the read in flight: answer it even if empty.
    pulled: bool,
    /// When the broker last saw the device subscribe to its inbox.
    subscribed_at: Option<Instant>,
    outstanding: Option<Outstanding>,
    /// A pull waiting for cursors: (after, limit).
    pull: Option<(Option<Seq>, usize)>,
    gen: u64,
    resends: u32,
}

pub struct DownScheduler {
    cfg: DownConfig,
    devices: HashMap<DeviceId, Device>,
    /// Each unconfirmed batch's confirm deadline.
    timers: Deadlines<DeviceId>,
    /// The next generation handed out, to any device.
    next_gen: u64,
}

/// A generation never handed out before.
fn fresh(next_gen: &mut u64) -> u64 {
    *next_gen += 1;
    *next_gen
}

/// What to do with a batch that was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Send it; `more` is whether the queue goes on after it.
    Send {
        more: bool,
    },
    Drop,
}

impl DownScheduler {
    pub fn new(cfg: DownConfig) -> DownScheduler {
        DownScheduler {
            cfg,
            devices: HashMap::new(),
            timers: Deadlines::new(),
            next_gen: 0,
        }
    }

    /// The device's state, made (with a fresh generation) if it has none.
    fn entry(&mut self, device: &DeviceId) -> &mut Device {
        let next_gen = &mut self.next_gen;
        self.devices
            .entry(device.clone())
            .or_insert_with(|| Device {
                gen: fresh(next_gen),
                ..Device::default()
            })
    }

    /// Devices it holds state for (online, or being read for).
    pub fn tracked(&self) -> usize {
        self.devices.len()
    }

    pub fn on_online(&mut self, device: &DeviceId) -> Vec<DownAction> {
        let d = self.entry(device);
        if d.online {
            return Vec::new();
        }
        d.online = true;
        self.next(device)
    }

    /// The device (re)subscribed to its inbox: a batch sent before this may
    /// never have reached it, so start again from the cursor.
    pub fn on_subscribed(&mut self, device: &DeviceId, now: Instant) -> Vec<DownAction> {
        let gen = fresh(&mut self.next_gen);
        let d = self.entry(device);
        d.subscribed_at = Some(now);
        let restart = d.online && (d.outstanding.is_some() || d.reading.is_some());
        if restart {
            d.outstanding = None;
            d.reading = None;
            d.gen = gen;
        }
        d.online = true;
        if restart {
            self.timers.remove(device);
        }
        self.next(device)
    }

    /// The device is gone: everything about it is forgotten; a read still
    /// out for it is dropped when it comes back.
    pub fn on_offline(&mut self, device: &DeviceId) {
        self.devices.remove(device);
        self.timers.remove(device);
    }

    pub fn on_cursors(&mut self, device: &DeviceId, c: Cursors) -> Vec<DownAction> {
        let Some(d) = self.devices.get_mut(device) else {
            return Vec::new();
        };
        d.loading = false;
        let known = d.cursors.get_or_insert(c);
        known.head = known.head.max(c.head);
        known.delivered_upto = known.delivered_upto.max(c.delivered_upto);
        if let Some((after, limit)) = d.pull.take() {
            return self.pull(device, after, limit);
        }
        self.next(device)
    }

    /// A new delivery `seq` was committed for the device.
    pub fn on_queued(&mut self, device: &DeviceId, seq: Seq) -> Vec<DownAction> {
        let Some(d) = self.devices.get_mut(device) else {
            return Vec::new();
        };
        match &mut d.cursors {
            Some(c) => c.head = c.head.max(seq),
            None => return Vec::new(),
        }
        self.next(device)
    }

    /// The device asked for a batch: it replaces the outstanding one.
    pub fn on_pull(
        &mut self,
        device: &DeviceId,
        after: Option<Seq>,
        limit: Option<usize>,
        now: Instant,
    ) -> Vec<DownAction> {
        let limit = limit
            .unwrap_or(self.cfg.batch_size)
            .clamp(1, self.cfg.batch_size);
        let batch_size = self.cfg.batch_size;
        let gen = fresh(&mut self.next_gen);
        let d = self.entry(device);
        d.online = true;
        // A device that connects often says `status` and `pull` at once: a
        // pull from the cursor while a read from the cursor is out and
        // nothing is sent yet joins that read instead of repeating it.
        let from_cursor = d
            .cursors
            .is_some_and(|c| after.is_none_or(|a| a == c.delivered_upto));
        if from_cursor && d.outstanding.is_none() && limit == batch_size {
            if let Some((_, from)) = d.reading {
                if Some(from) == d.cursors.map(|c| c.delivered_upto) {
                    d.pulled = true;
                    return Vec::new();
                }
            }
        }
        // Likewise when that batch went out after the device subscribed, or
        // an instant ago, on this very connection (going offline clears
        // it): it is the pull's answer.
        if let (true, Some(o)) = (from_cursor && limit == batch_size, d.outstanding) {
            let after_subscribe = d.subscribed_at.is_some_and(|s| o.sent_at >= s);
            let recent = now.saturating_duration_since(o.sent_at) < PULL_JOINS_WITHIN;
            let fresh = o.resends == 0 && (after_subscribe || recent);
            if fresh
                && d.cursors
                    .is_some_and(|c| o.first == c.delivered_upto.next())
            {
                return Vec::new();
            }
        }
        d.outstanding = None;
        d.gen = gen;
        d.reading = None;
        self.timers.remove(device);
        let d = self.devices.get_mut(device).expect("made above");
        if d.cursors.is_none() {
            d.pull = Some((after, limit));
            return self.load(device);
        }
        self.pull(device, after, limit)
    }

    fn pull(&mut self, device: &DeviceId, after: Option<Seq>, limit: usize) -> Vec<DownAction> {
        let d = self.devices.get_mut(device).expect("caller made it");
        let after = after.unwrap_or(d.cursors.expect("caller checked").delivered_upto);
        d.reading = Some((d.gen, after));
        vec![DownAction::Read {
            device: device.clone(),
            after,
            limit,
            gen: d.gen,
            reply_empty: true,
        }]
    }

    /// A confirm, read or nack committed; `c` are the device's cursors now.
    /// Returns the confirmed batch if this released it.
    pub fn on_cursor_moved(
        &mut self,
        device: &DeviceId,
        c: Cursors,
    ) -> (Option<Outstanding>, Vec<DownAction>) {
        let Some(d) = self.devices.get_mut(device) else {
            return (None, Vec::new());
        };
        let Some(known) = &mut d.cursors else {
            return (None, Vec::new());
        };
        let before = known.delivered_upto;
        known.delivered_upto = known.delivered_upto.max(c.delivered_upto);
        known.head = known.head.max(c.head);
        if known.delivered_upto == before {
            return (None, Vec::new());
        }
        let released = match d.outstanding {
            Some(o) if known.delivered_upto >= o.first => d.outstanding.take(),
            _ => None,
        };
        if released.is_some() {
            self.timers.remove(device);
        }
        if released.is_some() || d.reading.is_some() {
            // A read from the old cursor would resend confirmed messages.
            d.gen = fresh(&mut self.next_gen);
            d.reading = None;
            d.resends = 0;
        }
        (released, self.next(device))
    }

    /// A read came back with `entries` (their first and last seq, count).
    pub fn on_read(
        &mut self,
        device: &DeviceId,
        gen: u64,
        span: Option<(Seq, Seq, usize)>,
        head: Seq,
        reply_empty: bool,
        now: Instant,
    ) -> Verdict {
        let Some(d) = self.devices.get_mut(device) else {
            return Verdict::Drop;
        };
        if d.reading.map(|(g, _)| g) != Some(gen) || !d.online {
            return Verdict::Drop;
        }
        d.reading = None;
        let reply_empty = reply_empty || std::mem::take(&mut d.pulled);
        if let Some(c) = &mut d.cursors {
            c.head = c.head.max(head);
        }
        let Some((first, last, size)) = span else {
            return if reply_empty {
                Verdict::Send { more: false }
            } else {
                Verdict::Drop
            };
        };
        let timeout = self.cfg.confirm_timeout * 2u32.pow(d.resends.min(4));
        let deadline = now + timeout;
        d.outstanding = Some(Outstanding {
            first,
            last,
            size,
            sent_at: now,
            resends: d.resends,
        });
        self.timers.insert(device.clone(), deadline);
        Verdict::Send { more: last < head }
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Resends every batch whose confirm is overdue.
    pub fn on_tick(&mut self, now: Instant) -> Vec<(DeviceId, Outstanding, Vec<DownAction>)> {
        let mut out = Vec::new();
        while let Some((device, _)) = self.timers.pop_due(now) {
            let Some(d) = self.devices.get_mut(&device) else {
                continue;
            };
            let Some(o) = d.outstanding else { continue };
            if !d.online {
                continue;
            }
            d.outstanding = None;
            d.resends += 1;
            d.gen = fresh(&mut self.next_gen);
            let actions = self.next(&device);
            out.push((device, o, actions));
        }
        out
    }

    fn load(&mut self, device: &DeviceId) -> Vec<DownAction> {
        let d = self.devices.get_mut(device).expect("caller made it");
        if d.loading {
            return Vec::new();
        }
        d.loading = true;
        vec![DownAction::LoadCursors(device.clone())]
    }

    /// Reads the next batch if the device is ready for one.
    fn next(&mut self, device: &DeviceId) -> Vec<DownAction> {
        let Some(d) = self.devices.get_mut(device) else {
            return Vec::new();
        };
        if !d.online || d.outstanding.is_some() || d.reading.is_some() {
            return Vec::new();
        }
        let Some(c) = d.cursors else {
            return self.load(device);
        };
        if c.head <= c.delivered_upto {
            return Vec::new();
        }
        d.reading = Some((d.gen, c.delivered_upto));
        vec![DownAction::Read {
            device: device.clone(),
            after: c.delivered_upto,
            limit: self.cfg.batch_size,
            gen: d.gen,
            reply_empty: false,
        }]
    }
}

#[cfg(test)]
mod tests;
