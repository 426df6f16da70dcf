//! The poller: the one task that polls a session's rumqttc event loop, of
//! either protocol version (and the making of that client and loop).
//!
//! `EventLoop::poll` is not safe to cancel: a publish being written when
//! the future is dropped is lost, and its packet id stays taken until
//! rumqttc gives up on the "collision". So this task only polls, in order,
//! never racing anything else, and hands each event to the session.
//!
//! It polls on while the session is busy (its owner behind, say): rumqttc
//! sends the keep-alive pings and reads their answers only while polled,
//! and a poller that waited for the session would let the broker drop a
//! working link after 1.5 keep-alives of silence, or rumqttc fail it on a
//! PINGRESP it had not read yet. The queue to the session is unbounded
//! but for received publishes, at most [`QUEUED_PUBLISHES`]: everything
//! else it carries is bounded by the MQTT windows (the acks and writes of
//! publishes the session queued, one ping a keep-alive), and a publish
//! over the bound waits for room, as TCP would hold it. Any packet from
//! the broker counts as a sign of life, as the PINGRESP it answers with
//! may sit behind a backlog ([`Loop::alive`]). After
//! an error it clears what rumqttc would replay, waits for the session to
//! say how long to back off and which endpoint is next, and drops whatever
//! was queued for the dead connection before reconnecting there.
//!
//! Life is not movement: a broker that answers pings but acknowledges
//! none of the session's outstanding publishes for
//! `Options::puback_timeout` has stalled (`stall.rs`). Then, and only
//! then, the poll is cancelled: the connection is dropped
//! ([`Loop::cut`]), so what it was writing is lost with everything else
//! of that connection, and the session hears of it as of any error.
//!
//! The endpoint is rumqttc's broker address in `EventLoop::mqtt_options`,
//! which the next connect reads: the TCP address, and with TLS the server
//! name (SNI) and the name the certificate must carry, so each node is
//! checked against its own host name.

use std::time::Duration;

use rumqttc::{AsyncClient, EventLoop, LastWill, MqttOptions, QoS};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::failure::LinkError;
use super::options::{Options, Transport};
use super::reached::PollerReach;
use super::stall::{Progress, Stall};
use super::wire::{self, Client, Wire};
use crate::config::{Endpoint, MqttVersion};

/// Requests (publishes, acks) queued towards the event loop.
const REQUEST_CAPACITY: usize = 65_536;
/// Received publishes the poller may be ahead of the session. With manual
/// acks the broker's inflight window holds them far below this; a broker
/// without one, or QoS 0, meets it.
pub(super) const QUEUED_PUBLISHES: usize = 4096;

/// rumqttc's event loop of either version.
pub(super) enum Loop {
    V4(Box<EventLoop>),
    V5(Box<rumqttc::v5::EventLoop>),
}

/// rumqttc's client and event loop for `opts`, on its first endpoint, in
/// its protocol version.
pub(super) fn client(opts: &Options) -> (Client, Loop) {
    let first = &opts.endpoints[0];
    match opts.version {
        MqttVersion::V311 => {
            let (client, mut eventloop) =
                AsyncClient::new(mqtt_options(opts, first), REQUEST_CAPACITY);
            // Small messages (uplinks, acks, receipts): don't let Nagle hold them.
            let mut net = rumqttc::NetworkOptions::new();
            net.set_tcp_nodelay(true);
            eventloop.set_network_options(net);
            (Client::V4(client), Loop::V4(Box::new(eventloop)))
        }
        MqttVersion::V5 => {
            let mqtt = super::v5::options(opts, first, REQUEST_CAPACITY);
            let (client, eventloop) = rumqttc::v5::AsyncClient::new(mqtt, REQUEST_CAPACITY);
            (Client::V5(client), Loop::V5(Box::new(eventloop)))
        }
    }
}

/// What an event says of the link's liveness (see [`Loop::alive`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sign {
    /// A packet came from the broker.
    Heard,
    /// rumqttc wrote a PINGREQ.
    Pinged,
    Neither,
}

impl Loop {
    async fn poll(&mut self) -> Result<(Wire, Sign), LinkError> {
        match self {
            Loop::V4(l) => l
                .poll()
                .await
                .map(|e| {
                    let sign = match &e {
                        rumqttc::Event::Incoming(_) => Sign::Heard,
                        rumqttc::Event::Outgoing(rumqttc::Outgoing::PingReq) => Sign::Pinged,
                        rumqttc::Event::Outgoing(_) => Sign::Neither,
                    };
                    (wire::from_v4(e), sign)
                })
                .map_err(|e| super::failure::v4(&e)),
            Loop::V5(l) => l
                .poll()
                .await
                .map(|e| {
                    let sign = match &e {
                        rumqttc::v5::Event::Incoming(_) => Sign::Heard,
                        rumqttc::v5::Event::Outgoing(rumqttc::Outgoing::PingReq) => Sign::Pinged,
                        rumqttc::v5::Event::Outgoing(_) => Sign::Neither,
                    };
                    (super::v5::from_v5(e), sign)
                })
                .map_err(|e| super::v5::error(&e)),
        }
    }

