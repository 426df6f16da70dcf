//! Receipts north, the shell around the outbox: a receipt is committed in
//! the `receipt_outbox` table with the state change it reports (by the
//! store), held in a bounded window ([`Receipts`](super::receipts::Receipts)), handed to the north
//! session while the link is up, and deleted from the table only once the
//! upstream PUBACKs the message carrying it. Rows beyond the window, and
//! all of them after a restart, are read back in pages as room frees; a
//! lone receipt the upstream keeps refusing is moved to the dead letters.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, warn};

use super::{Done, Downlink, Timer};
use crate::clip::Clip;
use crate::dead_letter::{DeadLetter, Direction};
use crate::north::{Link, Tag};
use crate::protocol::now_ms;
use crate::store::record::downlink::{reason, OutboxReceipt};
use crate::store::StoreError;

/// A receipts message the session could not take, or a page that could not
/// be read, is tried again after this.
const RECEIPTS_RETRY: Duration = Duration::from_millis(50);

impl Downlink {
    /// Receipts just committed: queue them and send what the link can take.
    pub(super) fn send_receipts(&mut self, rows: impl IntoIterator<Item = OutboxReceipt>) {
        self.receipts.extend(rows);
        self.flush_receipts();
    }

    /// Hands receipts to the north session while the link is up, and reads
    /// the next page of the outbox when there is room for it.
    pub(super) fn flush_receipts(&mut self) {
        self.timers.remove(&Timer::ReceiptsRetry);
        if let Some((from, limit)) = self.receipts.next_page() {
            let page = self.store.outbox_page(from, limit);
            self.pending.push(Box::pin(async move {
                Done::ReceiptsPage {
                    from,
                    limit,
                    result: page.await,
                }
            }));
        }
        let Link::Up(epoch) = self.link else { return };
        let topic = self.topics.north_receipts();
        while let Some((id, body)) = self.receipts.next_message() {
            if !self
                .north
                .publish(topic.clone(), body, Tag::Receipts(id), epoch)
            {
                // The session's queue is full; try again shortly.
                self.receipts.unsend(id);
                self.retry_receipts();
                return;
            }
        }
    }

    fn retry_receipts(&mut self) {
        self.timers
            .insert(Timer::ReceiptsRetry, Instant::now() + RECEIPTS_RETRY);
    }

    /// A page of the outbox was read.
    pub(super) fn on_outbox_page(
        &mut self,
        from: i64,
        limit: usize,
        result: Result<Vec<OutboxReceipt>, StoreError>,
    ) {
        match result {
            Ok(rows) => self.receipts.loaded(rows, limit),
            Err(e) => {
                warn!(event = "receipt_outbox_not_read", error = %e, from, "receipts outbox not read; trying again");
                self.receipts.load_failed(from);
                self.retry_receipts();
                return;
            }
        }
        self.flush_receipts();
    }

    /// The upstream acknowledged a receipts message: its rows leave the
    /// outbox, and their room goes to the next.
    pub(super) fn on_receipts_published(&mut self, id: u64) -> Result<(), StoreError> {
        let rows = self.receipts.published(id);
        if !rows.is_empty() {
            // Fire and forget: a delete lost in a crash only sends them
            // again. It reaches the writer before any later page read.
            self.store.receipts_sent(rows)?;
        }
        self.flush_receipts();
        Ok(())
    }

    /// The upstream dropped the link on a receipts message.
    pub(super) fn on_receipts_refused(&mut self, id: u64) {
        let Some(r) = self.receipts.refused(id, self.settings.max_attempts) else {
            return;
        };
        let reason = reason::receipt_undeliverable(self.settings.max_attempts);
        let named: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        let field = |k: &str| named.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let (device, msg_id) = (field("device"), field("msg_id"));
        error!(event = "receipt_dead_lettered", device = %Clip(device.as_deref().unwrap_or("")), msg_id = %Clip(msg_id.as_deref().unwrap_or("")), status = %Clip(field("status").as_deref().unwrap_or("")), attempts = self.settings.max_attempts, reason = %reason, "receipt north dead-lettered");
        let dl = DeadLetter {
            direction: Direction::Down,
            device,
            msg_id,
            topic: self.topics.north_receipts(),
            reason,
            raw: r.body,
            at_ms: now_ms(),
        };
        // Fire and forget: out of the outbox and into the dead letters in
        // one commit; if it is lost in a crash the receipt is tried again.
        drop(self.store.receipt_dead(r.id, dl));
    }
}
