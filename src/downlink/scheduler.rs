//! The downlink scheduler: per device, which batch goes out when. No I/O.
//!
//! Rules it keeps (docs/PROTOCOL.md, "Downlink batches"):
//! - Nothing is sent to a device that is not online.
//! - At most one batch per device is unconfirmed. A confirm that covers
//!   any of it releases the next batch, starting after the cursor (moved
//!   or not: a replayed batch is behind it).
//! - No confirm within the timeout → the batch is read and sent again from
//!   the cursor, the timeout doubling per resend (up to 16x), while the
//!   device stays online.
//! - Realtime is catch-up: a new message for a caught-up, online device
//!   is sent by the same read-from-cursor path.
//! - Every read carries a generation, unique across devices and time; a
//!   read answered after the device's situation changed (confirm, pull,
//!   offline) is dropped, not sent.
//! - An online device is in one `Status` (loading its cursors, idle,
//!   reading, awaiting a confirm), which carries what that status needs;
//!   each handler `match`es on it and returns actions.
//! - A device that goes offline is forgotten (its cursors are read again
//!   when it returns), so memory does not grow with every device that ever
//!   connected.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::deadlines::Deadlines;
use crate::ids::{DeviceId, Seq};
use crate::store::record::downlink::Cursors;

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

/// A pull that waits for the device's cursors: from where (`None`: the
/// confirm cursor) and how many.
type Pull = (Option<Seq>, usize);

/// Where an online device stands. An offline device has no status: it is
/// not held at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Its cursors are being read from the store; a pull that came
    /// meanwhile is answered once they arrive.
    Loading { pull: Option<Pull> },
    /// Nothing out: caught up, or about to read.
    Idle { cursors: Cursors },
    /// A read from `from` is out under generation `gen`; `pulled`: a pull
    /// joined it, so it is answered even if empty.
    Reading {
        cursors: Cursors,
        gen: u64,
        from: Seq,
        pulled: bool,
    },
    /// A batch went out and waits for its confirm (deadline in the
    /// scheduler's timers).
    AwaitingConfirm {
        cursors: Cursors,
        batch: Outstanding,
    },
}

impl Status {
    fn cursors(&self) -> Option<Cursors> {
        match *self {
            Status::Loading { .. } => None,
            Status::Idle { cursors }
            | Status::Reading { cursors, .. }
            | Status::AwaitingConfirm { cursors, .. } => Some(cursors),
        }
    }

    fn cursors_mut(&mut self) -> Option<&mut Cursors> {
        match self {
            Status::Loading { .. } => None,
            Status::Idle { cursors }
            | Status::Reading { cursors, .. }
            | Status::AwaitingConfirm { cursors, .. } => Some(cursors),
        }
    }
}

#[derive(Debug)]
struct Device {
    status: Status,
    /// When the broker last saw the device subscribe to its inbox.
    subscribed_at: Option<Instant>,
    /// Times the current batch went unconfirmed (the timeout doubles).
    resends: u32,
    /// A plain device (it subscribed to its `south.plain_down` topic): a
    /// batch is one message, confirmed by its PUBACK, and never resent on
    /// a timeout (MQTT resends only on a new connection).
    plain: bool,
}

pub struct DownScheduler {
    cfg: DownConfig,
    devices: HashMap<DeviceId, Device>,
    /// Each unconfirmed batch's confirm deadline.
    timers: Deadlines<DeviceId>,
    /// The last generation handed out, to any device.
    last_gen: u64,
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
    /// New batch size and confirm timeout, for the next batches.
    pub fn set_config(&mut self, cfg: DownConfig) {
        self.cfg = cfg;
    }

    pub fn new(cfg: DownConfig) -> DownScheduler {
        DownScheduler {
            cfg,
            devices: HashMap::new(),
            timers: Deadlines::new(),
            last_gen: 0,
        }
    }

    /// A generation never handed out before.
    fn fresh(&mut self) -> u64 {
        self.last_gen += 1;
        self.last_gen
    }

    /// Devices it holds state for (online, or being read for).
    pub fn tracked(&self) -> usize {
        self.devices.len()
    }

