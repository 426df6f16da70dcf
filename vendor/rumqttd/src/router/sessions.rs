//! ferry: persistent sessions of an ephemeral broker, bounded.
//!
//! A client that asked for a session (MQTT 3.1.1 without a clean session,
//! MQTT 5 with a session expiry, either held to
//! [`crate::ConnectionSettings::max_session_expiry`]) leaves behind, when
//! its connection ends:
//! - its subscriptions (with their QoS), restored when it connects again
//!   without a clean session / clean start, which its CONNACK says
//!   (session present);
//! - the QoS 1 deliveries it had not acknowledged, and those queued for it,
//!   sent again (DUP) after the CONNACK; and the QoS 1 deliveries meant for
//!   it while it was away.
//!
//! Everything is bounded: a session lives at most its expiry after its
//! connection ended and is freed then ([`Sessions::sweep`], run as
//! clients come and go); at most `max` sessions are kept (past it, the one
//! nearest its end is freed first); a session keeps at most
//! [`MAX_MESSAGES`] messages and [`MAX_BYTES`] of them, and all sessions
//! together at most `max_bytes` (`RouterConfig::max_session_bytes`).
//!
//! Bytes are what the kept messages cost in memory, not their payloads'
//! length ([`Kept::cost`]: what the allocator holds for them, slack
//! included), and a session keeps them compactly so that this is little:
//! one buffer of their payloads back to back, an 8-byte entry for each
//! message, each distinct topic once. Kept as the deliveries came (a
//! 72-byte `Publish` each, a payload allocated with room to spare on
//! another thread, a topic each), a session of 256 receipts cost about 108
//! KiB of RSS; kept compactly, about 40 KiB counted and 60 KiB of RSS
//! (ferry's `tests/session_memory.rs`).
//!
//! What a bound leaves out is counted and said, never silent: the
//! gateway's protocol repairs it (a device sends again what got no
//! receipt; an inbox batch is sent again until it is confirmed). Past a
//! session's own bound that is an INFO line; past the bound of all of them
//! a WARN, at most one a minute (with the count since the last), and its
//! own counter. Nothing is kept across a restart of the broker.

use std::collections::HashMap;
use std::mem::size_of;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{info, warn};

use crate::protocol::{Publish, QoS};
use crate::refusals::Clip;
use crate::Filter;

/// Messages one session keeps for its client, at most.
pub(crate) const MAX_MESSAGES: usize = 256;
/// Bytes one session's messages cost ([`Kept::cost`]), at most.
pub(crate) const MAX_BYTES: usize = 256 << 10;
/// At most one WARN a minute says that the sessions are full.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What the allocator takes for `n` bytes: glibc's malloc gives a chunk
/// of `n` plus an 8-byte header, in steps of 16, 32 at least.
const fn allocated(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let chunk = (n + 8 + 15) & !15;
    if chunk < 32 {
        32
    } else {
        chunk
    }
}

/// One kept message: its payload's length (the payloads lie back to back),
/// its topic's index and the packet id it was sent under, if it was: it
/// is sent again under that id, marked DUP [MQTT-4.4.0-1]; 0 if it was
/// never sent (it gets a new id, no DUP).
#[derive(Debug, Clone, Copy)]
struct Entry {
    len: u32,
    topic: u16,
    pkid: u16,
}

/// The QoS 1 messages one session keeps, oldest first, compactly.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    /// Each distinct topic once.
    topics: Vec<Bytes>,
    /// Every payload, back to back.
    payloads: Vec<u8>,
    entries: Vec<Entry>,
}

/// The capacity a buffer of `cap` grows to for `needed`: doubled, or just
/// `needed` when doubling would cost more than `room` allows.
fn grown(cap: usize, needed: usize, elem: usize, room: usize) -> usize {
    if needed <= cap {
        return cap;
    }
    let doubled = needed.max(2 * cap).max(4);
    if allocated(doubled * elem) - allocated(cap * elem) <= room {
        doubled
    } else {
        needed
    }
}

