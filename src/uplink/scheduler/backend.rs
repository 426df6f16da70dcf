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

use tokio::time::Instant;

/// When the backend was last heard from, and since when it is silent.
#[derive(Debug, Default)]
pub(super) struct Backend {
    last_heard: Option<Instant>,
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
