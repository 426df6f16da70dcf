//! The backend's side of the scheduler: its verdicts on messages (acks,
//! nacks), the upstream refusing one, and whether the backend is there at
//! all ([`super::backend`]).

use tokio::time::Instant;

use super::queue::{arm, DeviceQueue, Status, Timers};
use super::{Action, Scheduler, SchedulerConfig, REFUSED};
use crate::backoff;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::ack::Verdict;

impl Scheduler {
    /// The backend sent an ack message (for any message, of any verdict):
    /// it is there. What waited on its silence is sent again now.
    pub fn on_backend_heard(&mut self, now: Instant) {
        if !self.backend.heard(now) {
            return;
        }
        for (device, q) in &mut self.devices {
            let mut any = false;
            for e in q.entries.values_mut() {
                if matches!(e.status, Status::Waiting { .. }) {
                    e.status = Status::Ready;
                    e.silent = 0;
                    arm(&mut self.timers, e);
                    any = true;
                }
            }
            // A probe in flight may have gone out before the backend
            // subscribed: its window waits for its ack (or its counted
            // timeout and resend). With none out, the window goes now,
            // oldest first, to a backend that is there.
            if q.probing && !q.unsettled_besides(None) {
                q.probing = false;
                any = true;
            }
            if any {
                self.dirty.insert(device.clone());
            }
        }
    }

    /// Which of a probing device's messages (in seq order: skip, take) may
    /// go now: the oldest alone, nothing while it is out. But a backend
    /// that is there and ignores that one message looks absent while
    /// nothing else goes; so every `retry.max_attempts`-th silent round
    /// the next message goes right behind it (instead of it with
    /// `max_inflight` 1), and an ack of that shows the backend there.
    pub(super) fn probe(cfg: &SchedulerConfig, q: &mut DeviceQueue) -> (usize, usize) {
        let inflight = q.inflight();
        let Some(head) = q.entries.values_mut().next() else {
            return (0, 0);
        };
        if inflight > 0 || head.status != Status::Ready {
            return (0, 0);
        }
        let every = cfg.retry.max_attempts.max(2);
        let widen = head.silent > 0 && head.silent % every == 0;
        match (widen, cfg.max_inflight) {
            (false, _) => (0, 1),
            (true, 1) => {
                // It goes next turn, after the one sent in its place.
                head.silent += 1;
                (1, 2)
            }
            (true, _) => (0, 2),
        }
    }

    /// A message of `q` sent at `since` timed out with no sign of the
    /// backend since: it and every other message of the device in flight
    /// since then (whose timeouts will find the same silence) wait for one
    /// resend round together, in which `Scheduler::poll` sends only the
    /// oldest (the device is probing from now on).
    pub(super) fn wait_for_backend(
        cfg: &SchedulerConfig,
        timers: &mut Timers,
        q: &mut DeviceQueue,
        since: Instant,
        now: Instant,
    ) {
        let silent = q.entries.values().map(|e| e.silent).max().unwrap_or(0);
        let silent = silent.saturating_add(1);
        let until = now + backoff::delay_random(&cfg.retry, silent - 1);
        for e in q.entries.values_mut() {
            let sent = match e.status {
                Status::InFlight { sent, .. } if sent >= since => sent,
                Status::Waiting { .. } => e.unanswered_since.unwrap_or(now),
                _ => continue,
            };
            e.unanswered_since.get_or_insert(sent);
            e.silent = silent;
            e.status = Status::Waiting { until };
            arm(timers, e);
        }
    }

    /// Since when messages wait on a backend that acks nothing (`None`:
    /// it acked something since the last ack timeout, or none passed).
    pub fn backend_silent_since(&self) -> Option<Instant> {
        self.backend.silent_since()
    }

    /// The upstream broker dropped the link on this message while it was
    /// alone in flight: that attempt failed and counts.
    pub fn on_refused(&mut self, device: &DeviceId, seq: Seq, now: Instant) -> Vec<Action> {
        let Some(q) = self.devices.get_mut(device) else {
            return Vec::new();
        };
        if !q.entries.contains_key(&seq) {
            return Vec::new();
        }
        self.dirty.insert(device.clone());
        Self::count_failure(&self.cfg, &mut self.timers, q, seq, REFUSED.into(), now)
    }