    /// The broker was heard since the last PINGREQ: the link is alive, so
    /// the PINGRESP still to come must not fail it at the next keep-alive.
    /// rumqttc fails a link whose PINGRESP has not been read one keep-alive
    /// after the PINGREQ; but a broker sending a backlog (its queue for a
    /// kept session, with no in-flight limit) puts the PINGRESP behind
    /// thousands of publishes, which the session takes at its own pace
    /// ([`QUEUED_PUBLISHES`]). Failing then dropped a working link, again
    /// and again: everything taken and not yet acked was sent once more.
    /// A broker that stops sends nothing: its silence still fails the link
    /// one keep-alive after the ping, once what it sent before is read.
    fn alive(&mut self) {
        match self {
            Loop::V4(l) => l.state.await_pingresp = false,
            Loop::V5(l) => l.state.await_pingresp = false,
        }
    }

    /// The PUBACKs rumqttc read from a connection that then failed, not
    /// yet reported (MQTT 5 only). A v5 broker may refuse a publish and
    /// close the connection at once (Mosquitto 2.0.11 does after a PUBACK
    /// `not_authorized`): the reason code would be lost with it. They are
    /// acknowledgements of that connection, so the session may count them
    /// before it hears of the drop. 3.1.1 keeps its old rule: nothing read
    /// from a failed connection is reported.
    fn salvage_acks(&mut self) -> Vec<Wire> {
        match self {
            Loop::V4(_) => Vec::new(),
            Loop::V5(l) => l
                .state
                .events
                .drain(..)
                .filter(|e| {
                    matches!(
                        e,
                        rumqttc::v5::Event::Incoming(rumqttc::v5::mqttbytes::v5::Packet::PubAck(_))
                    )
                })
                .map(super::v5::from_v5)
                .collect(),
        }
    }

    /// Ends a packet-id collision left by the failed connection. rumqttc
    /// keeps the publish that collided (its id still held by one the
    /// broker never acknowledged) and reads no further requests until that
    /// id is acknowledged, which no later connection does: after a
    /// reconnect the link would carry only pings, never a SUBSCRIBE or a
    /// publish, until its collision timeout failed it, again and again.
    /// With `replay` the publish joins what is resent, after the
    /// unacknowledged ones and under a new packet id; without, it is
    /// dropped with the rest (its owner sends it again).
    fn end_collision(&mut self, replay: bool) {
        match self {
            Loop::V4(l) => {
                l.state.collision_ping_count = 0;
                if let Some(mut publish) = l.state.collision.take().filter(|_| replay) {
                    publish.pkid = 0;
                    let at = first_unsent(&l.pending, |r| match r {
                        rumqttc::Request::Publish(p) => p.pkid != 0,
                        rumqttc::Request::PubRel(_) => true,
                        _ => false,
                    });
                    l.pending.insert(at, rumqttc::Request::Publish(publish));
                }
            }
            Loop::V5(l) => {
                l.state.collision_ping_count = 0;
                if let Some(mut publish) = l.state.collision.take().filter(|_| replay) {
                    publish.pkid = 0;
                    let at = first_unsent(&l.pending, |r| match r {
                        rumqttc::v5::Request::Publish(p) => p.pkid != 0,
                        rumqttc::v5::Request::PubRel(_) => true,
                        _ => false,
                    });
                    l.pending.insert(at, rumqttc::v5::Request::Publish(publish));
                }
            }
        }
    }

    /// Publishes written and awaiting their acknowledgement.
    fn outstanding(&self) -> usize {
        match self {
            Loop::V4(l) => l.state.inflight() as usize,
            Loop::V5(l) => l.state.inflight() as usize,
        }
    }

    /// Drops the connection at once, as rumqttc does after an error (what
    /// was unacknowledged moves to what it would replay).
    fn cut(&mut self) {
        match self {
            Loop::V4(l) => l.clean(),
            Loop::V5(l) => l.clean(),
        }
    }

    /// The node the connection is to.
    fn endpoint(&self) -> Endpoint {
        let (host, port) = match self {
            Loop::V4(l) => l.mqtt_options.broker_address(),
            Loop::V5(l) => l.options.broker_address(),
        };
        Endpoint::new(host, port)
    }

