//! The uplink scheduler: which stored message goes north when, with no I/O.
//!
//! The shell feeds it events (a message was stored, the link came up or
//! went down, the backend acked, time passed, a refill was read) and
//! executes the [`Action`]s it returns. Keeping it pure lets every timing
//! rule be tested with made-up instants.
//!
//! Rules it keeps:
//! - Per device at most `max_inflight` messages are sent and unacked, and a
//!   first attempt always goes to the lowest-seq message that is ready.
//! - An attempt counts towards `max_attempts` only if the link stayed up
//!   from send until its ack timeout (same epoch); a drop puts everything in
//!   flight back to ready, uncounted.
//! - An ack timeout counts only if the backend acked something between
//!   the send and the timeout ([`backend`]); otherwise the message waits,
//!   uncounted, and is sent again after the retry backoff, or as soon as
//!   the backend is heard from. And only if what it acked was sent at or
//!   after this message: a backend still working through older sends is
//!   behind, not refusing; the message is sent again after the retry
//!   backoff, uncounted.
//! - While the backend is away, a device sends only its oldest message (a
//!   probe). It sends its window again once an ack of its own comes, or
//!   when the backend is heard from while none of its messages is in
//!   flight or backing off (nothing of it can be missing at the backend
//!   then). So a backend gets each device's messages in seq order,
//!   whenever it subscribes (but for every `retry.max_attempts`-th probe
//!   round, which carries the next message too: [`Scheduler::probe`]).
//! - Memory holds at most `window` messages per device; the rest stay in the
//!   store and are read back (`Refill`) in seq order as the window drains.
//!   A message is dropped from memory only when a `Deliver`/`Kill` action
//!   for it is issued; the store decides what really moved.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::RetryConfig;
use crate::deadlines::Deadlines;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::sparkplug::edge::STREAM as SPARKPLUG;
use crate::store::record::uplink::{PendingMessage, EXPIRED_REASON};
use backend::Backend;
use queue::{arm, queue, DeviceQueue, Entry, Refill, Status, Timers};

/// The failed attempt when the upstream closed the link on a message.
pub const REFUSED: &str = "the upstream broker closed the connection on this message";

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub max_inflight: usize,
    pub ack_timeout: Duration,
    pub retry: RetryConfig,
    /// Messages per device held in memory.
    pub window: usize,
}

impl SchedulerConfig {
    /// The scheduler of `north.max_inflight`, `north.ack_timeout_ms` and
    /// `retry`, holding twice the messages in flight per device in memory
    /// (at least 64).
    pub fn of(north: &crate::config::NorthConfig, retry: RetryConfig) -> SchedulerConfig {
        SchedulerConfig {
            max_inflight: north.max_inflight,
            ack_timeout: north.ack_timeout,
            retry,
            window: (north.max_inflight * 2).max(64),
        }
    }
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish north (QoS 1). `committed`: on its first publish, when its
    /// commit returned (the `north_publish` stage).
    Publish {
        msg: PendingMessage,
        committed: Option<Instant>,
    },
    /// Commit `DELIVERED`, then send a `delivered` receipt. `sent`: when
    /// the publish the backend acked was made (the `backend_ack` stage).
    Deliver {
        device: DeviceId,
        msg_id: MsgId,
        attempts: u32,
        sent: Option<Instant>,
    },
    /// Commit `DEAD` with a dead letter, then send a `failed` receipt.
    Kill {
        device: DeviceId,
        msg_id: MsgId,
        attempts: u32,
        reason: String,
    },
    /// Persist a counted failed attempt.
    RecordAttempt {
        id: i64,
        attempts: u32,
        retry_in: Duration,
        error: String,
    },
    /// Read up to `limit` stored messages of `device` after `after`.
    Refill {
        device: DeviceId,
        after: Seq,
        limit: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Down,
    Up(u64),
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    devices: HashMap<DeviceId, DeviceQueue>,
    timers: Timers,
    link: Link,
    backend: Backend,
    /// Devices that may have something to send or refill.
    dirty: HashSet<DeviceId>,
    /// Ack timeouts not counted because the backend was behind, since
    /// [`Scheduler::take_behind`] last read them.
    behind: u64,
    /// The `loaded_upto` of devices forgotten with nothing left (see
    /// [`queue()`]), at most [`FORGOTTEN_MAX`].
    forgotten: HashMap<DeviceId, Seq>,
    /// Sparkplug uplinks wait ([`link`]).
    held: bool,
}

/// Most forgotten devices whose loaded seq is remembered; past it the
/// memory starts again (a stale store notice for one of them could then
/// send a message once more, which the backend drops as a duplicate).
const FORGOTTEN_MAX: usize = 16_384;

impl Scheduler {
    /// New settings from now on: timers already set keep their deadline;
    /// every device is looked at again (more may fit in flight).
    pub fn set_config(&mut self, cfg: SchedulerConfig) {
        self.cfg = cfg;
        self.dirty.extend(self.devices.keys().cloned());
    }

