//! A set of deadlines, at most one per key, in time order. Pure.
//!
//! Every timer in the pipelines is one of these: a key's deadline is set
//! (replacing any earlier one), cleared, and popped once due. A replaced or
//! removed deadline never fires, so callers need no "is this timer still
//! current?" checks of their own.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

use tokio::time::Instant;

/// Sleeps until `at`, or forever when there is no deadline: a `select!`
/// branch for an optional timer.
pub async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[derive(Debug)]
pub struct Deadlines<K> {
    /// Every live deadline, in time order (ties by key).
    order: BTreeSet<(Instant, K)>,
    /// The live deadline of each key.
    at: HashMap<K, Instant>,
}

impl<K> Default for Deadlines<K> {
    fn default() -> Self {
        Deadlines {
            order: BTreeSet::new(),
            at: HashMap::new(),
        }
    }
}

impl<K: Ord + Hash + Clone> Deadlines<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key`'s deadline to `at`; returns the one it replaced.
    pub fn insert(&mut self, key: K, at: Instant) -> Option<Instant> {
        let old = self.at.insert(key.clone(), at);
        if let Some(old) = old {
            self.order.remove(&(old, key.clone()));
        }
        self.order.insert((at, key));
        old
    }

    /// Clears `key`'s deadline; returns it.
    pub fn remove(&mut self, key: &K) -> Option<Instant> {
        let old = self.at.remove(key)?;
        self.order.remove(&(old, key.clone()));
        Some(old)
    }

    /// `key`'s deadline, if it has one.
    pub fn get(&self, key: &K) -> Option<Instant> {
        self.at.get(key).copied()
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Instant> {
        self.order.first().map(|(at, _)| *at)
    }

    /// Takes out the earliest key whose deadline is at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(K, Instant)> {
        let (at, _) = self.order.first()?;
        if *at > now {
            return None;
        }
        let (at, key) = self.order.pop_first()?;
        self.at.remove(&key);
        Some((key, at))
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ms(base: Instant, n: u64) -> Instant {
        base + Duration::from_millis(n)
    }

    #[test]
    fn due_keys_pop_in_time_order_and_only_when_due() {
        let t = Instant::now();
        let mut d = Deadlines::new();
        d.insert("b", ms(t, 20));
        d.insert("a", ms(t, 10));
        d.insert("c", ms(t, 30));
        assert_eq!(d.next(), Some(ms(t, 10)));
        assert_eq!(d.pop_due(ms(t, 5)), None);
        assert_eq!(d.pop_due(ms(t, 25)), Some(("a", ms(t, 10))));
        assert_eq!(d.pop_due(ms(t, 25)), Some(("b", ms(t, 20))));
        assert_eq!(d.pop_due(ms(t, 25)), None);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn a_replaced_deadline_never_fires() {
        let t = Instant::now();
        let mut d = Deadlines::new();
        assert_eq!(d.insert("a", ms(t, 10)), None);
        assert_eq!(d.insert("a", ms(t, 50)), Some(ms(t, 10)));
        assert_eq!(d.pop_due(ms(t, 20)), None, "the old deadline is gone");
        assert_eq!(d.get(&"a"), Some(ms(t, 50)));
        assert_eq!(d.pop_due(ms(t, 50)), Some(("a", ms(t, 50))));
        assert!(d.is_empty());
    }

    #[test]
    fn a_removed_deadline_never_fires() {
        let t = Instant::now();
        let mut d = Deadlines::new();
        d.insert(1u32, ms(t, 10));
        d.insert(2u32, ms(t, 10));
        assert_eq!(d.remove(&1), Some(ms(t, 10)));
        assert_eq!(d.remove(&1), None);
        assert_eq!(d.pop_due(ms(t, 10)), Some((2, ms(t, 10))));
        assert_eq!(d.next(), None);
    }
}
