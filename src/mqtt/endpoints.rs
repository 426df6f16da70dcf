//! Which of a broker's nodes the session connects to next. Pure: the
//! session tells it what happened to each connection, it answers where to
//! go and when to look back at the first.
//!
//! What must always hold:
//! - one node at a time: a move is only ever decided after the connection
//!   it leaves is gone (or being closed);
//! - a failed connection, or a drop, moves to the next node in the list
//!   (wrapping), behind the session's reconnect backoff;
//! - with `prefer_first`, while up on a later node, the first is checked
//!   every interval; once it accepts, the session leaves for it. A return
//!   that does not hold (no connection, or one that drops within the
//!   interval) doubles the interval, up to [`MAX_CHECK_DOUBLINGS`]
//!   doublings, so a flapping first node never makes the session drop a
//!   working link at the check rate; a return that holds resets it. A
//!   return that ends with the first node stalled (it took the session and
//!   moved nothing, `stall.rs`) never held, however long it lasted.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::Endpoint;

/// A check interval doubles at most this often (×32).
pub const MAX_CHECK_DOUBLINGS: u32 = 5;

/// Why the session moved to another node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The connection to the node before failed or dropped.
    Failover,
    /// The first node is back (`prefer_first`).
    FirstBack,
    /// The list changed (`systemctl reload`) without the node it was on.
    Config,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Failover => "failover",
            Reason::FirstBack => "first_back",
            Reason::Config => "config",
        }
    }
}

/// A connection that reached a node other than the last one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switched {
    pub from: usize,
    pub to: usize,
    pub reason: Reason,
}

/// A return to the first node, until it is known to hold.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Return {
    /// Left the later node; not connected to the first yet.
    Connecting,
    /// Connected to the first since then.
    Connected(Instant),
}

#[derive(Debug)]
pub struct Endpoints {
    list: Vec<Endpoint>,
    /// The node connected to, or the next one to try.
    current: usize,
    /// The node of the last connection, if there was one.
    last_connected: Option<usize>,
    /// Why `current` was chosen, if it was a move.
    reason: Option<Reason>,
    prefer_first: Option<Duration>,
    /// Returns to the first that did not hold, in a row.
    failed_returns: u32,
    returning: Option<Return>,
    /// When to check the first again (up on a later node only).
    next_check: Option<Instant>,
}

impl Endpoints {
    /// `list` must not be empty; `prefer_first` is the check interval.
    pub fn new(list: Vec<Endpoint>, prefer_first: Option<Duration>) -> Endpoints {
        assert!(!list.is_empty(), "a session needs at least one endpoint");
        Endpoints {
            list,
            current: 0,
            last_connected: None,
            reason: None,
            prefer_first,
            failed_returns: 0,
            returning: None,
            next_check: None,
        }
    }

    /// A new list (and check interval): the current node keeps its place
    /// in it, if it is there (true); otherwise the first of the new list is
    /// next. Either way what was known of returns to the first is dropped;
    /// up (at `now`) on a later node kept, the first is checked again from
    /// now.
    pub fn replace(
        &mut self,
        list: Vec<Endpoint>,
        prefer_first: Option<Duration>,
        up: Option<Instant>,
    ) -> bool {
        assert!(!list.is_empty(), "a session needs at least one endpoint");
        let at = |node: usize| list.iter().position(|e| *e == self.list[node]);
        let kept = at(self.current);
        let last_connected = self.last_connected.and_then(at);
        *self = Endpoints {
            current: kept.unwrap_or(0),
            last_connected,
            reason: kept.is_none().then_some(Reason::Config),
            ..Endpoints::new(list, prefer_first)
        };
        if let (Some(1..), Some(now)) = (kept, up) {
            self.up(now);
        }
        kept.is_some()
    }

    /// The node connected to, or the next one to try, and its place.
    pub fn current(&self) -> (usize, &Endpoint) {
        (self.current, &self.list[self.current])
    }

    pub fn get(&self, index: usize) -> &Endpoint {
        &self.list[index]
    }

    /// A connection to the current node was made; says so if it is not
    /// the node of the last one.
    pub fn connected(&mut self, now: Instant) -> Option<Switched> {
        if self.current == 0 && self.returning == Some(Return::Connecting) {
            self.returning = Some(Return::Connected(now));
        }
        let switched = match self.last_connected {
            Some(from) if from != self.current => Some(Switched {
                from,
                to: self.current,
                reason: self.reason.unwrap_or(Reason::Failover),
            }),
            _ => None,
        };
        self.last_connected = Some(self.current);
        self.reason = None;
        switched
    }

    /// The session is up on the current node: a later one starts the
    /// checks of the first.
    pub fn up(&mut self, now: Instant) {
        self.next_check = match self.current {
            0 => None,
            _ => self.check_interval().map(|every| now + every),
        };
    }

