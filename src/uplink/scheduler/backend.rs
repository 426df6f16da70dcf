//! What the scheduler knows of the backend application behind the
//! upstream broker: whether it showed life while a message waited for its
//! ack (docs/PROTOCOL.md, "North", "An absent backend").
//!
//! The upstream broker's PUBACK proves only that the broker has the
//! message; whether a backend is subscribed is seen only in its acks. So an
//! ack timeout is a failed attempt only if the backend acked something
//! (anything of this gateway's, ok or nack) since the message was sent —
//! since its first send whose timeout did not count, if there were such:
//! then it was there and did not take this one. Without such a sign the
//! backend is away, like a link that is down: the message waits and is
//! sent again, uncounted, with the retry backoff. (Measured from the first
//! unanswered send, a message the backend ignores is counted even when
//! nothing else of its device is in flight beside it.)
//!
//! "Acked something since" means a verdict on a message *sent* after this
//! one (in a later round): then the backend took what came after it and not it. A
//! backend that is there but behind (still working through what was sent
//! before, in order) acks only older messages; this one is not counted
//! then, and waits with the retry backoff until the backend reaches it.

use tokio::time::Instant;

/// When the backend was last heard from, and since when it is silent.
#[derive(Debug, Default)]
pub(super) struct Backend {
    last_heard: Option<Instant>,
    /// The latest (first unanswered) send among the messages the backend
    /// gave a verdict on.
    answered_upto: Option<Instant>,
    /// Set at the first ack timeout with no sign of the backend since the
    /// message was sent; cleared when it is heard from again.
    silent_since: Option<Instant>,
}

impl Backend {
    /// The backend sent an ack message. True if that ends a silence.
    pub(super) fn heard(&mut self, now: Instant) -> bool {
        self.last_heard = Some(now);
        self.silent_since.take().is_some()
    }

    /// Whether the backend showed life at or after `sent`: the ack timeout
    /// of a message sent then is a failed attempt.
    pub(super) fn heard_since(&self, sent: Instant) -> bool {
        self.last_heard.is_some_and(|at| at >= sent)
    }

    /// The backend gave a verdict on a message first sent at `sent`.
    pub(super) fn answered(&mut self, sent: Instant) {
        self.answered_upto = self.answered_upto.max(Some(sent));
    }

    /// Whether the backend gave a verdict on a message sent after `sent`
    /// (in a later round: those sent together share their instant and may
    /// be answered in any order): if not, it is behind (or away), and
    /// skipped nothing.
    pub(super) fn answered_since(&self, sent: Instant) -> bool {
        self.answered_upto.is_some_and(|at| at > sent)
    }

    /// A message's ack timeout passed with no sign of the backend.
    pub(super) fn silent(&mut self, now: Instant) {
        self.silent_since.get_or_insert(now);
    }

    pub(super) fn silent_since(&self) -> Option<Instant> {
        self.silent_since
    }

    /// Whether the backend is away: an ack timeout found it silent, and it
    /// has not been heard from since. (Until a first such timeout ferry
    /// takes it to be there.)
    pub(super) fn absent(&self) -> bool {
        self.silent_since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_an_ack_at_or_after_the_send_shows_the_backend_there() {
        let t0 = Instant::now();
        let mut b = Backend::default();
        assert!(!b.heard_since(t0), "never heard from");
        b.heard(t0);
        assert!(b.heard_since(t0));
        assert!(!b.heard_since(t0 + Duration::from_millis(1)));
    }

    #[test]
    fn only_a_verdict_on_a_message_sent_later_shows_it_skipped_one() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(1);
        let mut b = Backend::default();
        assert!(!b.answered_since(t0));
        b.answered(t0);
        b.heard(later);
        // Heard just now, but only about older sends: behind, not past it.
        assert!(b.heard_since(later) && !b.answered_since(later));
        b.answered(later);
        b.answered(t0);
        assert!(
            !b.answered_since(later),
            "sent together: no order between them"
        );
        assert!(b.answered_since(t0), "the latest send answered counts");
    }

    #[test]
    fn a_silence_starts_once_and_ends_at_the_next_ack() {
        let t0 = Instant::now();
        let mut b = Backend::default();
        b.silent(t0);
        b.silent(t0 + Duration::from_secs(5));
        assert_eq!(b.silent_since(), Some(t0), "the first timeout starts it");
        assert!(b.heard(t0 + Duration::from_secs(6)), "the ack ends it");
        assert_eq!(b.silent_since(), None);
        assert!(!b.heard(t0 + Duration::from_secs(7)), "no silence to end");
    }
}