    pub fn new(cfg: SchedulerConfig) -> Scheduler {
        Scheduler {
            cfg,
            devices: HashMap::new(),
            timers: Deadlines::new(),
            link: Link::Down,
            backend: Backend::default(),
            dirty: HashSet::new(),
            behind: 0,
            forgotten: HashMap::new(),
            held: false,
        }
    }

    /// How many ack timeouts found the backend there but behind (still
    /// acking only older sends) since the last call: each message was
    /// sent again, uncounted.
    pub fn take_behind(&mut self) -> u64 {
        std::mem::take(&mut self.behind)
    }

    /// Messages held in memory, all devices.
    pub fn in_memory(&self) -> usize {
        self.devices.values().map(|d| d.entries.len()).sum()
    }

    /// Whether `device`'s message `seq` is in memory: not yet acked, so
    /// no final receipt for it has gone out.
    pub fn holds(&self, device: &DeviceId, seq: Seq) -> bool {
        self.devices
            .get(device)
            .is_some_and(|q| q.entries.contains_key(&seq))
    }

    /// Messages published north and not yet acked or timed out, all devices.
    pub fn in_flight(&self) -> usize {
        self.devices.values().map(DeviceQueue::inflight).sum()
    }

    /// A device has stored messages that are not in memory yet (start-up).
    pub fn on_backlog(&mut self, device: DeviceId) {
        let q = queue(&mut self.devices, &mut self.forgotten, &device);
        q.refill = match q.refill {
            Refill::Reading { .. } => Refill::Reading { stored_since: true },
            _ => Refill::InStore,
        };
        self.dirty.insert(device);
    }

    /// A message was committed (at `committed`, when known); messages of
    /// one device arrive in seq order.
    pub fn on_stored(
        &mut self,
        msg: PendingMessage,
        committed: Option<Instant>,
        now: Instant,
        now_ms: i64,
    ) {
        let device = msg.device.clone();
        let window = self.cfg.window;
        let q = queue(&mut self.devices, &mut self.forgotten, &device);
        if msg.seq <= q.loaded_upto {
            return;
        }
        q.refill = match q.refill {
            Refill::Reading { .. } => Refill::Reading { stored_since: true },
            Refill::InStore => Refill::InStore,
            Refill::InMemory if q.entries.len() >= window => Refill::InStore,
            Refill::InMemory => {
                q.loaded_upto = msg.seq;
                Self::insert(&mut self.timers, q, msg, committed, now, now_ms);
                Refill::InMemory
            }
        };
        self.dirty.insert(device);
    }