    /// Drops what rumqttc would replay, and the events it read but has
    /// not reported yet.
    fn forget(&mut self) {
        match self {
            Loop::V4(l) => {
                l.pending.clear();
                l.state.events.clear();
            }
            Loop::V5(l) => {
                l.pending.clear();
                l.state.events.clear();
            }
        }
    }

    /// Drops everything queued for the dead connection.
    fn drop_queued(&mut self) {
        match self {
            Loop::V4(l) => {
                l.clean();
                l.pending.clear();
            }
            Loop::V5(l) => {
                l.clean();
                l.pending.clear();
            }
        }
    }

    /// Points the next connect at `to` (with `opts` afresh, if `new`).
    fn retarget(&mut self, opts: &Options, to: &Endpoint, new: bool) {
        let at = (to.host.clone(), to.port);
        match self {
            Loop::V4(l) if new || l.mqtt_options.broker_address() != at => {
                l.mqtt_options = mqtt_options(opts, to);
            }
            Loop::V5(l) if new || l.options.broker_address() != at => {
                l.options = super::v5::options(opts, to, REQUEST_CAPACITY);
            }
            _ => {}
        }
    }
}

/// rumqttc's 3.1.1 options for `opts` on `endpoint`: acks manual unless
/// the session auto-acks.
fn mqtt_options(opts: &Options, endpoint: &Endpoint) -> MqttOptions {
    let mut mqtt = MqttOptions::new(opts.client_id.clone(), endpoint.host.clone(), endpoint.port);
    mqtt.set_keep_alive(opts.keep_alive)
        .set_clean_session(opts.clean_session)
        // Automatic acks are rumqttc's own: sent as the publish is read,
        // never queued behind the client's own publishes (which wait while
        // the broker's inflight window is full).
        .set_manual_acks(!opts.auto_ack)
        .set_inflight(opts.inflight.max(1))
        .set_max_packet_size(opts.max_incoming_packet, opts.max_outgoing_packet)
        .set_request_channel_capacity(REQUEST_CAPACITY);
    if let Some(will) = &opts.last_will {
        mqtt.set_last_will(LastWill::new(
            will.topic.clone(),
            will.payload.clone(),
            QoS::AtLeastOnce,
            will.retain,
        ));
    }
    if let Some((user, pass)) = &opts.credentials {
        mqtt.set_credentials(user.clone(), pass.clone());
    }
    if let Transport::Tls(config) = &opts.transport {
        // rumqttc checks the broker's certificate against the endpoint's
        // host, and sends it as the SNI.
        mqtt.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(config.clone()),
        ));
    }
    mqtt
}

/// Where requests never written begin in rumqttc's `pending`: after the
/// unacknowledged ones it moved there (`was_written`), which lead.
fn first_unsent<R>(
    pending: &std::collections::VecDeque<R>,
    was_written: impl Fn(&R) -> bool,
) -> usize {
    pending
        .iter()
        .position(|r| !was_written(r))
        .unwrap_or(pending.len())
}

/// The session's answer to an error: wait `delay`, then connect to `to`.
pub(super) struct Resume {
    pub delay: Duration,
    pub to: Endpoint,
}

/// What the poller hands the session.
pub(super) enum Polled {
    /// An event; a received publish holds its place in the bound
    /// ([`QUEUED_PUBLISHES`]) until the session has handled it.
    Event(Wire, Option<OwnedSemaphorePermit>),
    /// The connection failed; the poller reconnects after the session
    /// answers with how long to wait.
    Error(LinkError, oneshot::Sender<Resume>),
}