impl Kept {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What they cost in memory: what the allocator holds for them.
    pub(crate) fn cost(&self) -> usize {
        let topics: usize = self.topics.iter().map(|t| allocated(t.len())).sum();
        allocated(self.payloads.capacity())
            + allocated(self.entries.capacity() * size_of::<Entry>())
            + allocated(self.topics.capacity() * size_of::<Bytes>())
            + topics
    }

    /// Keeps `publish` if what it adds to [`Kept::cost`] is at most
    /// `room`, and the session stays within its own bound; what it added,
    /// or why not.
    fn push(&mut self, publish: &Publish, room: usize) -> Result<usize, LeftOut> {
        let before = self.cost();
        let topic = self.topics.iter().position(|t| *t == publish.topic);
        let len = publish.payload.len();
        if self.entries.len() >= MAX_MESSAGES || len > MAX_BYTES {
            return Err(LeftOut::SessionFull);
        }
        let room = room.min(MAX_BYTES.saturating_sub(before));
        // Doubled where that fits, else each buffer just as large as needed.
        let (mut payloads, mut entries, mut topics, mut added) = self.plan(publish, topic, room);
        if added > room {
            (payloads, entries, topics, added) = self.plan(publish, topic, 0);
        }
        if before + added > MAX_BYTES {
            return Err(LeftOut::SessionFull);
        }
        if added > room {
            return Err(LeftOut::AllFull);
        }
        let topic = match topic {
            Some(at) => at,
            None => {
                self.topics.reserve_exact(topics - self.topics.len());
                self.topics.push(Bytes::copy_from_slice(&publish.topic));
                self.topics.len() - 1
            }
        };
        self.payloads.reserve_exact(payloads - self.payloads.len());
        self.payloads.extend_from_slice(&publish.payload);
        self.entries.reserve_exact(entries - self.entries.len());
        self.entries.push(Entry {
            len: len as u32,
            topic: topic as u16,
            pkid: publish.pkid,
        });
        Ok(self.cost() - before)
    }

    /// The capacities the buffers grow to for `publish` (whose topic is
    /// at `topic` if it is kept already), each doubled where that adds at
    /// most `room`; and what they add to [`Kept::cost`].
    fn plan(
        &self,
        publish: &Publish,
        topic: Option<usize>,
        room: usize,
    ) -> (usize, usize, usize, usize) {
        let len = publish.payload.len();
        let payloads = grown(self.payloads.capacity(), self.payloads.len() + len, 1, room);
        let entry = size_of::<Entry>();
        let entries = grown(self.entries.capacity(), self.entries.len() + 1, entry, room);
        let slot = size_of::<Bytes>();
        let topics = match topic {
            Some(_) => self.topics.capacity(),
            None => grown(self.topics.capacity(), self.topics.len() + 1, slot, room),
        };
        let added = allocated(payloads) - allocated(self.payloads.capacity())
            + allocated(entries * entry)
            - allocated(self.entries.capacity() * entry)
            + allocated(topics * slot)
            - allocated(self.topics.capacity() * slot)
            + topic.map_or(allocated(publish.topic.len()), |_| 0);
        (payloads, entries, topics, added)
    }

    /// Leaves out the newest messages until they cost at most `room`, the
    /// buffers shrunk to fit; how many it left out.
    fn keep_within(&mut self, room: usize) -> usize {
        let topics = self.cost()
            - allocated(self.payloads.capacity())
            - allocated(self.entries.capacity() * size_of::<Entry>());
        let mut keep = self.entries.len();
        let mut bytes = self.payloads.len();
        while keep > 0 && topics + allocated(bytes) + allocated(keep * size_of::<Entry>()) > room {
            keep -= 1;
            bytes -= self.entries[keep].len as usize;
        }
        let left_out = self.entries.len() - keep;
        if keep == 0 {
            *self = Kept::default();
        } else if left_out > 0 {
            self.entries.truncate(keep);
            self.payloads.truncate(bytes);
            self.shrink();
        }
        left_out
    }