    /// A refill read came back.
    pub fn on_loaded(
        &mut self,
        device: &DeviceId,
        msgs: Vec<PendingMessage>,
        limit: usize,
        now: Instant,
        now_ms: i64,
    ) {
        let Some(q) = self.devices.get_mut(device) else {
            return;
        };
        let stored_since = matches!(q.refill, Refill::Reading { stored_since: true });
        q.refill = if msgs.len() >= limit || stored_since {
            Refill::InStore
        } else {
            Refill::InMemory
        };
        for msg in msgs {
            if msg.seq > q.loaded_upto {
                q.loaded_upto = msg.seq;
                Self::insert(&mut self.timers, q, msg, None, now, now_ms);
            }
        }
        self.dirty.insert(device.clone());
    }

    /// A message `ferry dlq replay` set back to `stored`. Its seq is
    /// usually behind what the device's queue has loaded, so no refill
    /// would ever read it: it is put in memory here, unless held already.
    pub fn on_replayed(&mut self, msg: PendingMessage, now: Instant, now_ms: i64) {
        let device = msg.device.clone();
        let q = queue(&mut self.devices, &mut self.forgotten, &device);
        if q.entries.contains_key(&msg.seq) {
            return;
        }
        if msg.seq > q.loaded_upto {
            if q.refill != Refill::InMemory {
                // Past what is loaded, with more in the store: the refill
                // reads it in order.
                self.on_backlog(device);
                return;
            }
            q.loaded_upto = msg.seq;
        }
        Self::insert(&mut self.timers, q, msg, None, now, now_ms);
        self.dirty.insert(device);
    }

    /// A refill or a transition failed in the store: read the device again.
    pub fn on_store_failed(&mut self, device: &DeviceId) {
        if let Some(q) = self.devices.get_mut(device) {
            q.refill = Refill::InStore;
            self.dirty.insert(device.clone());
        }
    }

    fn insert(
        timers: &mut Timers,
        q: &mut DeviceQueue,
        msg: PendingMessage,
        committed: Option<Instant>,
        now: Instant,
        now_ms: i64,
    ) {
        let expires_at = msg
            .expires_ms
            .map(|ms| now + Duration::from_millis((ms - now_ms).max(0) as u64));
        let entry = Entry {
            msg,
            status: Status::Ready,
            expires_at,
            silent: 0,
            unanswered_since: None,
            behind: 0,
            committed,
        };
        arm(timers, &entry);
        q.by_id.insert(entry.msg.msg_id.clone(), entry.msg.seq);
        q.entries.insert(entry.msg.seq, entry);
    }

    /// The store finished this message by itself (ttl sweep): drop it.
    pub fn forget(&mut self, device: &DeviceId, msg_id: &MsgId) {
        if let Some(q) = self.devices.get_mut(device) {
            if let Some(seq) = q.by_id.get(msg_id).copied() {
                q.remove(seq);
                self.timers.remove(&(device.clone(), seq));
                self.dirty.insert(device.clone());
            }
        }
    }

    /// A publish could not be queued north: try it again shortly.
    pub fn on_publish_refused(&mut self, device: &DeviceId, seq: Seq, now: Instant) {
        if let Some(e) = self
            .devices
            .get_mut(device)
            .and_then(|q| q.entries.get_mut(&seq))
        {
            let until = now + Duration::from_millis(50);
            e.status = Status::Backoff { until };
            arm(&mut self.timers, e);
        }
    }

