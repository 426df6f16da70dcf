//! The poller: the one task that polls a session's rumqttc event loop
//! (and the making of that client and loop).
//!
//! `EventLoop::poll` is not safe to cancel: a publish being written when
//! the future is dropped is lost, and its packet id stays taken until
//! rumqttc gives up on the "collision". So this task only polls, in order,
//! never racing anything else, and hands each event to the session. After
//! an error it clears what rumqttc would replay, waits for the session to
//! say how long to back off, and drops whatever was queued for the dead
//! connection before reconnecting.

use std::time::Duration;

use rumqttc::{AsyncClient, ConnectionError, Event, EventLoop, LastWill, MqttOptions, QoS};
use tokio::sync::{mpsc, oneshot};

/// rumqttc's client and event loop for `opts`: acks manual unless the
/// session auto-acks, `capacity` requests queued towards the loop.
pub(super) fn client(opts: &super::Options, capacity: usize) -> (AsyncClient, EventLoop) {
    let mut mqtt = MqttOptions::new(opts.client_id.clone(), opts.host.clone(), opts.port);
    mqtt.set_keep_alive(opts.keep_alive)
        .set_clean_session(opts.clean_session)
        // Automatic acks are rumqttc's own: sent as the publish is read,
        // never queued behind the client's own publishes (which wait while
        // the broker's inflight window is full).
        .set_manual_acks(!opts.auto_ack)
        .set_inflight(opts.inflight.max(1))
        .set_max_packet_size(opts.max_incoming_packet, opts.max_outgoing_packet)
        .set_request_channel_capacity(capacity);
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
    if let super::Transport::Tls(config) = &opts.transport {
        // rumqttc checks the broker's certificate against `host`.
        mqtt.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(config.clone()),
        ));
    }
    let (client, mut eventloop) = AsyncClient::new(mqtt, capacity);
    // Small messages (uplinks, acks, receipts): don't let Nagle hold them.
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    eventloop.set_network_options(net);
    (client, eventloop)
}

/// What the poller hands the session.
pub(super) enum Polled {
    Event(Event),
    /// The connection failed; the poller reconnects after the session
    /// answers with how long to wait.
    Error(ConnectionError, oneshot::Sender<Duration>),
}

/// Polls the event loop, and nothing else, so a poll is never cancelled.
/// With `replay`, rumqttc keeps what it would resend after a reconnect.
pub(super) async fn run(mut eventloop: EventLoop, session: mpsc::Sender<Polled>, replay: bool) {
    loop {
        match eventloop.poll().await {
            Ok(event) => {
                if session.send(Polled::Event(event)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                // The pipeline sends again what it needs; rumqttc must not
                // replay the old connection's publishes on its own (one of
                // them may be what the upstream chokes on), nor report
                // events read from it.
                if !replay {
                    eventloop.pending.clear();
                    eventloop.state.events.clear();
                }
                let (resume, after) = oneshot::channel();
                if session.send(Polled::Error(e, resume)).await.is_err() {
                    return;
                }
                let Ok(delay) = after.await else { return };
                tokio::time::sleep(delay).await;
                if !replay {
                    // Anything queued for the dead connection (publishes
                    // made before the session heard of the drop, acks of
                    // its messages) must not go out on the next one.
                    eventloop.clean();
                    eventloop.pending.clear();
                }
            }
        }
    }
}