    /// The backend's verdict on a message.
    pub fn on_ack(
        &mut self,
        device: &DeviceId,
        msg_id: &MsgId,
        verdict: Verdict,
        now: Instant,
    ) -> Vec<Action> {
        let q = self.devices.get_mut(device);
        let seq = q.as_ref().and_then(|q| q.by_id.get(msg_id).copied());
        let (Some(q), Some(seq)) = (q, seq) else {
            // Not in memory: already handled, or still only in the store.
            // The store applies the move only if the message is `stored`.
            return match verdict {
                Verdict::Ok => vec![Action::Deliver {
                    device: device.clone(),
                    msg_id: msg_id.clone(),
                    attempts: 0,
                    sent: None,
                }],
                Verdict::Nack {
                    reason,
                    retry: false,
                } => vec![Action::Kill {
                    device: device.clone(),
                    msg_id: msg_id.clone(),
                    attempts: 0,
                    reason: format!("nacked: {reason}"),
                }],
                Verdict::Nack { retry: true, .. } => vec![],
            };
        };
        self.dirty.insert(device.clone());
        // The backend has this device's probe: what it gets from now on
        // comes after it, unless an earlier send (in flight, or backing off
        // after a counted loss) may still be missing there.
        if q.probing && !q.unsettled_besides(Some(seq)) {
            q.probing = false;
        }
        let entry = q.entries.get_mut(&seq).expect("by_id and entries agree");
        // A verdict on what was sent then: later timeouts of messages sent
        // before it count (it was not behind them), see [`super::backend`].
        let first_sent = match entry.status {
            Status::InFlight { sent, .. } => Some(entry.unanswered_since.unwrap_or(sent)),
            _ => entry.unanswered_since,
        };
        if let Some(sent) = first_sent {
            self.backend.answered(sent);
        }
        match verdict {
            Verdict::Ok => {
                let e = q.remove(seq).expect("present");
                self.timers.remove(&(device.clone(), seq));
                let sent = match e.status {
                    Status::InFlight { sent, .. } => Some(sent),
                    _ => None,
                };
                vec![Action::Deliver {
                    device: device.clone(),
                    msg_id: msg_id.clone(),
                    attempts: e.msg.attempts + 1,
                    sent,
                }]
            }
            Verdict::Nack { reason, retry } => {
                if !retry || entry.msg.no_retry {
                    let e = q.remove(seq).expect("present");
                    self.timers.remove(&(device.clone(), seq));
                    return vec![Action::Kill {
                        device: device.clone(),
                        msg_id: msg_id.clone(),
                        attempts: e.msg.attempts + 1,
                        reason: format!("nacked: {reason}"),
                    }];
                }
                Self::count_failure(
                    &self.cfg,
                    &mut self.timers,
                    q,
                    seq,
                    format!("nacked: {reason}"),
                    now,
                )
            }
        }
    }

    /// An attempt failed while the link was up: back off, or give up.
    pub(super) fn count_failure(
        cfg: &SchedulerConfig,
        timers: &mut Timers,
        q: &mut DeviceQueue,
        seq: Seq,
        error: String,
        now: Instant,
    ) -> Vec<Action> {
        let entry = q.entries.get_mut(&seq).expect("caller checked");
        entry.msg.attempts += 1;
        let attempts = entry.msg.attempts;
        let give_up = if entry.msg.no_retry {
            Some(format!("no_retry: {error}"))
        } else if attempts >= cfg.retry.max_attempts {
            Some(format!("exhausted: {attempts} attempts, last: {error}"))
        } else {
            None
        };
        if let Some(reason) = give_up {
            let e = q.remove(seq).expect("present");
            timers.remove(&(e.msg.device.clone(), seq));
            return vec![Action::Kill {
                device: e.msg.device,
                msg_id: e.msg.msg_id,
                attempts,
                reason,
            }];
        }
        let retry_in = backoff::delay_random(&cfg.retry, attempts - 1);
        let until = now + retry_in;
        entry.status = Status::Backoff { until };
        arm(timers, entry);
        vec![Action::RecordAttempt {
            id: entry.msg.id,
            attempts,
            retry_in,
            error,
        }]
    }
}
