//! Messages a client resends until they are answered: uplinks until the
//! device has a receipt, downlinks until every recipient has `stored`.
//!
//! docs/PROTOCOL.md: with no answer within the receipt timeout, resend; the
//! timeout doubles with every resend up to [`RESEND_MAX`]. After a
//! reconnect everything is sent again at once.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

/// The longest wait for an answer before a resend.
pub(crate) const RESEND_MAX: Duration = Duration::from_secs(60);

struct Entry<W> {
    topic: String,
    body: Bytes,
    /// What the entry still waits for (e.g. devices without `stored`).
    waiting: W,
    sent_at: Instant,
    /// Resends after a timeout so far; each doubles the next wait.
    resends: u32,
}

/// Keyed by `msg_id`. `W` is what an entry still waits for.
pub(crate) struct Resends<W> {
    entries: HashMap<String, Entry<W>>,
    resend_after: Duration,
}

impl<W> Resends<W> {
    pub(crate) fn new(resend_after: Duration) -> Resends<W> {
        Resends {
            entries: HashMap::new(),
            resend_after,
        }
    }

    /// Records a message just sent.
    pub(crate) fn insert(&mut self, msg_id: String, topic: String, body: Bytes, waiting: W) {
        self.entries.insert(
            msg_id,
            Entry {
                topic,
                body,
                waiting,
                sent_at: Instant::now(),
                resends: 0,
            },
        );
    }

    pub(crate) fn waiting_mut(&mut self, msg_id: &str) -> Option<&mut W> {
        self.entries.get_mut(msg_id).map(|e| &mut e.waiting)
    }

    pub(crate) fn remove(&mut self, msg_id: &str) {
        self.entries.remove(msg_id);
    }

    /// What to send again now: everything (`all`, after a reconnect) or what
    /// has waited its receipt timeout since its last send. Marks them sent.
    pub(crate) fn due(&mut self, all: bool) -> Vec<(String, Bytes)> {
        let now = Instant::now();
        let mut out = Vec::new();
        for e in self.entries.values_mut() {
            let timeout = self
                .resend_after
                .saturating_mul(1 << e.resends.min(16))
                .min(RESEND_MAX.max(self.resend_after));
            let timed_out = now.duration_since(e.sent_at) >= timeout;
            if all || timed_out {
                if timed_out && !all {
                    e.resends = e.resends.saturating_add(1);
                }
                e.sent_at = now;
                out.push((e.topic.clone(), e.body.clone()));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_receipt_timeout_doubles_per_resend_up_to_a_minute() {
        let mut o: Resends<()> = Resends::new(Duration::from_secs(5));
        o.insert("m1".into(), "t".into(), Bytes::from_static(b"x"), ());
        let mut resent_after = Vec::new();
        let mut waited = 0;
        for _ in 0..200 {
            tokio::time::advance(Duration::from_secs(1)).await;
            waited += 1;
            if !o.due(false).is_empty() {
                resent_after.push(waited);
                waited = 0;
            }
        }
        assert_eq!(resent_after, vec![5, 10, 20, 40, 60, 60]);
    }

    #[tokio::test(start_paused = true)]
    async fn entries_come_due_after_the_resend_delay_until_removed() {
        let mut o: Resends<()> = Resends::new(Duration::from_secs(5));
        o.insert("m1".into(), "t".into(), Bytes::from_static(b"x"), ());
        assert!(o.due(false).is_empty());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(o.due(false).len(), 1);
        assert!(o.due(false).is_empty(), "marked sent");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(o.due(false).is_empty(), "the second wait is twice as long");
        assert_eq!(o.due(true).len(), 1, "a reconnect resends everything");
        o.remove("m1");
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(o.due(false).is_empty());
    }
}
