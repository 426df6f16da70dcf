//! The one MQTT session: every link ferry opens as a client (north, the
//! external south, the client library, tests and benchmarks) is a
//! [`Session`] over rumqttc. No other module polls rumqttc's event loop.
//!
//! rumqttc supplies the protocol; this module supplies what it lacks
//! (../shared/notes/RUMQTT.md):
//! - a reconnect backoff with jitter after every connection error, which
//!   keeps growing while connections die young ([`Reconnect`]);
//! - re-subscription on every ConnAck, and [`Event::Up`] only once the
//!   subscriptions are acknowledged (and the optional retained
//!   [`Options::announce`] is, so a drop is never blamed on it);
//! - manual acknowledgements sent in receive order, only on the connection
//!   the message came on ([`acks::OrderedAcks`]);
//! - tracked publishes: each is followed to its PUBACK by packet id, and
//!   the one an upstream drops the link on is found and reported
//!   ([`flow::Flow`], [`Event::Refused`]);
//! - typed events, and a poll that is never cancelled (`poll.rs`) but to
//!   cut a link that moves nothing: publishes outstanding and none
//!   acknowledged for [`Options::puback_timeout`] is a failure of that
//!   node like any other ([`Problem::Stalled`], `stall.rs`), so the next
//!   endpoint is tried and what was in flight is the owner's to send again
//!   there;
//! - several endpoints (a broker's nodes), one connected at a time: a
//!   failure moves to the next behind the same backoff, and with
//!   [`Options::prefer_first`] a working session on a later one is left
//!   cleanly for the first once it accepts again ([`endpoints::Endpoints`]).
//!   A move is a drop like any other to the owner: `Down`, then `Up` on the
//!   new node, with everything unacknowledged the owner's to send again;
//! - either protocol version ([`Options::version`]): MQTT 3.1.1, or MQTT 5
//!   through `rumqttc::v5` (`v5.rs`), normalised into the same events
//!   (`wire.rs`), so no owner knows which is underneath. What 5 adds is
//!   said in the owner's terms: a PUBACK reason code that refuses a
//!   tracked publish, or a publish larger than the broker's CONNACK
//!   allows, is [`Event::Refused`]; a SUBACK failure is a refused filter
//!   in [`Event::Up`]; a refused CONNACK is a failed connection whose log
//!   line names the reason code;
//! - every failed connection told as [`Event::Failed`], with what it says
//!   about the peer ([`failure::Problem`]: no MQTT broker, a refusal, a
//!   session another client with the same id took).
//!
//! Two ways to publish:
//! - [`Session::publish`]: tracked, made for one connection (`epoch`).
//!   What was not acknowledged when it dropped is the owner's to send
//!   again; rumqttc never replays it. For the gateway's own links.
//! - [`Session::send`]: fire and forget, replayed by rumqttc after a
//!   reconnect (with [`Options::replay`]). For clients that resend on their
//!   own protocol timers anyway, and for the external south's receipts and
//!   batches (the protocol repairs a lost one).
//!
//! A session uses one of the two, never both: tracking matches packet ids
//! to tracked publishes in the order rumqttc writes them.

pub mod acks;
#[cfg(test)]
pub(crate) mod by_hand;
pub mod endpoints;
pub mod failure;
pub mod flow;
mod link;
pub mod options;
mod poll;
mod reached;
mod session;
mod stall;
mod v5;
mod wire;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, Notify};

pub use acks::AckToken;
pub use failure::{Failure, Problem};
pub use flow::{Outgoing, Tag};
pub use options::{
    Announce, Event, Message, Options, Reach, Reconnect, Transport, Will, OVERSIZE_HEAD,
    PUBLISH_QUEUE,
};

pub use crate::config::{Endpoint, MqttVersion};
pub use crate::protocol::MQTT_MAX_PACKET;
/// The owner's handle; cheap to clone. Dropping every handle and the event
/// receiver ends the session.
pub struct Session<T> {
    client: wire::Client,
    publishes: mpsc::Sender<Outgoing<T>>,
    commands: mpsc::UnboundedSender<session::Command>,
    closed: Arc<Notify>,
    /// The largest publish the connection takes (see `session/outgoing.rs`).
    max_packet: Arc<AtomicUsize>,
}

