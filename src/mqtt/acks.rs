//! Ordered manual acknowledgements. Pure: the session reports what arrived
//! and what its owner finished; this type says which PUBACKs may go now.
//!
//! Invariants:
//! - a received publish is acknowledged only after its owner marked it
//!   ready (for a gateway: after the commit that makes it durable);
//! - acknowledgements go out in receive order: a ready publish waits
//!   behind an earlier one that is not ready yet. A broker that redelivers
//!   after a drop then resends exactly the suffix that was not acked;
//! - a token belongs to one connection. When it drops, everything pending
//!   is forgotten (the broker sends those publishes again), and a token of
//!   an earlier connection is ignored: its ack must never go out on a
//!   later connection, where the packet id names another message.

use std::collections::VecDeque;

/// Names one received publish of one connection. The default token names
/// nothing (epochs start at 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AckToken {
    epoch: u64,
    id: u64,
}

#[derive(Debug)]
pub struct OrderedAcks<P> {
    epoch: u64,
    next_id: u64,
    /// Received and not yet acknowledged, in receive order.
    pending: VecDeque<(u64, P, bool)>,
}

impl<P> Default for OrderedAcks<P> {
    fn default() -> Self {
        OrderedAcks {
            epoch: 0,
            next_id: 0,
            pending: VecDeque::new(),
        }
    }
}

impl<P> OrderedAcks<P> {
    /// A new connection, `epoch`: nothing of the previous one is acked.
    pub fn connected(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.pending.clear();
    }

    /// The connection dropped: its pending acks are void.
    pub fn lost(&mut self) {
        self.pending.clear();
    }

    /// Publishes received and not yet acknowledged.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// A publish arrived; its token marks it ready later.
    pub fn received(&mut self, publish: P) -> AckToken {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.push_back((id, publish, false));
        AckToken {
            epoch: self.epoch,
            id,
        }
    }

    /// The owner is done with `token`'s publish. Returns the publishes to
    /// acknowledge now, in receive order (none while an earlier one is
    /// still pending; none for a token of another connection).
    pub fn ready(&mut self, token: AckToken) -> Vec<P> {
        if token.epoch != self.epoch {
            return Vec::new();
        }
        // Ids are increasing, so the entry is found by binary search.
        if let Ok(at) = self
            .pending
            .binary_search_by_key(&token.id, |(id, _, _)| *id)
        {
            self.pending[at].2 = true;
        }
        let mut out = Vec::new();
        while self.pending.front().is_some_and(|(_, _, ready)| *ready) {
            let (_, p, _) = self.pending.pop_front().expect("front exists");
            out.push(p);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acks() -> OrderedAcks<&'static str> {
        let mut a = OrderedAcks::default();
        a.connected(1);
        a
    }

    #[test]
    fn a_ready_publish_is_acked_at_once_when_nothing_precedes_it() {
        let mut a = acks();
        let t = a.received("a");
        assert_eq!(a.ready(t), vec!["a"]);
        assert!(a.is_empty());
    }

    #[test]
    fn acks_go_out_in_receive_order_whatever_order_they_are_ready_in() {
        let mut a = acks();
        let ta = a.received("a");
        let tb = a.received("b");
        let tc = a.received("c");
        assert!(a.ready(tc).is_empty(), "c waits for a and b");
        assert!(a.ready(tb).is_empty(), "b waits for a");
        assert_eq!(a.ready(ta), vec!["a", "b", "c"]);
    }

    #[test]
    fn a_token_is_used_once() {
        let mut a = acks();
        let ta = a.received("a");
        let tb = a.received("b");
        assert_eq!(a.ready(ta), vec!["a"]);
        assert!(a.ready(ta).is_empty());
        assert_eq!(a.ready(tb), vec!["b"]);
    }

    #[test]
    fn a_token_of_an_earlier_connection_acks_nothing_on_the_next() {
        let mut a = acks();
        let old = a.received("a");
        a.lost();
        a.connected(2);
        let new = a.received("a again");
        assert!(a.ready(old).is_empty());
        assert_eq!(a.len(), 1);
        assert_eq!(a.ready(new), vec!["a again"]);
    }

    #[test]
    fn a_drop_forgets_what_was_pending() {
        let mut a = acks();
        let t = a.received("a");
        a.received("b");
        a.lost();
        assert!(a.is_empty());
        assert!(a.ready(t).is_empty());
    }
}
