//! The session's side of incoming publishes: each handed to the owner,
//! and its acknowledgement sent in receive order on its own connection.

use tracing::warn;

use super::super::acks::AckToken;
use super::super::wire::Incoming;
use super::super::{Message, OVERSIZE_HEAD};
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

    pub(super) fn ready(&mut self, token: AckToken) {
        for received in self.acks.ready(token) {
            if let Err(e) = self.client.try_ack(&received) {
                warn!(event = "link_ack_not_queued", link = %self.opts.name, error = %e, "ack could not be queued");
            }
        }
    }
}
