//! The session task: owns the rumqttc client side, the connection's
//! lifecycle, the tracked publishes and the ordered acks. The poller
//! (`poll.rs`) hands it every event of the event loop.

use std::sync::Arc;

use rumqttc::{
    AsyncClient, ConnectionError, Event as Polled, Outgoing as Sent, Packet, Publish, QoS,
    SubscribeFilter, SubscribeReasonCode,
};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::acks::{AckToken, OrderedAcks};
use super::flow::{Flow, Outgoing, Tag};
use super::poll::{self, Polled as FromPoller};
use super::{Event, Message, Options, Session, Will, OVERSIZE_HEAD, PUBLISH_QUEUE};
use crate::deadlines::sleep_until;

/// Requests (publishes, acks) queued towards the event loop.
const REQUEST_CAPACITY: usize = 65_536;
/// Events the poller may be ahead of the session.
const POLLED_QUEUE: usize = 1024;
/// Events the session may be ahead of its owner.
const EVENT_QUEUE: usize = 4096;

pub(super) enum Command {
    Ack(AckToken),
    Close(Option<Will>),
    /// Answer these pings (the watchdog's and `/healthz`'s).
    Probed(crate::health::Probed),
}

/// What a tracked publish is: the owner's, or the session's own.
#[derive(Debug, Clone, PartialEq)]
enum Tracked<T> {
    Owner(T),
    Announce,
    Farewell,
}

/// The connection's lifecycle.
enum Link {
    /// Connecting, or waiting to reconnect after `failures` failures.
    Down { failures: u32 },
    /// Connected since `at`, `failures` before it.
    Connected {
        at: Instant,
        failures: u32,
        stage: Stage,
    },
    /// DISCONNECT requested; the session ends when it is written.
    Closing,
}

/// How far a connection got.
#[derive(Debug, PartialEq)]
enum Stage {
    /// Waiting for the SubAck.
    Subscribing { session_present: bool },
    /// Subscribed; the announce is out, alone, so that a drop is never
    /// blamed on it when the owner's traffic follows.
    Announcing {
        session_present: bool,
        refused: Vec<String>,
    },
    /// `Up` was told: the owner publishes.
    Up,
}

pub(super) fn start<T: Tag>(opts: Options) -> (Session<T>, mpsc::Receiver<Event<T>>) {
    let (client, eventloop) = poll::client(&opts, REQUEST_CAPACITY);
    let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
    let (polled_tx, polled_rx) = mpsc::channel(POLLED_QUEUE);
    let poller = PollerGuard(tokio::spawn(poll::run(eventloop, polled_tx, opts.replay)));
    let (commands_tx, commands_rx) = mpsc::unbounded_channel();
    let (publishes_tx, publishes_rx) = mpsc::channel(PUBLISH_QUEUE);
    let closed = Arc::new(Notify::new());
    let task = Task {
        flow: Flow::new(opts.inflight.max(1) as usize),
        opts,
        client: client.clone(),
        events: events_tx,
        acks: OrderedAcks::default(),
        epoch: 0,
        closed: closed.clone(),
        probed: None,
        last_polled: Instant::now(),
    };
    tokio::spawn(task.run(polled_rx, commands_rx, publishes_rx, poller));
    (
        Session {
            client,
            publishes: publishes_tx,
            commands: commands_tx,
            closed,
        },
        events,
    )
}

struct Task<T> {
    opts: Options,
    client: AsyncClient,
    events: mpsc::Sender<Event<T>>,
    flow: Flow<Tracked<T>>,
    acks: OrderedAcks<Publish>,
    epoch: u64,
    closed: Arc<Notify>,
    /// Pings to answer, once the owner asked.
    probed: Option<crate::health::Probed>,
    /// When the poller last handed over an event or an error.
    last_polled: Instant,
}

/// The next ping of `probed`; pending while there is none to answer.
async fn next_ping(probed: &mut Option<crate::health::Probed>) -> oneshot::Sender<()> {
    match probed {
        Some(p) => p.recv().await,
        None => std::future::pending().await,
    }
}