    /// The connection failed to come up, or dropped: the next node is
    /// tried (returned). A return to the first that did not hold counts.
    pub fn failed(&mut self, now: Instant) -> usize {
        self.settle_return(now);
        self.next_check = None;
        self.current = (self.current + 1) % self.list.len();
        self.reason = Some(Reason::Failover);
        self.current
    }

    /// The node took the session but moved nothing, and the session left
    /// it: a failure like [`Endpoints::failed`], and a return to the first
    /// that ends so did not hold, however long it lasted (the first takes
    /// TCP connections, so without this the checks would lead back to it
    /// at their every interval).
    pub fn stalled(&mut self, now: Instant) -> usize {
        if let Some(Return::Connected(_)) = self.returning {
            self.returning = Some(Return::Connecting);
        }
        self.failed(now)
    }

    /// The connection dropped for a reason of one message, not the node's:
    /// the same node is tried again.
    pub fn retry_same(&mut self, now: Instant) {
        self.settle_return(now);
        self.next_check = None;
    }

    /// When the first node is to be checked, if it is.
    pub fn check_at(&self) -> Option<Instant> {
        self.next_check
    }

    /// The result of a check of the first node. True: it accepts, and the
    /// session should leave for it (the current node becomes the first).
    pub fn checked(&mut self, accepts: bool, now: Instant) -> bool {
        if self.next_check.is_none() || self.current == 0 {
            // The link changed while the check ran.
            return false;
        }
        if !accepts {
            self.next_check = self.check_interval().map(|every| now + every);
            return false;
        }
        self.next_check = None;
        self.current = 0;
        self.reason = Some(Reason::FirstBack);
        self.returning = Some(Return::Connecting);
        true
    }

    /// The interval between checks of the first: `prefer_first`, doubled
    /// for every return that did not hold.
    pub fn check_interval(&self) -> Option<Duration> {
        let doublings = self.failed_returns.min(MAX_CHECK_DOUBLINGS);
        self.prefer_first.map(|every| every * 2u32.pow(doublings))
    }