    /// Takes a device that was offline as online: its cursors are loaded,
    /// and `pull` waits for them. `None` if it is online already.
    fn arrive(&mut self, device: &DeviceId, pull: Option<Pull>) -> Option<Vec<DownAction>> {
        if self.devices.contains_key(device) {
            return None;
        }
        self.devices.insert(
            device.clone(),
            Device {
                status: Status::Loading { pull },
                subscribed_at: None,
                resends: 0,
                plain: false,
            },
        );
        Some(vec![DownAction::LoadCursors(device.clone())])
    }

    pub fn on_online(&mut self, device: &DeviceId) -> Vec<DownAction> {
        self.arrive(device, None).unwrap_or_default()
    }

    /// The device (re)subscribed to its inbox: a batch sent before this may
    /// never have reached it, so start again from the cursor.
    pub fn on_subscribed(&mut self, device: &DeviceId, now: Instant) -> Vec<DownAction> {
        self.subscribed(device, now, false)
    }

    /// The device (re)subscribed to its plain command topic: from now on
    /// it is sent its downlinks one by one, from the cursor.
    pub fn on_subscribed_plain(&mut self, device: &DeviceId, now: Instant) -> Vec<DownAction> {
        self.subscribed(device, now, true)
    }

    /// Whether the device takes its downlinks bare, one by one.
    pub fn is_plain(&self, device: &DeviceId) -> bool {
        self.devices.get(device).is_some_and(|d| d.plain)
    }

    fn subscribed(&mut self, device: &DeviceId, now: Instant, plain: bool) -> Vec<DownAction> {
        let arrived = self.arrive(device, None);
        let d = self.devices.get_mut(device).expect("arrived");
        d.subscribed_at = Some(now);
        d.plain = plain;
        if let Some(actions) = arrived {
            return actions;
        }
        d.status = match d.status {
            Status::Reading { cursors, .. } | Status::AwaitingConfirm { cursors, .. } => {
                self.timers.remove(device);
                Status::Idle { cursors }
            }
            other => other,
        };
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
        match &mut d.status {
            Status::Loading { pull } => {
                let pull = pull.take();
                d.status = Status::Idle { cursors: c };
                if let Some((after, limit)) = pull {
                    return self.pull(device, after, limit);
                }
            }
            status => {
                let known = status.cursors_mut().expect("not loading");
                known.head = known.head.max(c.head);
                known.delivered_upto = known.delivered_upto.max(c.delivered_upto);
            }
        }
        self.next(device)
    }

    /// A new delivery `seq` was committed for the device.
    pub fn on_queued(&mut self, device: &DeviceId, seq: Seq) -> Vec<DownAction> {
        let Some(c) = self
            .devices
            .get_mut(device)
            .and_then(|d| d.status.cursors_mut())
        else {
            return Vec::new();
        };
        c.head = c.head.max(seq);
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
        if let Some(actions) = self.arrive(device, Some((after, limit))) {
            return actions;
        }
        let full = limit == self.cfg.batch_size;
        let d = self.devices.get_mut(device).expect("online");
        let from_cursor = |c: Cursors| full && after.is_none_or(|a| a == c.delivered_upto);
        match &mut d.status {
            Status::Loading { pull } => {
                *pull = Some((after, limit));
                return Vec::new();
            }
            // A device that connects often says `status` and `pull` at once:
            // a pull from the cursor while a read from the cursor is out
            // joins that read instead of repeating it.
            Status::Reading {
                cursors,
                from,
                pulled,
                ..
            } if from_cursor(*cursors) && *from == cursors.delivered_upto => {
                *pulled = true;
                return Vec::new();
            }
            // Likewise when that batch went out after the device subscribed,
            // or an instant ago, on this very connection (going offline
            // clears it): it is the pull's answer.
            Status::AwaitingConfirm { cursors, batch } if from_cursor(*cursors) => {
                let after_subscribe = d.subscribed_at.is_some_and(|s| batch.sent_at >= s);
                let recent = now.saturating_duration_since(batch.sent_at) < PULL_JOINS_WITHIN;
                let fresh = batch.resends == 0 && (after_subscribe || recent);
                if fresh && batch.first == cursors.delivered_upto.next() {
                    return Vec::new();
                }
            }
            _ => {}
        }
        let cursors = d.status.cursors().expect("not loading");
        d.status = Status::Idle { cursors };
        self.timers.remove(device);
        self.pull(device, after, limit)
    }

