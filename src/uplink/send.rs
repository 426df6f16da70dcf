//! Publishing north: each message alone on its own topic, or gathered
//! into batches ([`super::batch`]) when `north.batch_max` > 1.

use tokio::time::Instant;

use super::batch::{Added, Batch};
use super::Engine;
use crate::metrics::{self, Stage};
use crate::north::{Link, Tag};
use crate::store::record::uplink::PendingMessage;

impl Engine {
    /// Publishes `msg`, or gathers it into the open batch (which goes out
    /// once full, at its linger, or at the end of the engine's turn).
    pub(super) fn publish(&mut self, msg: PendingMessage, committed: Option<Instant>) {
        let now = Instant::now();
        match self.batcher.add(msg, committed, now) {
            Added::Alone(msg) => self.publish_alone(msg, committed),
            Added::Gathered { full: Some(batch) } => self.publish_batch(batch),
            Added::Gathered { full: None } => {}
        }
    }

    fn publish_alone(&mut self, msg: PendingMessage, committed: Option<Instant>) {
        let topic = self.topics.north_up(&msg.device, &msg.stream);
        let tag = Tag::Uplink {
            device: msg.device.clone(),
            seq: msg.seq,
        };
        let sent = match self.link {
            Link::Up(epoch) => self.north.publish(topic, msg.body.clone(), tag, epoch),
            Link::Down => false,
        };
        if !sent {
            self.scheduler
                .on_publish_refused(&msg.device, msg.seq, Instant::now());
        } else if let Some(committed) = committed {
            metrics::stage_took(Stage::NorthPublish, committed.elapsed());
        }
    }

    /// Publishes the open batch now, if there is one and its linger is
    /// over (`all`: whatever its linger).
    pub(super) fn flush_batch(&mut self, all: bool) {
        let due = self.batcher.due().is_some_and(|at| at <= Instant::now());
        if all || due {
            if let Some(batch) = self.batcher.take() {
                self.publish_batch(batch);
            }
        }
    }

    fn publish_batch(&mut self, batch: Batch) {
        let tag = Tag::Uplinks(
            batch
                .entries
                .iter()
                .map(|e| (e.device.clone(), e.seq))
                .collect(),
        );
        let sent = match self.link {
            Link::Up(epoch) => {
                self.north
                    .publish(self.topics.north_up_batch(), batch.payload, tag, epoch)
            }
            Link::Down => false,
        };
        let now = Instant::now();
        for e in batch.entries {
            if !sent {
                self.scheduler.on_publish_refused(&e.device, e.seq, now);
            } else if let Some(committed) = e.committed {
                metrics::stage_took(Stage::NorthPublish, committed.elapsed());
            }
        }
    }

    /// The upstream refused a batch: a failed attempt for each of its
    /// messages, and each goes alone next time.
    pub(super) fn batch_refused(
        &mut self,
        batch: Vec<(crate::ids::DeviceId, crate::ids::Seq)>,
    ) -> Vec<super::scheduler::Action> {
        let now = Instant::now();
        let mut actions = Vec::new();
        for (device, seq) in &batch {
            actions.extend(self.scheduler.on_refused(device, *seq, now));
        }
        self.batcher.refused(batch);
        actions
    }
}
