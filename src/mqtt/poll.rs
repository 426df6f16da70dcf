//! The poller: the one task that polls a session's rumqttc event loop.
//!
//! `EventLoop::poll` is not safe to cancel: a publish being written when
//! the future is dropped is lost, and its packet id stays taken until
//! rumqttc gives up on the "collision". So this task only polls, in order,
//! never racing anything else, and hands each event to the session. After
//! an error it clears what rumqttc would replay, waits for the session to
//! say how long to back off, and drops whatever was queued for the dead
//! connection before reconnecting.

use std::time::Duration;

use rumqttc::{ConnectionError, Event};
use tokio::sync::{mpsc, oneshot};

/// What the poller hands the session.
pub(super) enum Polled {
    Event(Event),
    /// The connection failed; the poller reconnects after the session
    /// answers with how long to wait.
    Error(ConnectionError, oneshot::Sender<Duration>),
}

/// Polls the event loop, and nothing else, so a poll is never cancelled.
/// With `replay`, rumqttc keeps what it would resend after a reconnect.
pub(super) async fn run(
    mut eventloop: rumqttc::EventLoop,
    session: mpsc::Sender<Polled>,
    replay: bool,
) {
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