    /// Reads what a pull asked for (the device has its cursors).
    fn pull(&mut self, device: &DeviceId, after: Option<Seq>, limit: usize) -> Vec<DownAction> {
        let gen = self.fresh();
        let d = self.devices.get_mut(device).expect("caller checked");
        let cursors = d.status.cursors().expect("caller checked");
        let from = after.unwrap_or(cursors.delivered_upto);
        d.status = Status::Reading {
            cursors,
            gen,
            from,
            pulled: false,
        };
        vec![DownAction::Read {
            device: device.clone(),
            after: from,
            limit,
            gen,
            reply_empty: true,
        }]
    }

    /// A confirm, read or nack committed; `c` are the device's cursors now,
    /// `confirmed` how far a confirm or read reached (as the store took
    /// it: never past what was sent; `None` for a nack). Returns the
    /// confirmed batch if this released it.
    ///
    /// A confirm releases the outstanding batch when it covers any of it,
    /// whether or not it moved the cursor: a batch a pull replayed from
    /// behind the cursor (`after: 0`) is confirmed without moving it, and
    /// waiting for a move there would hold the device's next batch until
    /// the confirm timeout, then resend a batch the device had confirmed.
    pub fn on_cursor_moved(
        &mut self,
        device: &DeviceId,
        c: Cursors,
        confirmed: Option<Seq>,
    ) -> (Option<Outstanding>, Vec<DownAction>) {
        let Some(d) = self.devices.get_mut(device) else {
            return (None, Vec::new());
        };
        let Some(known) = d.status.cursors_mut() else {
            return (None, Vec::new());
        };
        let before = known.delivered_upto;
        known.delivered_upto = known.delivered_upto.max(c.delivered_upto);
        known.head = known.head.max(c.head);
        let cursors = *known;
        let moved = cursors.delivered_upto != before;
        // How far this reached: a confirm's or read's own word, a nack's
        // move of the cursor.
        let reached = match confirmed {
            Some(upto) => upto,
            None if moved => cursors.delivered_upto,
            None => return (None, Vec::new()),
        };
        let mut released = None;
        d.status = match d.status {
            Status::AwaitingConfirm { batch, .. } if reached >= batch.first => {
                released = Some(batch);
                d.resends = 0;
                self.timers.remove(device);
                Status::Idle { cursors }
            }
            // A read from the old cursor would resend confirmed messages.
            Status::Reading { .. } if moved => {
                d.resends = 0;
                Status::Idle { cursors }
            }
            other => other,
        };
        if released.is_none() && !moved {
            // A stale confirm changes nothing.
            return (None, Vec::new());
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
        let Status::Reading {
            mut cursors,
            gen: reading,
            pulled,
            ..
        } = d.status
        else {
            return Verdict::Drop;
        };
        if reading != gen {
            return Verdict::Drop;
        }
        cursors.head = cursors.head.max(head);
        let Some((first, last, size)) = span else {
            d.status = Status::Idle { cursors };
            return if reply_empty || pulled {
                Verdict::Send { more: false }
            } else {
                Verdict::Drop
            };
        };
        let batch = Outstanding {
            first,
            last,
            size,
            sent_at: now,
            resends: d.resends,
        };
        d.status = Status::AwaitingConfirm { cursors, batch };
        if !d.plain {
            let timeout = self.cfg.confirm_timeout * 2u32.pow(d.resends.min(4));
            self.timers.insert(device.clone(), now + timeout);
        }
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
            let Status::AwaitingConfirm { cursors, batch } = d.status else {
                continue;
            };
            d.status = Status::Idle { cursors };
            d.resends += 1;
            let actions = self.next(&device);
            out.push((device, batch, actions));
        }
        out
    }

    /// Reads the next batch if the device is idle with something to send.
    fn next(&mut self, device: &DeviceId) -> Vec<DownAction> {
        let Some(Status::Idle { cursors }) = self.devices.get(device).map(|d| d.status) else {
            return Vec::new();
        };
        if cursors.head <= cursors.delivered_upto {
            return Vec::new();
        }
        let gen = self.fresh();
        let d = self.devices.get_mut(device).expect("checked");
        d.status = Status::Reading {
            cursors,
            gen,
            from: cursors.delivered_upto,
            pulled: false,
        };
        let limit = if d.plain { 1 } else { self.cfg.batch_size };
        vec![DownAction::Read {
            device: device.clone(),
            after: cursors.delivered_upto,
            limit,
            gen,
            reply_empty: false,
        }]
    }
}

#[cfg(test)]
mod tests;