    /// A connection ended: if it was a return to the first, did it hold?
    fn settle_return(&mut self, now: Instant) {
        let Some(state) = self.returning.take() else {
            return;
        };
        let held = match state {
            Return::Connecting => false,
            Return::Connected(at) => self
                .check_interval()
                .is_some_and(|every| now.saturating_duration_since(at) >= every),
        };
        self.failed_returns = if held {
            0
        } else {
            self.failed_returns.saturating_add(1)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHECK: Duration = Duration::from_secs(30);

    fn three(prefer_first: Option<Duration>) -> Endpoints {
        Endpoints::new(
            vec![
                Endpoint::new("a", 1883),
                Endpoint::new("b", 1883),
                Endpoint::new("c", 1883),
            ],
            prefer_first,
        )
    }

    #[test]
    fn a_new_list_keeps_the_node_it_names_and_starts_at_its_first_otherwise() {
        let now = Instant::now();
        let mut e = three(Some(CHECK));
        up_on_second(&mut e, now);
        let b_first = vec![Endpoint::new("x", 1883), Endpoint::new("b", 1883)];
        assert!(e.replace(b_first, Some(CHECK), Some(now)));
        assert_eq!(e.current(), (1, &Endpoint::new("b", 1883)));
        assert_eq!(e.check_at(), Some(now + CHECK), "x is checked from now");
        assert!(!e.replace(vec![Endpoint::new("y", 1)], None, Some(now)));
        assert_eq!(e.current(), (0, &Endpoint::new("y", 1)));
        assert_eq!(e.check_at(), None);
        assert_eq!(
            e.connected(now),
            None,
            "the node it was on is not in the list: no switch within it to report"
        );
    }

    /// Fails over from the first to the second and comes up there.
    fn up_on_second(e: &mut Endpoints, now: Instant) {
        e.connected(now);
        e.up(now);
        assert_eq!(e.failed(now), 1);
        assert_eq!(
            e.connected(now),
            Some(Switched {
                from: 0,
                to: 1,
                reason: Reason::Failover
            })
        );
        e.up(now);
    }

    #[test]
    fn each_failure_moves_to_the_next_node_and_wraps() {
        let mut e = three(None);
        let now = Instant::now();
        assert_eq!(e.current().0, 0);
        assert_eq!(e.failed(now), 1);
        assert_eq!(e.failed(now), 2);
        assert_eq!(e.failed(now), 0);
        assert_eq!(e.current().1, &Endpoint::new("a", 1883));
    }

    #[test]
    fn the_first_connection_and_a_reconnect_to_the_same_node_are_no_switch() {
        let mut e = Endpoints::new(vec![Endpoint::new("a", 1883)], Some(CHECK));
        let now = Instant::now();
        assert_eq!(e.connected(now), None);
        e.up(now);
        assert_eq!(e.check_at(), None, "no checks while on the first");
        assert_eq!(e.failed(now), 0);
        assert_eq!(e.connected(now), None);
    }

    #[test]
    fn a_drop_blamed_on_one_message_stays_on_the_node() {
        let mut e = three(None);
        let now = Instant::now();
        e.connected(now);
        e.retry_same(now);
        assert_eq!(e.current().0, 0);
        assert_eq!(e.connected(now), None);
    }

    #[test]
    fn without_prefer_first_a_later_node_is_kept() {
        let mut e = three(None);
        up_on_second(&mut e, Instant::now());
        assert_eq!(e.check_at(), None);
    }

    #[test]
    fn on_a_later_node_the_first_is_checked_every_interval_until_it_accepts() {
        let mut e = three(Some(CHECK));
        let t0 = Instant::now();
        up_on_second(&mut e, t0);
        assert_eq!(e.check_at(), Some(t0 + CHECK));
        let t1 = t0 + CHECK;
        assert!(!e.checked(false, t1), "still down: stay");
        assert_eq!(
            e.check_at(),
            Some(t1 + CHECK),
            "a refused check is no reason to wait longer"
        );
        let t2 = t1 + CHECK;
        assert!(e.checked(true, t2), "it accepts: leave for it");
        assert_eq!(e.current().0, 0);
        assert_eq!(e.check_at(), None);
        assert_eq!(
            e.connected(t2),
            Some(Switched {
                from: 1,
                to: 0,
                reason: Reason::FirstBack
            })
        );
    }

    #[test]
    fn a_return_that_fails_doubles_the_interval_and_one_that_holds_resets_it() {
        let mut e = three(Some(CHECK));
        let mut now = Instant::now();
        up_on_second(&mut e, now);
        for doublings in 1..=7u32 {
            now += e.check_interval().unwrap();
            assert!(e.checked(true, now));
            // The first accepted TCP but the session does not come up.
            assert_eq!(e.failed(now), 1, "falls through to the next node");
            e.connected(now);
            e.up(now);
            let want = CHECK * 2u32.pow(doublings.min(MAX_CHECK_DOUBLINGS));
            assert_eq!(
                e.check_interval(),
                Some(want),
                "after {doublings} failed returns"
            );
            assert_eq!(e.check_at(), Some(now + want));
        }
        // A return that connects but drops sooner than the interval fails too.
        now += e.check_interval().unwrap();
        assert!(e.checked(true, now));
        e.connected(now);
        e.up(now);
        assert_eq!(e.failed(now + Duration::from_secs(5)), 1);
        assert_eq!(e.check_interval(), Some(CHECK * 32));
        // One that holds for the interval resets it.
        e.connected(now);
        e.up(now);
        now += e.check_interval().unwrap();
        assert!(e.checked(true, now));
        e.connected(now);
        e.up(now);
        assert_eq!(e.check_at(), None, "on the first: no checks");
        assert_eq!(e.failed(now + CHECK * 32), 1);
        assert_eq!(e.check_interval(), Some(CHECK));
    }

    #[test]
    fn a_return_to_the_first_that_ends_in_a_stall_did_not_hold_however_long_it_lasted() {
        let mut e = three(Some(CHECK));
        let mut now = Instant::now();
        up_on_second(&mut e, now);
        now += CHECK;
        assert!(e.checked(true, now));
        // The first takes TCP and the session, then moves nothing: it is
        // left three intervals later, which a drop would count as a hold.
        e.connected(now);
        now += CHECK * 3;
        assert_eq!(e.stalled(now), 1, "on to the next node");
        assert_eq!(e.check_interval(), Some(CHECK * 2));
        // The same length of stay ended by a plain drop held.
        e.connected(now);
        e.up(now);
        now += CHECK * 2;
        assert!(e.checked(true, now));
        e.connected(now);
        now += CHECK * 3;
        assert_eq!(e.failed(now), 1);
        assert_eq!(e.check_interval(), Some(CHECK));
    }

    #[test]
    fn a_check_answered_after_the_link_changed_is_ignored() {
        let mut e = three(Some(CHECK));
        let now = Instant::now();
        up_on_second(&mut e, now);
        e.failed(now);
        assert!(
            !e.checked(true, now + CHECK),
            "down meanwhile: nothing to leave"
        );
        assert_eq!(e.current().0, 2);
    }

    #[test]
    fn endpoints_print_as_written_with_ipv6_in_brackets() {
        assert_eq!(Endpoint::new("broker.a", 1883).to_string(), "broker.a:1883");
        assert_eq!(Endpoint::new("::1", 8883).to_string(), "[::1]:8883");
    }
}