impl<T: Tag> Task<T> {
    /// Whether the poller is alive: connected, it hands over at least
    /// rumqttc's keep-alive pings; otherwise it is connecting or backing
    /// off, which takes no events.
    fn poller_alive(&self, link: &Link) -> bool {
        !matches!(link, Link::Connected { .. })
            || self.last_polled.elapsed() < self.opts.keep_alive * 3
    }

    async fn run(
        mut self,
        mut polled: mpsc::Receiver<FromPoller>,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut publishes: mpsc::Receiver<Outgoing<T>>,
        // Dropped (and the connection with it) when the session ends.
        _poller: PollerGuard,
    ) {
        let mut link = Link::Down { failures: 0 };
        let mut handles = true;
        let wedge_at = test_wedge(&self.opts.name);
        loop {
            if wedge_at.is_some_and(|at| Instant::now() >= at) {
                warn!(event = "link_session_wedged", link = %self.opts.name, "session task wedged on purpose (TEST_FERRY_WEDGE_*_AFTER_MS)");
                std::future::pending::<()>().await;
            }
            let connected = matches!(link, Link::Connected { .. });
            if connected {
                self.hand_over();
            }
            let probe_deadline = self.flow.probe_deadline();
            let polled = tokio::select! {
                polled = polled.recv() => match polled {
                    Some(p) => {
                        self.last_polled = Instant::now();
                        p
                    }
                    None => return,
                },
                ack = next_ping(&mut self.probed) => {
                    if self.poller_alive(&link) {
                        let _ = ack.send(());
                    }
                    continue;
                }
                // The owner is gone: so is the session.
                _ = self.events.closed() => return,
                command = commands.recv(), if handles => {
                    match command {
                        Some(Command::Ack(token)) => self.ready(token),
                        Some(Command::Probed(probed)) => self.probed = Some(probed),
                        Some(Command::Close(farewell)) => match link {
                            Link::Connected { .. } => {
                                self.leave(farewell);
                                link = Link::Closing;
                            }
                            Link::Down { .. } => {
                                self.closed.notify_waiters();
                                return;
                            }
                            Link::Closing => {}
                        },
                        // Every handle is gone; the owner still reads events.
                        None => handles = false,
                    }
                    continue;
                }
                Some(out) = publishes.recv(), if connected && self.flow.held() < PUBLISH_QUEUE => {
                    self.flow.submit(Outgoing {
                        topic: out.topic,
                        body: out.body,
                        retain: out.retain,
                        tag: Tracked::Owner(out.tag),
                        epoch: out.epoch,
                    });
                    continue;
                }
                _ = sleep_until(probe_deadline), if probe_deadline.is_some() => {
                    if let Some(tag) = self.flow.expire_probe(Instant::now()) {
                        warn!(event = "link_probe_unanswered", link = %self.opts.name, tag = ?tag, "probe neither acknowledged nor refused; resuming");
                    }
                    continue;
                }
            };
            let next = match polled {
                FromPoller::Event(event) => self.on_event(event, link).await,
                FromPoller::Error(e, resume) => self.on_error(e, resume, link).await,
            };
            match next {
                Some(next) => link = next,
                None => return,
            }
        }
    }

