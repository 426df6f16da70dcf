//! The rule that leaves a node which takes the session but moves nothing:
//! a broker (an overloaded or half-partitioned cluster node) that
//! CONNACKs, SUBACKs and answers pings, but acknowledges none of the
//! session's publishes. Absent is not broken, and stalled is not up: such
//! a link is a failure to name and leave, never a silent wait. Pure: the
//! poller (`poll.rs`) says what each event of the link was; this type
//! says when the link counts as stalled, and the poller then cuts it.
//!
//! What must always hold:
//! - the clock runs only while publishes wait for their PUBACK
//!   (`outstanding` > 0): an idle link, or one whose every publish is
//!   acknowledged, is never stalled;
//! - progress is any acknowledgement of any outstanding publish, not one
//!   message's latency: a node that acknowledges slowly but steadily (one
//!   PUBACK within every `bound`) is kept, however long the last publish
//!   of a burst waits;
//! - a publish received from the broker is progress too: the PUBACK may
//!   be queued behind what the broker sends (a kept session's backlog),
//!   and the poller, not the broker, sets the pace at which that is read
//!   (it reports the publish once it has room for it, so its own wait is
//!   never held against the broker);
//! - pings and their answers are not progress: a node that answers them
//!   and nothing else is what this rule is for (any packet is still a
//!   sign of *life*, which is another rule, `poll.rs`'s);
//! - with publishes outstanding and no progress for `bound`, the link is
//!   stalled.

use std::time::Duration;

use tokio::time::Instant;

/// What one event of the link says about movement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The broker acknowledged one of the session's publishes.
    Acknowledged,
    /// A publish from the broker was taken.
    Received,
    /// Nothing moved (a ping, a SUBACK, one of the session's own writes).
    Nothing,
}

/// How long a node may take the session and move nothing.
#[derive(Debug)]
pub struct Stall {
    bound: Duration,
    /// Since when publishes wait with no progress; `None` when none wait.
    since: Option<Instant>,
}

/// A stalled link: what it says, for the log and the failure's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stalled {
    /// How long publishes waited with no progress.
    pub waited: Duration,
    /// Publishes waiting for their PUBACK.
    pub outstanding: usize,
}

impl Stall {
    pub fn new(bound: Duration) -> Stall {
        Stall { bound, since: None }
    }

    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// One event, after which `outstanding` publishes wait for a PUBACK.
    pub fn saw(&mut self, progress: Progress, outstanding: usize, now: Instant) {
        self.since = match (outstanding, progress, self.since) {
            (0, _, _) => None,
            (_, Progress::Nothing, Some(since)) => Some(since),
            // The first publish to wait, or progress: the clock starts again.
            _ => Some(now),
        };
    }

    /// The connection ended: nothing waits on it any more.
    pub fn reset(&mut self) {
        self.since = None;
    }

    /// When the link counts as stalled, if publishes wait.
    pub fn deadline(&self) -> Option<Instant> {
        self.since.map(|since| since + self.bound)
    }

    /// Whether the link is stalled at `now`, with `outstanding` waiting.
    pub fn stalled(&self, outstanding: usize, now: Instant) -> Option<Stalled> {
        let since = self.since?;
        let waited = now.saturating_duration_since(since);
        (outstanding > 0 && waited >= self.bound).then_some(Stalled {
            waited,
            outstanding,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(10);
    const SEC: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn publishes_that_wait_with_no_progress_for_the_bound_are_a_stall() {
        let mut s = Stall::new(BOUND);
        let t0 = Instant::now();
        s.saw(Progress::Nothing, 1, t0);
        assert_eq!(s.deadline(), Some(t0 + BOUND));
        // More writes, pings, a SUBACK: nothing moved.
        s.saw(Progress::Nothing, 3, t0 + 4 * SEC);
        s.saw(Progress::Nothing, 3, t0 + 9 * SEC);
        assert_eq!(s.deadline(), Some(t0 + BOUND));
        assert_eq!(s.stalled(3, t0 + 9 * SEC), None);
        assert_eq!(
            s.stalled(3, t0 + BOUND),
            Some(Stalled {
                waited: BOUND,
                outstanding: 3
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_puback_within_every_bound_keeps_the_link_however_long_each_waits() {
        let mut s = Stall::new(BOUND);
        let t0 = Instant::now();
        s.saw(Progress::Nothing, 5, t0);
        // One PUBACK every 8 s: the fifth publish waits 40 s, four bounds.
        let mut now = t0;
        for left in (0..5).rev() {
            now += 8 * SEC;
            assert_eq!(s.stalled(left + 1, now), None, "{left} left");
            s.saw(Progress::Acknowledged, left, now);
        }
        assert_eq!(s.deadline(), None, "nothing waits");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_link_is_never_stalled() {
        let mut s = Stall::new(BOUND);
        let t0 = Instant::now();
        for n in 0..100u32 {
            s.saw(Progress::Nothing, 0, t0 + SEC * n * 30);
        }
        assert_eq!(s.deadline(), None);
        assert_eq!(s.stalled(0, t0 + 3600 * SEC), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_from_the_broker_is_progress_its_puback_may_wait_behind_it() {
        let mut s = Stall::new(BOUND);
        let t0 = Instant::now();
        s.saw(Progress::Nothing, 1, t0);
        s.saw(Progress::Received, 1, t0 + 9 * SEC);
        assert_eq!(s.deadline(), Some(t0 + 9 * SEC + BOUND));
        s.reset();
        assert_eq!(s.deadline(), None, "a new connection starts clean");
    }
}
