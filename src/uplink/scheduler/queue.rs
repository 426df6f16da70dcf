//! A device's messages in memory and the one timer each carries.

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;

use crate::deadlines::Deadlines;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::store::record::uplink::PendingMessage;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Ready,
    /// Published at `sent` on connection `epoch`; its ack is due by
    /// `deadline`.
    InFlight {
        sent: Instant,
        deadline: Instant,
        epoch: u64,
    },
    /// A counted attempt failed: resent at `until`.
    Backoff {
        until: Instant,
    },
    /// Its ack timeout passed while the backend showed no life: resent at
    /// `until`, or as soon as the backend is heard from, uncounted.
    Waiting {
        until: Instant,
    },
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) msg: PendingMessage,
    pub(super) status: Status,
    pub(super) expires_at: Option<Instant>,
    /// Ack timeouts in a row while the backend was silent (uncounted;
    /// they set the resend delay).
    pub(super) silent: u32,
    /// When the first send of that run went out: a sign of the backend
    /// since then makes the next timeout count.
    pub(super) unanswered_since: Option<Instant>,
    /// Ack timeouts in a row while the backend answered only older sends
    /// (behind: uncounted; they set the resend delay).
    pub(super) behind: u32,
    /// When its commit returned, until its first publish carries it (the
    /// `north_publish` stage); `None` for a message read from the store.
    pub(super) committed: Option<Instant>,
}

#[derive(Debug, Default)]
pub(super) struct DeviceQueue {
    pub(super) entries: BTreeMap<Seq, Entry>,
    pub(super) by_id: HashMap<MsgId, Seq>,
    /// Highest seq this queue has held or handed to an action.
    pub(super) loaded_upto: Seq,
    /// Where the device's messages past `loaded_upto` are.
    pub(super) refill: Refill,
    /// Only the oldest message goes north, alone: it was sent while the
    /// backend was away, and is not yet known to have reached it (see
    /// `Scheduler::poll`).
    pub(super) probing: bool,
}

/// Whether a device's stored messages are all in memory, and if not, how
/// the rest are being read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Refill {
    /// Every stored message past `loaded_upto` is in memory.
    #[default]
    InMemory,
    /// Stored messages past `loaded_upto` wait in the store.
    InStore,
    /// A refill read is out; `stored_since`: a message was stored meanwhile
    /// (so more wait in the store, whatever the read brings).
    Reading { stored_since: bool },
}

impl DeviceQueue {
    pub(super) fn inflight(&self) -> usize {
        self.entries
            .values()
            .filter(|e| matches!(e.status, Status::InFlight { .. }))
            .count()
    }

    /// Whether a message (other than `besides`) is in flight or backing
    /// off after a counted failure: either may still be missing at the
    /// backend.
    pub(super) fn unsettled_besides(&self, besides: Option<Seq>) -> bool {
        self.entries.iter().any(|(&s, e)| {
            Some(s) != besides
                && matches!(e.status, Status::InFlight { .. } | Status::Backoff { .. })
        })
    }

    pub(super) fn remove(&mut self, seq: Seq) -> Option<Entry> {
        let e = self.entries.remove(&seq)?;
        self.by_id.remove(&e.msg.msg_id);
        Some(e)
    }
}

/// One timer per message in memory: its next status change (ack timeout,
/// end of backoff) or its expiry, whichever comes first.
pub(super) type Timers = Deadlines<(DeviceId, Seq)>;

/// Sets the message's timer from its status and expiry.
pub(super) fn arm(timers: &mut Timers, e: &Entry) {
    let status_at = match e.status {
        Status::Ready => None,
        Status::InFlight { deadline, .. } => Some(deadline),
        Status::Backoff { until } | Status::Waiting { until } => Some(until),
    };
    let key = (e.msg.device.clone(), e.msg.seq);
    match [status_at, e.expires_at].into_iter().flatten().min() {
        Some(at) => {
            timers.insert(key, at);
        }
        None => {
            timers.remove(&key);
        }
    }
}

/// The queue of `device`, made if it has none. A device forgotten with
/// nothing left starts from the seq it had loaded: a store notice of a
/// message a refill already read (and sent, and had acked) can come after
/// the device was forgotten, since notices come through intake and refills
/// straight from the store; taken as new, that message would go north a
/// second time.
pub(super) fn queue<'a>(
    devices: &'a mut HashMap<DeviceId, DeviceQueue>,
    forgotten: &mut HashMap<DeviceId, Seq>,
    device: &DeviceId,
) -> &'a mut DeviceQueue {
    devices
        .entry(device.clone())
        .or_insert_with(|| DeviceQueue {
            loaded_upto: forgotten.remove(device).unwrap_or_default(),
            ..DeviceQueue::default()
        })
}
