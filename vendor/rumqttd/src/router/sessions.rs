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
//! clients come and go and on the router's own tick); at most `max`
//! sessions are kept (past it, the one nearest its end is freed first); a
//! session keeps at most [`MAX_MESSAGES`] messages and [`MAX_BYTES`] of
//! them. What a bound leaves out is counted and said, never silent: the
//! gateway's protocol repairs it (a device sends again what got no
//! receipt; an inbox batch is sent again until it is confirmed).
//! Nothing is kept across a restart of the broker.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use tracing::info;

use crate::protocol::{Publish, QoS};
use crate::refusals::Clip;
use crate::Filter;

/// Messages one session keeps for its client, at most.
pub(crate) const MAX_MESSAGES: usize = 256;
/// Bytes of topic and payload one session keeps, at most.
pub(crate) const MAX_BYTES: usize = 256 << 10;

/// What a client's session holds while it is away.
#[derive(Debug)]
pub(crate) struct Saved {
    /// Its subscriptions and their QoS.
    pub(crate) filters: Vec<(Filter, QoS)>,
    /// QoS 1 deliveries to send again, oldest first.
    pub(crate) messages: VecDeque<Publish>,
    bytes: usize,
    /// Its expiry, from the end of its connection.
    expiry: Duration,
    ends: Instant,
}

impl Saved {
    /// Keeps `publish` if there is room; false if not.
    fn keep(&mut self, publish: Publish) -> bool {
        let size = publish.topic.len() + publish.payload.len();
        if self.messages.len() >= MAX_MESSAGES || self.bytes + size > MAX_BYTES {
            return false;
        }
        self.bytes += size;
        self.messages.push_back(publish);
        true
    }
}

/// Every saved session, by client id.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    saved: HashMap<String, Saved>,
    max: usize,
    /// Messages left out by a bound, ever.
    pub(crate) dropped: u64,
}

impl Sessions {
    pub(crate) fn new(max: usize) -> Sessions {
        Sessions {
            saved: HashMap::new(),
            max,
            dropped: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.saved.len()
    }

    /// Saves `client_id`'s session for `expiry` from `now`, with its
    /// filters and the deliveries to send again (in order).
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
        if !self.saved.contains_key(client_id) && self.saved.len() >= self.max {
            self.evict_nearest_end();
        }
        let mut saved = Saved {
            filters,
            messages: VecDeque::new(),
            bytes: 0,
            expiry,
            ends: now + expiry,
        };
        let mut left_out = 0;
        for mut publish in messages {
            publish.dup = true;
            if !saved.keep(publish) {
                left_out += 1;
            }
        }
        self.left_out(client_id, left_out);
        self.saved.insert(client_id.to_owned(), saved);
    }

    /// The session of `client_id`, taken to be resumed: none if it has none
    /// or it ended before `now`.
    pub(crate) fn take(&mut self, client_id: &str, now: Instant) -> Option<Saved> {
        let saved = self.saved.remove(client_id)?;
        (saved.ends > now).then_some(saved)
    }

    /// Forgets `client_id`'s session (a clean session or clean start).
    pub(crate) fn discard(&mut self, client_id: &str) {
        self.saved.remove(client_id);
    }

    /// A QoS 1 delivery for a client that is away: kept in its session if
    /// it has one with a subscription matching `topic` (true), else not.
    pub(crate) fn queue(&mut self, client_id: &str, topic: &str, mut publish: Publish) -> bool {
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
        publish.qos = QoS::AtLeastOnce;
        if !saved.keep(publish) {
            self.left_out(client_id, 1);
        }
        true
    }

    /// Frees the sessions that ended by `now`; how many.
    pub(crate) fn sweep(&mut self, now: Instant) -> usize {
        let before = self.saved.len();
        self.saved.retain(|_, s| s.ends > now);
        let freed = before - self.saved.len();
        if freed > 0 {
            info!(
                event = "sessions_expired",
                freed,
                kept = self.saved.len(),
                "sessions past their expiry freed"
            );
        }
        freed
    }

    fn evict_nearest_end(&mut self) {
        let nearest = self
            .saved
            .iter()
            .min_by_key(|(_, s)| s.ends)
            .map(|(id, s)| (id.clone(), s.expiry));
        if let Some((id, expiry)) = nearest {
            self.saved.remove(&id);
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
        crate::counters::SESSION_MESSAGES_DROPPED
            .fetch_add(count as u64, std::sync::atomic::Ordering::Relaxed);
        info!(
            event = "session_messages_left_out",
            client_id = %Clip(client_id),
            count,
            max_messages = MAX_MESSAGES,
            max_bytes = MAX_BYTES,
            "a session is full: deliveries left out (the protocol sends them again)"
        );
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
        let mut s = Sessions::new(10);
        s.save("a", filters(), [publish(1)], Duration::from_secs(60), now);
        let saved = s.take("a", now + Duration::from_secs(59)).unwrap();
        assert_eq!(saved.filters, filters());
        assert!(saved.messages[0].dup);
        s.save("a", filters(), [], Duration::from_secs(60), now);
        assert!(s.take("a", now + Duration::from_secs(60)).is_none());
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_sweep_frees_what_ended_and_keeps_the_rest() {
        let now = Instant::now();
        let mut s = Sessions::new(10);
        s.save("a", filters(), [], Duration::from_secs(10), now);
        s.save("b", filters(), [], Duration::from_secs(100), now);
        assert_eq!(s.sweep(now + Duration::from_secs(11)), 1);
        assert!(s.take("b", now + Duration::from_secs(11)).is_some());
    }

    #[test]
    fn past_the_most_sessions_the_one_nearest_its_end_goes_first() {
        let now = Instant::now();
        let mut s = Sessions::new(2);
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
        let mut s = Sessions::new(2);
        s.save(
            "a",
            filters(),
            (0..MAX_MESSAGES + 5).map(publish),
            Duration::from_secs(60),
            now,
        );
        assert_eq!(s.dropped, 5);
        assert!(!s.queue("a", "devices/a/ack", publish(0)) || s.dropped == 6);
        assert_eq!(s.take("a", now).unwrap().messages.len(), MAX_MESSAGES);
    }

    #[test]
    fn a_delivery_for_an_away_client_is_kept_only_where_it_subscribed() {
        let now = Instant::now();
        let mut s = Sessions::new(2);
        s.save("a", filters(), [], Duration::from_secs(60), now);
        assert!(s.queue("a", "devices/a/ack", publish(1)));
        assert!(!s.queue("a", "devices/a/inbox", publish(2)));
        assert!(!s.queue("b", "devices/b/ack", publish(3)));
        assert_eq!(s.take("a", now).unwrap().messages.len(), 1);
    }

    #[test]
    fn no_session_is_kept_without_an_expiry_or_room() {
        let now = Instant::now();
        let mut s = Sessions::new(0);
        s.save("a", filters(), [], Duration::from_secs(60), now);
        let mut t = Sessions::new(4);
        t.save("a", filters(), [], Duration::ZERO, now);
        assert_eq!((s.len(), t.len()), (0, 0));
    }
}
