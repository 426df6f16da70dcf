//! The session's side of incoming publishes: each handed to the owner,
//! and its acknowledgement sent in receive order on its own connection.

use tracing::{info, warn};

use super::super::acks::AckToken;
use super::super::options::{Message, OVERSIZE_HEAD};
use super::super::wire::{AckError, Incoming};
use super::{Event, Tag, Task};

impl<T: Tag> Task<T> {
    /// Hands one incoming publish to the owner.
    pub(super) async fn on_publish(&mut self, p: Box<Incoming>) -> Option<()> {
        let p = *p;
        let size = p.topic.len() + p.payload.len();
        let oversize = (size > self.opts.max_message_bytes).then_some(size);
        let payload = match oversize {
            Some(_) => p.payload.slice(..OVERSIZE_HEAD.min(p.payload.len())),
            None => p.payload.clone(),
        };
        let message = Message {
            topic: p.topic,
            payload,
            retain: p.retain,
            token: AckToken::default(),
            oversize,
        };
        let message = if !p.acked || self.opts.auto_ack {
            message
        } else {
            let token = self.acks.received(p.received);
            Message { token, ..message }
        };
        self.emit(Event::Message(message)).await
    }

    /// The acks `token` releases, in receive order, behind any still
    /// waiting for room.
    pub(super) fn ready(&mut self, token: AckToken) {
        let released = self.acks.ready(token);
        self.unqueued.extend(released);
        self.queue_acks();
    }

    /// Queues the acks waiting for room in rumqttc's request queue, in
    /// order, as far as it takes them. Never dropped: an ack lost here
    /// would hold one of the broker's inflight slots for this client
    /// until the connection ends (enough of them, and the broker sends
    /// nothing more). rumqttc reads its queue only while its own window
    /// of publishes has room, so under a burst of outgoing publishes acks
    /// can find it full for a while.
    pub(super) fn queue_acks(&mut self) {
        while let Some(received) = self.unqueued.front() {
            match self.client.try_ack(received) {
                Ok(()) => {
                    self.unqueued.pop_front();
                }
                Err(AckError::Full) => {
                    if !self.ack_waits_logged {
                        self.ack_waits_logged = true;
                        info!(event = "link_acks_waiting", link = %self.opts.name, waiting = self.unqueued.len(), "acks wait for room in the client's request queue (its own publishes fill it)");
                    }
                    return;
                }
                Err(AckError::Other(e)) => {
                    // The loop is gone, or the publish is of another
                    // version: no later try would do better.
                    warn!(event = "link_ack_not_queued", link = %self.opts.name, error = %e, "ack could not be queued");
                    self.unqueued.pop_front();
                }
            }
        }
        self.ack_waits_logged = false;
    }
}