/// Polls the event loop, and nothing else, so a poll is never cancelled
/// but by a stall (see the module doc). With `replay`, rumqttc keeps what
/// it would resend after a reconnect.
pub(super) async fn run(
    mut eventloop: Loop,
    session: mpsc::UnboundedSender<Polled>,
    mut reach: PollerReach,
) {
    let mut opts = reach.latest.borrow_and_update().opts.clone();
    let replay = opts.replay;
    let room = std::sync::Arc::new(Semaphore::new(QUEUED_PUBLISHES));
    // The broker was heard since rumqttc's last PINGREQ.
    let mut heard = false;
    let mut stall = opts.puback_timeout.map(Stall::new);
    // Set for the stall's deadline or an earlier one (deadlines only move
    // later), so it is reset about once a bound, not at every PUBACK: one
    // that fires early is set again.
    let timer = tokio::time::sleep_until(Instant::now());
    tokio::pin!(timer);
    let mut armed = false;
    loop {
        if heard {
            eventloop.alive();
        }
        let stalls_at = stall.as_ref().and_then(Stall::deadline);
        if let Some(at) = stalls_at.filter(|_| !armed) {
            timer.as_mut().reset(at);
            armed = true;
        }
        let polled = tokio::select! {
            // What the broker sent as the deadline passed still counts.
            biased;
            polled = eventloop.poll() => Some(polled),
            _ = &mut timer, if stalls_at.is_some() => None,
        };
        let polled = match (polled, stall.as_mut()) {
            (Some(polled), _) => polled,
            (None, Some(stall)) => {
                armed = false;
                match stalled(&mut eventloop, stall, &opts.name) {
                    Some(e) => Err(e),
                    None => continue,
                }
            }
            (None, None) => continue,
        };
        // Reached a node no longer listed (`session/reach.rs`): leave it
        // before the session hears of it.
        let polled = match polled {
            Ok((Wire::ConnAck { .. }, _)) if !reach.lists(&eventloop.endpoint()) => {
                eventloop.cut();
                Err(super::failure::unlisted(&eventloop.endpoint()))
            }
            polled => polled,
        };
        match polled {
            Ok((event, sign)) => {
                match sign {
                    Sign::Heard => heard = true,
                    Sign::Pinged => heard = false,
                    Sign::Neither => {}
                }
                let progress = match event {
                    Wire::PubAck { .. } => Progress::Acknowledged,
                    Wire::Publish(_) => Progress::Received,
                    _ => Progress::Nothing,
                };
                let place = match event {
                    Wire::Publish(_) => match room.clone().acquire_owned().await {
                        Ok(place) => Some(place),
                        Err(_) => return,
                    },
                    _ => None,
                };
                // After the wait for room: that wait is ours, not the broker's.
                if let Some(stall) = stall.as_mut() {
                    stall.saw(progress, eventloop.outstanding(), Instant::now());
                }
                if session.send(Polled::Event(event, place)).is_err() {
                    return;
                }
            }
            Err(e) => {
                heard = false;
                if let Some(stall) = stall.as_mut() {
                    stall.reset();
                }
                eventloop.end_collision(replay);
                // The pipeline sends again what it needs; rumqttc must not
                // replay the old connection's publishes on its own (one of
                // them may be what the upstream chokes on), nor report
                // events read from it.
                if !replay {
                    for ack in eventloop.salvage_acks() {
                        if session.send(Polled::Event(ack, None)).is_err() {
                            return;
                        }
                    }
                    eventloop.forget();
                }
                let (resume, after) = oneshot::channel();
                if session.send(Polled::Error(e, resume)).is_err() {
                    return;
                }
                let Ok(Resume { delay, to }) = after.await else {
                    return;
                };
                // New settings end the wait; they are taken either way.
                reach.latest.borrow_and_update();
                let to = tokio::select! {
                    _ = tokio::time::sleep(delay) => to,
                    Ok(()) = reach.latest.changed() => reach.latest.borrow_and_update().to.clone(),
                };
                let new = reach.take(&mut opts);
                if new {
                    stall = opts.puback_timeout.map(Stall::new);
                }
                eventloop.retarget(&opts, &to, new);
                if !replay {
                    // Anything queued for the dead connection (publishes
                    // made before the session heard of the drop, acks of
                    // its messages) must not go out on the next one.
                    eventloop.drop_queued();
                }
            }
        }
    }
}

/// The stall `stall` says of the link as its timer fires, if it is one:
/// the connection is cut, one WARN names the node, and the error is the
/// session's to handle. None if the deadline moved on since the timer was
/// set, or if rumqttc read the last PUBACKs as it passed (their events
/// still to come): then nothing waits.
fn stalled(eventloop: &mut Loop, stall: &mut Stall, link: &str) -> Option<LinkError> {
    let (outstanding, now) = (eventloop.outstanding(), Instant::now());
    let Some(s) = stall.stalled(outstanding, now) else {
        stall.saw(Progress::Nothing, outstanding, now);
        return None;
    };
    let endpoint = eventloop.endpoint();
    eventloop.cut();
    tracing::warn!(event = "link_stalled", link = %link, endpoint = %endpoint, outstanding = s.outstanding, waited_ms = s.waited.as_millis() as u64, puback_timeout_ms = stall.bound().as_millis() as u64, "the broker took the session but acknowledged none of the publishes waiting for it within the bound: leaving this node");
    Some(super::failure::stalled(s))
}

/// Stops the poller when the session ends. Its poll may be cut short
/// mid-write then, which is harmless: nobody is left to care.
pub(super) struct PollerGuard(pub(super) tokio::task::JoinHandle<()>);

impl Drop for PollerGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests;
