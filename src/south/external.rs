//! External mode: ferry as a client of the site's broker, on
//! [`crate::mqtt`].
//!
//! - One persistent session (clean session off), subscribed QoS 1 to every
//!   device topic of the protocol. The site broker keeps what devices
//!   publish until ferry acknowledges it, also while ferry is stopped
//!   (within the broker's own queue limits: docs/OPERATIONS in the README).
//! - A device message is acknowledged only after intake committed it (or
//!   dead-lettered it, or handed a control message on): intake passes its
//!   [`Ack`] to [`SouthSender::ack`], and acks go out in receive order.
//! - Receipts and inbox batches are published QoS 1 to the device's topics;
//!   one lost with a dropped link is repaired by the protocol (the device
//!   resends its uplink; an unconfirmed batch is sent again).
//! - While the site broker is down, the session reconnects with backoff;
//!   north is not affected.
//! - What the broker held for the session while ferry was away arrives as
//!   a burst after the reconnect; those messages are marked `replayed`
//!   ([`super::backlog`]) and are not held to the per-device limits.
//! - Isolation between devices is the site broker's ACL (README).

use std::sync::atomic::Ordering;

use tokio::time::Instant;
use tracing::{debug, error, info};

use super::backlog::{Backlog, Taken};
use super::seam::{
    beside_filters, device_filters, Ack, AckTo, Inbound, InboundTx, Outbound, South, SouthMessage,
    SouthSender, Started, TOPIC_ALLOWANCE,
};
use crate::config::{ExternalSouth, SouthConfig};
use crate::deadlines::sleep_until;
use crate::mqtt::{self, Event, Reconnect, Session};
use crate::protocol::now_ms;
use crate::protocol::topics::Topics;

/// Device messages received and not yet acknowledged, at most (the site
/// broker may have fewer in flight: Mosquitto's `max_inflight_messages`).
const INFLIGHT: u16 = 1024;

pub(crate) fn start(cfg: &SouthConfig, site: &ExternalSouth, topics: &Topics) -> Started {
    // The site broker authenticates devices; SIGHUP has nothing to reload.
    super::auth::reload_on_hangup(None, crate::signals::hangups());
    let opts = mqtt::Options {
        name: "south".into(),
        endpoints: vec![mqtt::Endpoint::new(site.host.clone(), site.port)],
        prefer_first: None,
        client_id: site.client_id.clone(),
        version: site.mqtt_version,
        credentials: site.credentials.clone(),
        keep_alive: site.keep_alive,
        clean_session: false,
        last_will: None,
        max_incoming_packet: mqtt::MQTT_MAX_PACKET,
        max_outgoing_packet: mqtt::MQTT_MAX_PACKET,
        // A larger publish arrives as its head, to be answered `rejected`.
        max_message_bytes: cfg.max_payload_bytes + TOPIC_ALLOWANCE,
        inflight: INFLIGHT,
        // A site broker that never acknowledges holds the receipts, then
        // the acks of device messages behind them: stuck like a north node.
        puback_timeout: Some(site.puback_timeout),
        // And plain devices' and Sparkplug edge nodes' topics.
        subscriptions: device_filters(topics)
            .chain(beside_filters(topics))
            .collect(),
        announce: None,
        auto_ack: false,
        replay: false,
        reconnect: Reconnect::GATEWAY,
        transport: mqtt::Transport::from_config(site.tls.as_ref()),
    };
    let (session, events) = Session::<()>::start(opts);
    let (tx, inbound) = Inbound::new();
    let (link_tx, link) = tokio::sync::mpsc::unbounded_channel();
    let stopped = tokio::spawn(receive(events, tx, link_tx));
    let south = South {
        inbound,
        outbound: SouthSender(Outbound::External(session)),
        stopped,
        presence: None,
    };
    Started {
        south,
        link: Some(link),
    }
}

/// Moves device messages from the session into the pipeline's channel,
/// waiting for room (the session, and then the site broker, wait too), and
/// marks those that are the site broker's backlog ([`Backlog`]).
async fn receive(
    mut events: tokio::sync::mpsc::Receiver<Event<()>>,
    tx: InboundTx,
    link: tokio::sync::mpsc::UnboundedSender<bool>,
) -> String {
    let mut backlog = Backlog::new();
    loop {
        let event = tokio::select! {
            biased;
            event = events.recv() => event,
            _ = sleep_until(backlog.deadline()) => {
                log_taken(backlog.expire(Instant::now()));
                continue;
            }
        };
        let Some(event) = event else {
            return "external south session stopped".into();
        };
        let m = match event {
            Event::Message(m) => m,
            Event::Up {
                epoch,
                session_present,
                refused,
                ..
            } => {
                if refused.is_empty() {
                    info!(
                        event = "south_link_up",
                        epoch, session_present, "south link up: taking device messages"
                    );
                } else {
                    error!(event = "south_subscriptions_refused", epoch, filters = ?refused, "south link up, but the site broker refused ferry's subscriptions: give ferry's user read access to them (docs/EXTERNAL.md)");
                }
                log_taken(backlog.on_up(session_present, Instant::now()));
                let _ = link.send(true);
                continue;
            }
            Event::Down => {
                log_taken(backlog.on_down(Instant::now()));
                let _ = link.send(false);
                continue;
            }
            _ => continue,
        };
        let (replayed, ended) = backlog.on_message(Instant::now());
        log_taken(ended);
        let msg = SouthMessage {
            topic: m.topic,
            payload: m.payload,
            oversize: m.oversize,
            // The site broker's ACL keeps devices to their own topics.
            publisher: None,
            received_ms: now_ms(),
            replayed,
            v5: Default::default(),
            number: None,
            qos: None,
            retain: m.retain,
            ack: Ack(AckTo::Site(m.token)),
        };
        tx.bytes.fetch_add(msg.payload.len(), Ordering::Relaxed);
        if tx.tx.send(msg).await.is_err() {
            debug!("south receiver closed; external session reader stops");
            return "south pipeline stopped".into();
        }
        backlog.waiting(Instant::now());
    }
}

/// One line per burst of the site broker's backlog that ferry took.
fn log_taken(taken: Option<Taken>) {
    let Some(t) = taken.filter(|t| t.messages > 0) else {
        return;
    };
    info!(
        event = "south_backlog_taken",
        messages = t.messages,
        lasted_ms = t.lasted.as_millis() as u64,
        ended = t.end.as_str(),
        "took what the site broker held for ferry's session, outside the per-device limits; they apply again"
    );
}
