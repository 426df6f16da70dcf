//! Which publish goes to the upstream broker next, and which one killed the
//! link. Pure: the session shell reports what rumqttc did; this type keeps
//! the books and answers.
//!
//! MQTT 3.1.1 has no negative PUBACK. A broker that will not take a message
//! (too large for its `max_packet_size`, a topic it finds invalid) closes
//! the connection instead, and a client that simply resends would loop on it
//! forever while nothing else moves. So:
//! - every publish handed to rumqttc is followed to its PUBACK by packet id;
//! - when a connection drops with publishes unacknowledged, the oldest of
//!   them become *suspects*: the broker acks in order, so the one it choked
//!   on is among them, and the PUBACKs it sent just before closing are often
//!   lost with the connection (a reset discards what was not read yet);
//! - a suspect is only ever sent as a *probe*: alone, once nothing else is
//!   in flight, with everything else held back until its PUBACK;
//! - a drop while a probe is alone in flight, soon after it was written, is
//!   a *strike*: the owner counts it as a failed attempt (an uplink is
//!   dead-lettered after `retry.max_attempts` of them);
//! - a probe that is acknowledged clears its suspect, and flow resumes.
//!
//! Publishes belong to the connection (epoch) they were made for: when it
//! drops, everything not yet acknowledged is forgotten here, and the owners,
//! told the link went down, send again on the next one. A connection the
//! session left because the node acknowledged nothing at all ([`Flow::left`])
//! makes no suspects: the node stalled, not a message.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

/// A drop within this long of a lone probe's write counts against it.
pub const STRIKE_WINDOW: Duration = Duration::from_secs(5);
/// A probe unacknowledged this long (the link still up) proves nothing;
/// it is cleared and the flow resumes.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Suspects remembered; the oldest is forgotten beyond this.
const MAX_SUSPECTS: usize = 64;
/// Unacknowledged publishes a drop makes suspects, oldest first. Each costs
/// one round trip on the next connection; if the culprit was further back,
/// the next drop finds it among the next ones.
const SUSPECTS_PER_DROP: usize = 16;

/// What a publish is, so its fate can be told to its owner: any small
/// value the owner can compare.
pub trait Tag: Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static {}
impl<T: Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static> Tag for T {}

/// One publish waiting for its turn.
#[derive(Debug, Clone)]
pub struct Outgoing<T> {
    pub topic: String,
    pub body: Bytes,
    pub retain: bool,
    pub tag: T,
    /// The connection it was made for; void once that one is gone.
    pub epoch: u64,
}

#[derive(Debug)]
struct Probe<T> {
    tag: T,
    /// When rumqttc wrote it; `None` while it is only requested.
    written: Option<Instant>,
}

#[derive(Debug)]
pub struct Flow<T> {
    /// The live connection, if any.
    epoch: Option<u64>,
    /// Accepted, not yet handed to rumqttc.
    held: VecDeque<Outgoing<T>>,
    /// Handed to rumqttc, not yet written (rumqttc takes them in order).
    requested: VecDeque<T>,
    /// Written, awaiting PUBACK, in send order.
    written: VecDeque<(u16, T)>,
    /// rumqttc's packet-id collision: written later under this id.
    collided: Option<(u16, T)>,
    suspects: VecDeque<T>,
    probe: Option<Probe<T>>,
    /// Most publishes handed to rumqttc and unacknowledged at once.
    window: usize,
}

impl<T: Tag> Flow<T> {
    pub fn new(window: usize) -> Flow<T> {
        Flow {
            epoch: None,
            held: VecDeque::new(),
            requested: VecDeque::new(),
            written: VecDeque::new(),
            collided: None,
            suspects: VecDeque::new(),
            probe: None,
            window: window.max(1),
        }
    }

    /// A connection is up; publishes for `epoch` may flow.
    pub fn connected(&mut self, epoch: u64) {
        self.epoch = Some(epoch);
    }

    /// Publishes accepted and not yet handed over.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Queues a publish; one for a connection that is gone is dropped (its
    /// owner was told, and sends again on the next).
    pub fn submit(&mut self, out: Outgoing<T>) {
        if self.epoch == Some(out.epoch) {
            self.held.push_back(out);
        }
    }

    /// The next publish to hand to rumqttc, if one may go now.
    pub fn next_to_send(&mut self) -> Option<Outgoing<T>> {
        self.epoch?;
        if self.probe.is_some() {
            return None;
        }
        let front = self.held.front()?;
        if self.suspects.contains(&front.tag) {
            if !(self.requested.is_empty() && self.written.is_empty() && self.collided.is_none()) {
                return None;
            }
            self.probe = Some(Probe {
                tag: front.tag.clone(),
                written: None,
            });
        } else if self.requested.len() + self.written.len() >= self.window {
            return None;
        }
        let out = self.held.pop_front()?;
        self.requested.push_back(out.tag.clone());
        Some(out)
    }