impl<T> Clone for Session<T> {
    fn clone(&self) -> Self {
        Session {
            client: self.client.clone(),
            publishes: self.publishes.clone(),
            commands: self.commands.clone(),
            closed: self.closed.clone(),
            max_packet: self.max_packet.clone(),
        }
    }
}

impl<T: Tag> Session<T> {
    /// Starts the session's tasks; its events arrive on the receiver.
    pub fn start(opts: Options) -> (Session<T>, mpsc::Receiver<Event<T>>) {
        let (parts, events) = session::start(opts);
        let session = Session {
            client: parts.client,
            publishes: parts.publishes,
            commands: parts.commands,
            closed: parts.closed,
            max_packet: parts.max_packet,
        };
        (session, events)
    }

    /// Queues a tracked QoS 1 publish for connection `epoch`, without
    /// waiting. False if the queue is full or closed: the caller keeps the
    /// message and tries again later.
    pub fn publish(&self, topic: String, body: Bytes, retain: bool, tag: T, epoch: u64) -> bool {
        self.publishes
            .try_send(Outgoing {
                topic,
                body,
                retain,
                tag,
                epoch,
            })
            .is_ok()
    }

    /// Fire-and-forget QoS 1 publish (see the module doc). False if
    /// rumqttc's request queue is full. One larger than an MQTT 5 broker
    /// takes is dropped here, with a warning (rumqttc would fail the
    /// connection on it, and replay it after every reconnect).
    pub fn send(&self, topic: impl Into<String>, body: impl Into<Vec<u8>>, retain: bool) -> bool {
        let (topic, body) = (topic.into(), body.into());
        if self.too_large(&topic, &body) {
            return true;
        }
        self.client.try_publish(topic, retain, body)
    }

    /// Like [`Session::send`], waiting for room in the request queue.
    pub async fn send_wait(
        &self,
        topic: impl Into<String>,
        body: impl Into<Vec<u8>>,
        retain: bool,
    ) -> bool {
        let (topic, body) = (topic.into(), body.into());
        if self.too_large(&topic, &body) {
            return true;
        }
        self.client.publish(topic, retain, body).await
    }

    /// Whether a publish is larger than the connection takes (then logged).
    fn too_large(&self, topic: &str, body: &[u8]) -> bool {
        let limit = self.max_packet.load(Ordering::Relaxed);
        if limit == usize::MAX {
            return false;
        }
        let size = v5::publish_size(topic, body.len());
        if size <= limit {
            return false;
        }
        tracing::warn!(event = "link_publish_refused", topic = %crate::clip::Clip(topic), reason = "packet_too_large", size, limit, "a publish larger than the broker takes (its MQTT 5 maximum packet size) was dropped");
        true
    }

    /// The message named by `token` may be acknowledged: in receive order,
    /// on its own connection only.
    pub fn ack(&self, token: AckToken) {
        let _ = self.commands.send(session::Command::Ack(token));
    }

    /// Reach the broker as `reach` says from the next connection on; the
    /// connection up now stays unless its node is no longer listed, and a
    /// wait between attempts ends at once (see `session/reach.rs`).
    pub fn reach(&self, reach: Reach) {
        let _ = self.commands.send(session::Command::Reach(Box::new(reach)));
    }

    /// The session's task answers the pings of `probed` from its loop (see
    /// [`crate::health`]) while its poller is alive: polled within three
    /// keep-alives while connected (rumqttc's own PINGREQ and PINGRESP are
    /// events too), or reconnecting.
    pub fn answer_probes(&self, probed: crate::health::Probed) {
        let _ = self.commands.send(session::Command::Probed(probed));
    }

    /// Leaves cleanly: `farewell` first (a clean DISCONNECT does not fire
    /// the last will, so a retained status says it instead), then
    /// DISCONNECT, waiting at most `within` for it to be written.
    pub async fn close(&self, farewell: Option<Will>, within: Duration) {
        let closed = self.closed.notified();
        if self
            .commands
            .send(session::Command::Close(farewell))
            .is_ok()
        {
            let _ = tokio::time::timeout(within, closed).await;
        }
    }
}