    /// Gives back what the buffers hold beyond their contents.
    fn shrink(&mut self) {
        self.payloads.shrink_to_fit();
        self.entries.shrink_to_fit();
        self.topics.shrink_to_fit();
    }

    /// The messages, oldest first, to be sent: those sent before under
    /// their packet id and DUP, the others with none (given as they go
    /// out). Their payloads share one buffer.
    pub(crate) fn into_publishes(self) -> Vec<Publish> {
        let payloads = Bytes::from(self.payloads);
        let mut at = 0;
        self.entries
            .iter()
            .map(|e| {
                let len = e.len as usize;
                at += len;
                Publish {
                    dup: e.pkid != 0,
                    qos: QoS::AtLeastOnce,
                    pkid: e.pkid,
                    retain: false,
                    topic: self.topics[e.topic as usize].clone(),
                    payload: payloads.slice(at - len..at),
                }
            })
            .collect()
    }
}

/// What a client's session holds while it is away.
#[derive(Debug)]
pub(crate) struct Saved {
    /// Its subscriptions and their QoS.
    pub(crate) filters: Vec<(Filter, QoS)>,
    /// QoS 1 deliveries to send again, oldest first.
    pub(crate) messages: Kept,
    /// The gateway's tags of the messages sent under these packet ids
    /// (`DirectPublish::tag`), given back with them on resume.
    pub(crate) tags: Vec<(u16, u64)>,
    /// Its expiry, from the end of its connection.
    expiry: Duration,
    ends: Instant,
}

/// Why a message was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeftOut {
    /// Its session is full ([`MAX_MESSAGES`], [`MAX_BYTES`]).
    SessionFull,
    /// All sessions together hold their most bytes.
    AllFull,
}

/// The WARN that all sessions are full: the first at once, then at most
/// one every [`WARN_EVERY`], with what was left out since the last.
#[derive(Debug, Default)]
struct FullWarning {
    said: Option<Instant>,
    /// Messages left out since the last line.
    unsaid: u64,
    /// Whose message was left out last.
    client_id: String,
}

/// Every saved session, by client id.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    saved: HashMap<String, Saved>,
    max: usize,
    /// What all sessions' messages may cost together ([`cost`]).
    max_bytes: usize,
    /// What they cost now.
    bytes: usize,
    /// Messages left out by a session's own bound, ever.
    pub(crate) dropped: u64,
    /// Messages left out because all sessions were full, ever.
    pub(crate) over_budget: u64,
    full: FullWarning,
}