    /// Handles one event; `None` ends the session.
    async fn on_event(&mut self, event: Polled, link: Link) -> Option<Link> {
        match (event, link) {
            (Polled::Incoming(Packet::ConnAck(ack)), Link::Down { failures }) => {
                self.epoch += 1;
                self.flow.connected(self.epoch);
                self.acks.connected(self.epoch);
                info!(event = "link_connected", link = %self.opts.name, host = %self.opts.host, port = self.opts.port, session_present = ack.session_present, epoch = self.epoch, "connected");
                if self.opts.subscriptions.is_empty() {
                    // No SubAck will come.
                    return self
                        .subscribed(Instant::now(), failures, ack.session_present, Vec::new())
                        .await;
                }
                self.subscribe_all();
                Some(Link::Connected {
                    at: Instant::now(),
                    failures,
                    stage: Stage::Subscribing {
                        session_present: ack.session_present,
                    },
                })
            }
            (
                Polled::Incoming(Packet::SubAck(suback)),
                Link::Connected {
                    at,
                    failures,
                    stage: Stage::Subscribing { session_present },
                },
            ) => {
                let refused: Vec<String> = suback
                    .return_codes
                    .iter()
                    .zip(&self.opts.subscriptions)
                    .filter(|(code, _)| matches!(code, SubscribeReasonCode::Failure))
                    .map(|(_, filter)| filter.clone())
                    .collect();
                if !refused.is_empty() {
                    warn!(event = "link_subscriptions_refused", link = %self.opts.name, filters = ?refused, "the broker refused subscriptions; check its ACL");
                }
                self.subscribed(at, failures, session_present, refused)
                    .await
            }
            (Polled::Outgoing(Sent::Publish(pkid)), link) => {
                self.flow.written(pkid, Instant::now());
                Some(link)
            }
            (Polled::Outgoing(Sent::AwaitAck(pkid)), link) => {
                self.flow.collision(pkid);
                Some(link)
            }
            (Polled::Incoming(Packet::PubAck(ack)), link) => {
                match (self.flow.acked(ack.pkid), link) {
                    (
                        Some(Tracked::Announce),
                        Link::Connected {
                            at,
                            failures,
                            stage:
                                Stage::Announcing {
                                    session_present,
                                    refused,
                                },
                        },
                    ) => {
                        self.emit(Event::Up {
                            epoch: self.epoch,
                            session_present,
                            refused,
                        })
                        .await?;
                        Some(Link::Connected {
                            at,
                            failures,
                            stage: Stage::Up,
                        })
                    }
                    (Some(Tracked::Owner(tag)), link) => {
                        self.emit(Event::Published(tag)).await?;
                        Some(link)
                    }
                    (_, link) => Some(link),
                }
            }
            (Polled::Incoming(Packet::Publish(p)), link) => {
                self.on_publish(p).await?;
                Some(link)
            }
            (Polled::Outgoing(Sent::Disconnect), _) => {
                info!(event = "link_session_closed", link = %self.opts.name, "session closed");
                self.closed.notify_waiters();
                None
            }
            (_, link) => Some(link),
        }
    }

    /// The connection failed; `None` ends the session.
    async fn on_error(
        &mut self,
        e: ConnectionError,
        resume: oneshot::Sender<std::time::Duration>,
        link: Link,
    ) -> Option<Link> {
        // What was received on the lost connection the broker sends again;
        // its acks must not go out on the next one.
        self.acks.lost();
        let strike = self.flow.lost(Instant::now());
        let mut failures = match link {
            Link::Closing => {
                self.closed.notify_waiters();
                return None;
            }
            Link::Down { failures } => failures,
            Link::Connected {
                at,
                failures,
                stage,
            } => {
                if stage == Stage::Up {
                    self.emit(Event::Down).await?;
                }
                if at.elapsed() >= self.opts.reconnect.stable_after {
                    0
                } else {
                    failures
                }
            }
        };
        let delay = match strike {
            Some(Tracked::Owner(tag)) => {
                warn!(event = "link_dropped_on_message", link = %self.opts.name, tag = ?tag, error = %e, "the broker dropped the link on this message");
                self.emit(Event::Refused(tag)).await?;
                // A drop explained by one message is no reason to wait
                // longer: that message backs off on its own.
                self.opts.reconnect.delay(0)
            }
            _ => {
                failures = failures.saturating_add(1);
                self.opts.reconnect.delay(failures - 1)
            }
        };
        // The first failures of an outage are worth a warning; the rest
        // only say the same thing again.
        if failures <= 3 || failures.is_power_of_two() {
            warn!(event = "link_down", link = %self.opts.name, host = %self.opts.host, port = self.opts.port, error = %e, failures, retry_in_ms = delay.as_millis() as u64, "link down");
        } else {
            debug!(link = %self.opts.name, error = %e, failures, "link still down");
        }
        let _ = resume.send(delay);
        Some(Link::Down { failures })
    }

