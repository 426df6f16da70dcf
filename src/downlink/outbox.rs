//! Receipts north, the shell around
//! [`Receipts`](super::receipts::Receipts): queued as state changes
//! commit, handed to the north session while the link is up, dropped once
//! PUBACKed, and a lone receipt the upstream keeps refusing dead-lettered.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::{error, warn};

use super::record::reason;
use super::{Downlink, Timer};
use crate::dead_letter::DeadLetter;
use crate::north::Tag;
use crate::protocol::now_ms;
use crate::protocol::receipt::NorthReceipt;
use crate::store::StoreError;

/// Receipts held until the upstream acknowledges them; past it the oldest
/// go (they are in memory only).
pub(super) const RECEIPTS_HELD: usize = 1_000_000;
/// A receipts message the session could not take is tried again after this.
const RECEIPTS_RETRY: Duration = Duration::from_millis(50);

impl Downlink {
    /// Queues receipts north and sends what the link can take.
    pub(super) fn send_receipts(&mut self, receipts: impl IntoIterator<Item = NorthReceipt>) {
        let dropped = self.receipts.extend(receipts);
        if dropped > 0 {
            warn!(
                dropped,
                total_dropped = self.receipts.dropped,
                held = self.receipts.held(),
                "receipts north held past their cap; the oldest were dropped"
            );
        }
        self.flush_receipts();
    }

    /// Hands receipts to the north session while the link is up.
    pub(super) fn flush_receipts(&mut self) {
        self.timers.remove(&Timer::ReceiptsRetry);
        let Some(epoch) = self.epoch else { return };
        let topic = self.topics.north_receipts();
        while let Some((id, body)) = self.receipts.next_message() {
            if !self
                .north
                .publish(topic.clone(), body, Tag::Receipts(id), epoch)
            {
                // The session's queue is full; try again shortly.
                self.receipts.unsend(id);
                self.timers
                    .insert(Timer::ReceiptsRetry, Instant::now() + RECEIPTS_RETRY);
                return;
            }
        }
    }

    /// The upstream dropped the link on a receipts message.
    pub(super) async fn on_receipts_refused(&mut self, id: u64) -> Result<(), StoreError> {
        let Some(r) = self.receipts.refused(id, self.settings.max_attempts) else {
            return Ok(());
        };
        let raw = Bytes::from(serde_json::to_vec(&r).expect("a receipt serializes"));
        let reason = reason::receipt_undeliverable(self.settings.max_attempts);
        error!(msg_id = ?r.msg_id, device = ?r.device, status = r.status, reason = %reason, "receipt north dead-lettered");
        let dl = DeadLetter {
            direction: "down",
            device: r.device,
            msg_id: r.msg_id,
            topic: self.topics.north_receipts(),
            reason,
            raw,
            at_ms: now_ms(),
        };
        // Fire and forget: the row commits with the next batch.
        drop(self.store.reject(dl));
        Ok(())
    }
}