    /// When the shell should call [`Scheduler::on_tick`] next.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// Applies every timer due at `now`.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        while let Some(((device, seq), _)) = self.timers.pop_due(now) {
            let Some(q) = self.devices.get_mut(&device) else {
                continue;
            };
            let Some(entry) = q.entries.get_mut(&seq) else {
                continue;
            };
            if entry.expires_at.is_some_and(|at| at <= now) {
                let e = q.remove(seq).expect("present");
                actions.push(Action::Kill {
                    device: e.msg.device,
                    msg_id: e.msg.msg_id,
                    attempts: e.msg.attempts,
                    reason: EXPIRED_REASON.into(),
                });
                self.dirty.insert(device);
                continue;
            }
            match entry.status {
                Status::InFlight {
                    sent,
                    deadline,
                    epoch,
                } if deadline <= now => {
                    let since = entry.unanswered_since.unwrap_or(sent);
                    if self.link == Link::Up(epoch) && !self.backend.heard_since(since) {
                        // Nobody there to take it: wait, uncounted.
                        self.backend.silent(now);
                        Self::wait_for_backend(&self.cfg, &mut self.timers, q, since, now);
                    } else if self.link == Link::Up(epoch) && !self.backend.answered_since(since) {
                        // There, but behind what was sent before this: it
                        // skipped nothing. Sent again later, uncounted.
                        entry.behind = entry.behind.saturating_add(1);
                        self.behind += 1;
                        entry.unanswered_since = Some(since);
                        let delay = crate::backoff::delay_random(&self.cfg.retry, entry.behind - 1);
                        entry.status = Status::Backoff { until: now + delay };
                        arm(&mut self.timers, entry);
                    } else if self.link == Link::Up(epoch) {
                        entry.silent = 0;
                        entry.behind = 0;
                        entry.unanswered_since = None;
                        let error =
                            format!("no ack within {} ms", self.cfg.ack_timeout.as_millis());
                        actions.extend(Self::count_failure(
                            &self.cfg,
                            &mut self.timers,
                            q,
                            seq,
                            error,
                            now,
                        ));
                    } else {
                        entry.status = Status::Ready;
                        arm(&mut self.timers, entry);
                    }
                    self.dirty.insert(device);
                }
                Status::Backoff { until } | Status::Waiting { until } if until <= now => {
                    entry.status = Status::Ready;
                    arm(&mut self.timers, entry);
                    self.dirty.insert(device);
                }
                // Its expiry is still ahead: keep waiting for it.
                _ => arm(&mut self.timers, entry),
            }
        }
        actions
    }

    /// Sends and refills for every device that changed since the last call.
    pub fn poll(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let up = match self.link {
            Link::Up(epoch) => Some(epoch),
            Link::Down => None,
        };
        for device in std::mem::take(&mut self.dirty) {
            let Some(q) = self.devices.get_mut(&device) else {
                continue;
            };
            if let Some(epoch) = up {
                // While the backend is away a device sends only its oldest
                // message (a probe), so a backend that subscribes at any
                // moment gets each device's messages from the oldest on.
                q.probing |= self.backend.absent();
                let (skip, take) = if q.probing {
                    Self::probe(&self.cfg, q)
                } else {
                    (0, usize::MAX)
                };
                let mut inflight = q.inflight();
                let deadline = now + self.cfg.ack_timeout;
                for entry in q.entries.values_mut().take(take).skip(skip) {
                    if inflight >= self.cfg.max_inflight
                        || (self.held && entry.msg.stream == SPARKPLUG)
                    {
                        break;
                    }
                    if entry.status == Status::Ready {
                        entry.status = Status::InFlight {
                            sent: now,
                            deadline,
                            epoch,
                        };
                        arm(&mut self.timers, entry);
                        actions.push(Action::Publish {
                            msg: entry.msg.clone(),
                            committed: entry.committed.take(),
                        });
                        inflight += 1;
                    }
                }
            }
            if q.refill == Refill::InStore && q.entries.len() <= self.cfg.window / 2 {
                q.refill = Refill::Reading {
                    stored_since: false,
                };
                actions.push(Action::Refill {
                    device: device.clone(),
                    after: q.loaded_upto,
                    limit: self.cfg.window - q.entries.len(),
                });
            }
            if q.entries.is_empty() && q.refill == Refill::InMemory {
                // Nothing left: forget the device, so memory does not grow
                // with every device that ever sent; only the seq it had
                // loaded is kept (see `queue`).
                let loaded_upto = q.loaded_upto;
                self.devices.remove(&device);
                if self.forgotten.len() >= FORGOTTEN_MAX {
                    self.forgotten.clear();
                }
                self.forgotten.insert(device, loaded_upto);
            }
        }
        actions
    }
}

mod backend;
mod link;
mod queue;
#[cfg(test)]
mod tests;
mod verdicts;