    /// Subscribed: announce, or tell the owner the link is up.
    async fn subscribed(
        &mut self,
        at: Instant,
        failures: u32,
        session_present: bool,
        refused: Vec<String>,
    ) -> Option<Link> {
        let stage = match self.opts.announce.clone() {
            Some(announce) => {
                self.flow.submit(Outgoing {
                    topic: announce.topic,
                    body: (announce.body)(),
                    retain: true,
                    tag: Tracked::Announce,
                    epoch: self.epoch,
                });
                Stage::Announcing {
                    session_present,
                    refused,
                }
            }
            None => {
                self.emit(Event::Up {
                    epoch: self.epoch,
                    session_present,
                    refused,
                })
                .await?;
                Stage::Up
            }
        };
        Some(Link::Connected {
            at,
            failures,
            stage,
        })
    }

    async fn emit(&self, event: Event<T>) -> Option<()> {
        self.events.send(event).await.ok()
    }

    fn subscribe_all(&self) {
        // Every time: rumqttc does not restore subscriptions, and a repeat
        // is harmless.
        let filters = self
            .opts
            .subscriptions
            .iter()
            .map(|f| SubscribeFilter::new(f.clone(), QoS::AtLeastOnce));
        if let Err(e) = self.client.try_subscribe_many(filters) {
            warn!(event = "link_subscribe_not_queued", link = %self.opts.name, error = %e, "subscribe could not be queued");
        }
    }

    /// Hands rumqttc every tracked publish that may go now.
    fn hand_over(&mut self) {
        while let Some(out) = self.flow.next_to_send() {
            let payload = out.body.to_vec();
            if self
                .client
                .try_publish(out.topic.clone(), QoS::AtLeastOnce, out.retain, payload)
                .is_err()
            {
                self.flow.refused_by_client(out);
                return;
            }
        }
    }

    /// The farewell, ahead of anything held, then DISCONNECT.
    fn leave(&mut self, farewell: Option<Will>) {
        if let Some(will) = farewell {
            let out = self.flow.bypass(Outgoing {
                topic: will.topic,
                body: will.payload,
                retain: will.retain,
                tag: Tracked::Farewell,
                epoch: self.epoch,
            });
            let _ =
                self.client
                    .try_publish(out.topic, QoS::AtLeastOnce, out.retain, out.body.to_vec());
        }
        if self.client.try_disconnect().is_err() {
            self.closed.notify_waiters();
        }
    }

    /// Hands one incoming publish to the owner.
    async fn on_publish(&mut self, p: Publish) -> Option<()> {
        let size = p.topic.len() + p.payload.len();
        let oversize = (size > self.opts.max_message_bytes).then_some(size);
        let payload = match oversize {
            Some(_) => p.payload.slice(..OVERSIZE_HEAD.min(p.payload.len())),
            None => p.payload.clone(),
        };
        let message = Message {
            topic: p.topic.clone(),
            payload,
            retain: p.retain,
            token: AckToken::default(),
            oversize,
        };
        let message = if p.qos == QoS::AtMostOnce || self.opts.auto_ack {
            message
        } else {
            let token = self.acks.received(p);
            Message { token, ..message }
        };
        self.emit(Event::Message(message)).await
    }

    fn ready(&mut self, token: AckToken) {
        for publish in self.acks.ready(token) {
            if let Err(e) = self.client.try_ack(&publish) {
                warn!(event = "link_ack_not_queued", link = %self.opts.name, error = %e, "ack could not be queued");
            }
        }
    }
}

/// Stops the poller when the session ends. Its poll may be cut short
/// mid-write then, which is harmless: nobody is left to care.
struct PollerGuard(tokio::task::JoinHandle<()>);

impl Drop for PollerGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `TEST_FERRY_WEDGE_NORTH_AFTER_MS=N` (`TEST_FERRY_WEDGE_SOUTH_AFTER_MS`:
/// the external south session) makes that session's task stop for good at
/// its first turn N ms after it started, as a task stuck in an await
/// would. Not `FERRY_*`: those are config keys. Release builds never read
/// it.
fn test_wedge(name: &str) -> Option<Instant> {
    let var = match name {
        "north" => "TEST_FERRY_WEDGE_NORTH_AFTER_MS",
        "south" => "TEST_FERRY_WEDGE_SOUTH_AFTER_MS",
        _ => return None,
    };
    if !cfg!(debug_assertions) {
        return None;
    }
    let ms: u64 = std::env::var(var).ok()?.parse().ok()?;
    Some(Instant::now() + std::time::Duration::from_millis(ms))
}