impl Sessions {
    /// At most `max` sessions, whose messages cost at most `max_bytes`
    /// together.
    pub(crate) fn new(max: usize, max_bytes: usize) -> Sessions {
        Sessions {
            saved: HashMap::new(),
            max,
            max_bytes,
            ..Default::default()
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.saved.len()
    }

    /// What all kept messages cost now ([`cost`]).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Saves `client_id`'s session for `expiry` from `now`, with its
    /// filters and the deliveries to send again (in order).
    /// Keeps the tags of the messages the saved session of `client_id`
    /// holds under these packet ids (see [`Saved::tags`]).
    pub(crate) fn tag(&mut self, client_id: &str, tags: Vec<(u16, u64)>) {
        if let Some(saved) = self.saved.get_mut(client_id) {
            saved.tags = tags;
        }
    }

    pub(crate) fn save(
        &mut self,
        client_id: &str,
        filters: Vec<(Filter, QoS)>,
        messages: impl IntoIterator<Item = Publish>,
        expiry: Duration,
        now: Instant,
    ) {
        if self.max == 0 || expiry.is_zero() {
            return;
        }
        if let Some(old) = self.saved.remove(client_id) {
            self.freed(&old);
        } else if self.saved.len() >= self.max {
            self.evict_nearest_end();
        }
        let mut saved = Saved {
            filters,
            messages: Kept::default(),
            tags: Vec::new(),
            expiry,
            ends: now + expiry,
        };
        // Kept within the session's own bound first, then cut to what all
        // sessions have room for (the newest left out first).
        let mut session_full = 0;
        // Those in flight carry the packet id they were sent under; those
        // queued behind them, none.
        for publish in messages {
            if saved.messages.push(&publish, usize::MAX).is_err() {
                session_full += 1;
            }
        }
        saved.messages.shrink();
        let all_full = saved
            .messages
            .keep_within(self.max_bytes.saturating_sub(self.bytes));
        self.bytes += saved.messages.cost();
        self.left_out(client_id, session_full);
        self.all_full(client_id, all_full, now);
        self.saved.insert(client_id.to_owned(), saved);
        self.gauge();
    }

    /// The session of `client_id`, taken to be resumed: none if it has none
    /// or it ended before `now`.
    pub(crate) fn take(&mut self, client_id: &str, now: Instant) -> Option<Saved> {
        let saved = self.saved.remove(client_id)?;
        self.freed(&saved);
        self.gauge();
        (saved.ends > now).then_some(saved)
    }

    /// Forgets `client_id`'s session (a clean session or clean start).
    pub(crate) fn discard(&mut self, client_id: &str) {
        if let Some(saved) = self.saved.remove(client_id) {
            self.freed(&saved);
            self.gauge();
        }
    }

    /// A QoS 1 delivery for a client that is away: kept in its session if
    /// it has one with a subscription matching `topic` (true), else not.
    pub(crate) fn queue(
        &mut self,
        client_id: &str,
        topic: &str,
        publish: Publish,
        now: Instant,
    ) -> bool {
        let room = self.max_bytes.saturating_sub(self.bytes);
        let Some(saved) = self.saved.get_mut(client_id) else {
            return false;
        };
        let subscribed = saved
            .filters
            .iter()
            .any(|(f, qos)| *qos != QoS::AtMostOnce && crate::protocol::matches(topic, f));
        if !subscribed {
            return false;
        }
        // Never sent: a new packet id when it is.
        let publish = Publish { pkid: 0, ..publish };
        match saved.messages.push(&publish, room) {
            Ok(added) => {
                self.bytes += added;
                self.gauge();
            }
            Err(LeftOut::SessionFull) => self.left_out(client_id, 1),
            Err(LeftOut::AllFull) => self.all_full(client_id, 1, now),
        }
        true
    }

    /// Frees the sessions that ended by `now`; how many.
    pub(crate) fn sweep(&mut self, now: Instant) -> usize {
        let before = self.saved.len();
        let mut freed_bytes = 0;
        self.saved.retain(|_, s| {
            let keep = s.ends > now;
            if !keep {
                freed_bytes += s.messages.cost();
            }
            keep
        });
        self.bytes -= freed_bytes;
        let freed = before - self.saved.len();
        if freed > 0 {
            self.gauge();
            info!(
                event = "sessions_expired",
                freed,
                kept = self.saved.len(),
                "sessions past their expiry freed"
            );
        }
        self.all_full("", 0, now);
        freed
    }

    fn freed(&mut self, saved: &Saved) {
        self.bytes -= saved.messages.cost();
    }

    fn gauge(&self) {
        crate::counters::SESSION_BYTES.store(self.bytes as u64, Ordering::Relaxed);
    }

    fn evict_nearest_end(&mut self) {
        let nearest = self
            .saved
            .iter()
            .min_by_key(|(_, s)| s.ends)
            .map(|(id, s)| (id.clone(), s.expiry));
        if let Some((id, expiry)) = nearest {
            if let Some(saved) = self.saved.remove(&id) {
                self.freed(&saved);
            }
            info!(
                event = "session_evicted",
                client_id = %Clip(&id),
                expiry_s = expiry.as_secs(),
                max = self.max,
                "the most sessions are kept; the one nearest its end freed early"
            );
        }
    }

    fn left_out(&mut self, client_id: &str, count: usize) {
        if count == 0 {
            return;
        }
        self.dropped += count as u64;
        crate::counters::SESSION_MESSAGES_DROPPED.fetch_add(count as u64, Ordering::Relaxed);
        info!(
            event = "session_messages_left_out",
            client_id = %Clip(client_id),
            count,
            max_messages = MAX_MESSAGES,
            max_bytes = MAX_BYTES,
            "a session is full: deliveries left out (the protocol sends them again)"
        );
    }

    /// Counts `count` messages of `client_id` left out because all
    /// sessions are full, and says so within [`WARN_EVERY`]'s budget (also
    /// with none, to say what was left unsaid once the minute is over).
    fn all_full(&mut self, client_id: &str, count: usize, now: Instant) {
        if count > 0 {
            self.over_budget += count as u64;
            crate::counters::SESSION_MESSAGES_OVER_BUDGET
                .fetch_add(count as u64, Ordering::Relaxed);
            self.full.unsaid += count as u64;
            self.full.client_id = client_id.to_owned();
        }
        let due = self
            .full
            .said
            .map_or(true, |said| now.duration_since(said) >= WARN_EVERY);
        if self.full.unsaid == 0 || !due {
            return;
        }
        warn!(
            event = "sessions_full",
            left_out = self.full.unsaid,
            last_client_id = %Clip(&self.full.client_id),
            kept_bytes = self.bytes,
            max_bytes = self.max_bytes,
            sessions = self.saved.len(),
            "all sessions together hold their most bytes (south.max_session_bytes): deliveries left out (the protocol sends them again)"
        );
        self.full.said = Some(now);
        self.full.unsaid = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(n: usize) -> Publish {
        let mut p = Publish::new("devices/a/ack", "x", false);
        p.qos = QoS::AtLeastOnce;
        p.pkid = n as u16;
        p
    }

    fn filters() -> Vec<(Filter, QoS)> {
        vec![("devices/a/ack".to_owned(), QoS::AtLeastOnce)]
    }

    #[test]
    fn a_session_is_resumed_before_its_end_and_gone_after_it() {
        let now = Instant::now();
        let mut s = Sessions::new(10, usize::MAX);
        s.save("a", filters(), [publish(1)], Duration::from_secs(60), now);
        let saved = s.take("a", now + Duration::from_secs(59)).unwrap();
        assert_eq!(saved.filters, filters());
        assert!(saved.messages.into_publishes()[0].dup);
        s.save("a", filters(), [], Duration::from_secs(60), now);
        assert!(s.take("a", now + Duration::from_secs(60)).is_none());
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_sweep_frees_what_ended_and_keeps_the_rest() {
        let now = Instant::now();
        let mut s = Sessions::new(10, usize::MAX);
        s.save("a", filters(), [], Duration::from_secs(10), now);
        s.save("b", filters(), [], Duration::from_secs(100), now);
        assert_eq!(s.sweep(now + Duration::from_secs(11)), 1);
        assert!(s.take("b", now + Duration::from_secs(11)).is_some());
    }

    #[test]
    fn past_the_most_sessions_the_one_nearest_its_end_goes_first() {
        let now = Instant::now();
        let mut s = Sessions::new(2, usize::MAX);
        s.save("a", filters(), [], Duration::from_secs(100), now);
        s.save("b", filters(), [], Duration::from_secs(10), now);
        s.save("c", filters(), [], Duration::from_secs(50), now);
        assert_eq!(s.len(), 2);
        assert!(s.take("b", now).is_none());
        assert!(s.take("a", now).is_some() && s.take("c", now).is_some());
    }

    #[test]
    fn a_session_keeps_at_most_its_bound_and_counts_what_it_left_out() {
        let now = Instant::now();
        let mut s = Sessions::new(2, usize::MAX);
        s.save(
            "a",
            filters(),
            (0..MAX_MESSAGES + 5).map(publish),
            Duration::from_secs(60),
            now,
        );
        assert_eq!(s.dropped, 5);
        assert!(!s.queue("a", "devices/a/ack", publish(0), now) || s.dropped == 6);
        assert_eq!(s.take("a", now).unwrap().messages.len(), MAX_MESSAGES);
    }

    #[test]
    fn a_delivery_for_an_away_client_is_kept_only_where_it_subscribed() {
        let now = Instant::now();
        let mut s = Sessions::new(2, usize::MAX);
        s.save("a", filters(), [], Duration::from_secs(60), now);
        assert!(s.queue("a", "devices/a/ack", publish(1), now));
        assert!(!s.queue("a", "devices/a/inbox", publish(2), now));
        assert!(!s.queue("b", "devices/b/ack", publish(3), now));
        let kept = s.take("a", now).unwrap().messages.into_publishes();
        assert_eq!(kept.len(), 1);
        assert!(!kept[0].dup, "never sent: no DUP");
    }

    #[test]
    fn no_session_is_kept_without_an_expiry_or_room() {
        let now = Instant::now();
        let mut s = Sessions::new(0, usize::MAX);
        s.save("a", filters(), [], Duration::from_secs(60), now);
        let mut t = Sessions::new(4, usize::MAX);
        t.save("a", filters(), [], Duration::ZERO, now);
        assert_eq!((s.len(), t.len()), (0, 0));
    }

    fn sized(topic: &str, len: usize) -> Publish {
        let mut p = Publish::new(
            Bytes::copy_from_slice(topic.as_bytes()),
            Bytes::from(vec![b'x'; len]),
            false,
        );
        p.qos = QoS::AtLeastOnce;
        p
    }

    #[test]
    fn the_cost_is_what_the_allocator_holds() {
        assert_eq!(allocated(1), 32);
        assert_eq!(allocated(24), 32);
        assert_eq!(allocated(25), 48);
        assert_eq!(allocated(0), 0);
        let mut kept = Kept::default();
        kept.push(&sized("devices/a/ack", 100), usize::MAX).unwrap();
        kept.shrink();
        // Its payload, its 8-byte entry, its topic and the topic's slot.
        assert_eq!(kept.cost(), 112 + 32 + 32 + 48);
    }

    #[test]
    fn kept_messages_come_back_in_order_with_their_topics_and_payloads() {
        let mut kept = Kept::default();
        for (i, topic) in ["devices/a/ack", "devices/a/inbox", "devices/a/ack"]
            .iter()
            .enumerate()
        {
            let mut p = sized(topic, 0);
            p.payload = Bytes::from(format!("m{i}"));
            kept.push(&p, usize::MAX).unwrap();
        }
        assert_eq!(kept.topics.len(), 2, "each topic once");
        let back: Vec<_> = kept
            .into_publishes()
            .into_iter()
            .map(|p| (p.topic, p.payload, p.dup, p.qos))
            .collect();
        let want = |t: &'static str, m: &'static str| {
            (Bytes::from(t), Bytes::from(m), false, QoS::AtLeastOnce)
        };
        assert_eq!(
            back,
            vec![
                want("devices/a/ack", "m0"),
                want("devices/a/inbox", "m1"),
                want("devices/a/ack", "m2"),
            ]
        );
    }

    #[test]
    fn a_kept_payload_is_a_copy_that_pins_no_buffer_of_the_delivery() {
        let now = Instant::now();
        let mut s = Sessions::new(2, usize::MAX);
        // Payloads that are slices of one 64 KiB buffer: kept as they are,
        // each would hold all of it.
        let buffer = Bytes::from(vec![b'y'; 64 << 10]);
        let messages = (0..3).map(|i| {
            let mut p = sized("devices/a/ack", 0);
            p.payload = buffer.slice(i * 100..i * 100 + 100);
            p
        });
        s.save("a", filters(), messages, Duration::from_secs(60), now);
        assert_eq!(s.bytes(), allocated(300) + 32 + 32 + 48);
        let within = |b: &Bytes| {
            let start = buffer.as_ptr() as usize;
            (start..start + buffer.len()).contains(&(b.as_ptr() as usize))
        };
        let saved = s.take("a", now).unwrap();
        assert!(saved
            .messages
            .into_publishes()
            .iter()
            .all(|p| !within(&p.payload)));
        assert_eq!(s.bytes(), 0, "a session taken is no longer counted");
    }

    #[test]
    fn a_session_bound_in_bytes_counts_what_messages_cost_not_their_length() {
        let now = Instant::now();
        let mut s = Sessions::new(2, usize::MAX);
        // 1,023-byte payloads: 256 of them are under 256 KiB by length;
        // with their allocation, entries and topic, 254 fit.
        s.save(
            "a",
            filters(),
            (0..MAX_MESSAGES).map(|_| sized("devices/a/ack", 1023)),
            Duration::from_secs(60),
            now,
        );
        let kept = s.take("a", now).unwrap().messages.len();
        assert_eq!(kept, 254);
        assert_eq!(s.dropped, 2);
        // Queued one by one, the buffers grow by doubling until that would
        // pass the bound, then to what is needed: the same messages fit.
        s.save("b", filters(), [], Duration::from_secs(60), now);
        let queued = (0..MAX_MESSAGES)
            .filter(|_| {
                s.queue("b", "devices/a/ack", sized("devices/a/ack", 1023), now);
                true
            })
            .count();
        assert_eq!(queued, MAX_MESSAGES);
        assert!(s.bytes() <= MAX_BYTES, "{}", s.bytes());
        assert_eq!(s.take("b", now).unwrap().messages.len(), 254);
    }

    #[test]
    fn past_the_bound_of_all_sessions_messages_are_left_out_counted_and_room_comes_back() {
        let now = Instant::now();
        let mut probe = Kept::default();
        for _ in 0..10 {
            probe
                .push(&sized("devices/a/ack", 100), usize::MAX)
                .unwrap();
        }
        probe.shrink();
        let budget = probe.cost();
        let mut s = Sessions::new(10, budget);
        let ten = || (0..10).map(|_| sized("devices/a/ack", 100));
        s.save("a", filters(), ten(), Duration::from_secs(60), now);
        assert_eq!(s.bytes(), budget);
        let b_filters = vec![("devices/b/ack".to_owned(), QoS::AtLeastOnce)];
        s.save("b", b_filters, [], Duration::from_secs(60), now);
        assert!(s.queue("b", "devices/b/ack", sized("devices/b/ack", 100), now));
        assert_eq!((s.over_budget, s.dropped), (1, 0));
        let b = s.take("b", now).unwrap();
        assert!(
            b.messages.is_empty() && !b.filters.is_empty(),
            "its subscriptions are kept"
        );
        s.discard("a");
        assert_eq!(s.bytes(), 0);
        s.save("a", filters(), ten(), Duration::from_secs(60), now);
        assert_eq!(s.take("a", now).unwrap().messages.len(), 10);
        assert_eq!(s.over_budget, 1);
    }

    #[test]
    fn the_sessions_full_warning_is_said_at_most_once_a_minute_with_what_it_left_unsaid() {
        let now = Instant::now();
        let mut s = Sessions::new(10, 0);
        s.save(
            "a",
            filters(),
            (0..3).map(publish),
            Duration::from_secs(600),
            now,
        );
        assert_eq!((s.over_budget, s.full.unsaid), (3, 0), "said at once");
        s.queue(
            "a",
            "devices/a/ack",
            publish(4),
            now + Duration::from_secs(1),
        );
        assert_eq!(s.full.unsaid, 1, "within the minute: counted, not said");
        s.sweep(now + Duration::from_secs(61));
        assert_eq!(
            (s.over_budget, s.full.unsaid),
            (4, 0),
            "said once the minute is over"
        );
    }

    #[test]
    fn an_expired_or_evicted_session_gives_its_bytes_back() {
        let now = Instant::now();
        let mut s = Sessions::new(1, usize::MAX);
        s.save(
            "a",
            filters(),
            (0..4).map(publish),
            Duration::from_secs(10),
            now,
        );
        assert!(s.bytes() > 0);
        s.sweep(now + Duration::from_secs(11));
        assert_eq!(s.bytes(), 0);
        s.save(
            "a",
            filters(),
            (0..4).map(publish),
            Duration::from_secs(10),
            now,
        );
        s.save("b", filters(), [], Duration::from_secs(10), now);
        assert_eq!((s.len(), s.bytes()), (1, 0), "a was evicted for b");
    }
}