    /// Hands `out` over at once, ahead of anything held (the session's last
    /// words on leaving).
    pub fn bypass(&mut self, out: Outgoing<T>) -> Outgoing<T> {
        self.requested.push_back(out.tag.clone());
        out
    }

    /// rumqttc could not take `out` (its queue is full): it goes first next time.
    pub fn refused_by_client(&mut self, out: Outgoing<T>) {
        if self.requested.back() == Some(&out.tag) {
            self.requested.pop_back();
        }
        if self.probe.as_ref().is_some_and(|p| p.tag == out.tag) {
            self.probe = None;
        }
        self.held.push_front(out);
    }

    /// The session refused `tag`'s publish itself (larger than the broker
    /// takes) after [`Flow::next_to_send`]: it was never handed over, and
    /// its owner counts it as a failed attempt.
    pub fn withdrawn(&mut self, tag: &T) {
        if self.requested.back() == Some(tag) {
            self.requested.pop_back();
        }
        if self.probe.as_ref().is_some_and(|p| &p.tag == tag) {
            self.probe = None;
        }
        self.suspects.retain(|s| s != tag);
    }

    /// rumqttc wrote a publish with packet id `pkid`.
    pub fn written(&mut self, pkid: u16, now: Instant) {
        let tag = match self.collided.take() {
            Some((p, tag)) if p == pkid => tag,
            other => {
                self.collided = other;
                match self.requested.pop_front() {
                    Some(tag) => tag,
                    // Not one of ours (nothing else publishes on this client).
                    None => return,
                }
            }
        };
        if let Some(probe) = self.probe.as_mut().filter(|p| p.tag == tag) {
            probe.written = Some(now);
        }
        self.written.push_back((pkid, tag));
    }

    /// rumqttc holds a publish back until `pkid` is acknowledged.
    pub fn collision(&mut self, pkid: u16) {
        if let Some(tag) = self.requested.pop_front() {
            self.collided = Some((pkid, tag));
        }
    }

    /// The broker acknowledged `pkid`; returns whose publish it was.
    pub fn acked(&mut self, pkid: u16) -> Option<T> {
        let at = self.written.iter().position(|(p, _)| *p == pkid)?;
        let (_, tag) = self.written.remove(at)?;
        if self.probe.as_ref().is_some_and(|p| p.tag == tag) {
            self.probe = None;
            self.suspects.retain(|s| s != &tag);
        }
        Some(tag)
    }

    /// The connection dropped at `now`. Returns the publish it dropped on,
    /// if a lone probe was cut off: a strike against it. Everything of the
    /// connection is forgotten.
    pub fn lost(&mut self, now: Instant) -> Option<T> {
        let strike = match (&self.probe, self.written.front()) {
            (
                Some(Probe {
                    tag,
                    written: Some(at),
                }),
                Some((_, first)),
            ) if self.written.len() == 1
                && first == tag
                && now.saturating_duration_since(*at) <= STRIKE_WINDOW =>
            {
                Some(tag.clone())
            }
            _ => None,
        };
        if strike.is_none() {
            let oldest: Vec<T> = self
                .written
                .iter()
                .map(|(_, tag)| tag.clone())
                .filter(|tag| !self.suspects.contains(tag))
                .take(SUSPECTS_PER_DROP)
                .collect();
            for tag in oldest {
                if self.suspects.len() >= MAX_SUSPECTS {
                    self.suspects.pop_front();
                }
                self.suspects.push_back(tag);
            }
        }
        self.forget();
        strike
    }

    /// The session left the connection because the node moved nothing
    /// (`stall.rs`): the node is to blame, not a message, so nothing is
    /// suspected and nothing struck. Everything of the connection is
    /// forgotten, as after any drop.
    pub fn left(&mut self) {
        self.forget();
    }

    /// Forgets everything of the connection (its publishes are the
    /// owners' to send again); suspects stay suspects.
    fn forget(&mut self) {
        self.epoch = None;
        self.held.clear();
        self.requested.clear();
        self.written.clear();
        self.collided = None;
        self.probe = None;
    }

    /// When the probe in flight times out, if one is.
    pub fn probe_deadline(&self) -> Option<Instant> {
        self.probe
            .as_ref()
            .and_then(|p| p.written)
            .map(|at| at + PROBE_TIMEOUT)
    }

    /// A probe the broker neither acked nor dropped the link on within
    /// [`PROBE_TIMEOUT`] proves nothing: it is cleared and flow resumes.
    /// Returns the cleared suspect.
    pub fn expire_probe(&mut self, now: Instant) -> Option<T> {
        if self.probe_deadline().is_some_and(|at| at <= now) {
            let tag = self.probe.take()?.tag;
            self.suspects.retain(|s| s != &tag);
            return Some(tag);
        }
        None
    }

    /// Whether `tag` is suspected of killing the link.
    pub fn is_suspect(&self, tag: &T) -> bool {
        self.suspects.contains(tag)
    }
}

#[cfg(test)]
mod tests;
