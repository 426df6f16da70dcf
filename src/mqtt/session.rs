//! The session task: owns the rumqttc client side, the connection's
//! lifecycle, the tracked publishes and the ordered acks, and the choice
//! of endpoint (`endpoints.rs`). The poller (`poll.rs`) hands it every
//! event of the event loop.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;
use tracing::{info, warn};

use super::acks::{AckToken, OrderedAcks};
use super::endpoints::Endpoints;
use super::flow::{Flow, Outgoing, Tag};
use super::link::{Link, Stage};
use super::options::{Event, Options, Will, PUBLISH_QUEUE};
use super::poll::{self, Polled as FromPoller, PollerGuard};
use super::wire::{Client, Received, Wire};
use crate::deadlines::sleep_until;

mod failed;
mod failover;
mod incoming;
mod outgoing;
mod reach;
#[cfg(test)]
mod tests;
mod wedge;

/// How soon acks or a SUBSCRIBE that found rumqttc's request queue full
/// try again (any event of the poller tries sooner).
const QUEUE_RETRY: std::time::Duration = std::time::Duration::from_millis(20);
/// Events the session may be ahead of its owner.
const EVENT_QUEUE: usize = 4096;
pub(super) enum Command {
    Ack(AckToken),
    Close(Option<Will>),
    /// Answer these pings (the watchdog's and `/healthz`'s).
    Probed(crate::health::Probed),
    /// Reach the broker so from now on (`reach.rs`).
    Reach(Box<super::options::Reach>),
}

/// What a tracked publish is: the owner's, or the session's own.
#[derive(Debug, Clone, PartialEq)]
enum Tracked<T> {
    Owner(T),
    Announce,
    Farewell,
}

/// What the owner's handle is made of: the session's ends of its queues.
pub(super) struct Parts<T> {
    pub client: Client,
    pub publishes: mpsc::Sender<Outgoing<T>>,
    pub commands: mpsc::UnboundedSender<Command>,
    pub closed: Arc<Notify>,
    pub max_packet: Arc<std::sync::atomic::AtomicUsize>,
}

pub(super) fn start<T: Tag>(opts: Options) -> (Parts<T>, mpsc::Receiver<Event<T>>) {
    let (client, eventloop) = poll::client(&opts);
    let (events_tx, events) = mpsc::channel(EVENT_QUEUE);
    let (polled_tx, polled_rx) = mpsc::unbounded_channel();
    let reaches = super::reached::Reaches::new(&opts);
    let poller = PollerGuard(tokio::spawn(poll::run(
        eventloop,
        polled_tx,
        reaches.poller(),
    )));
    let (commands_tx, commands_rx) = mpsc::unbounded_channel();
    let (publishes_tx, publishes_rx) = mpsc::channel(PUBLISH_QUEUE);
    let closed = Arc::new(Notify::new());
    let max_packet = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
    let opts_keep_alive = opts.keep_alive;
    let task = Task {
        flow: Flow::new(opts.inflight.max(1) as usize),
        endpoints: Endpoints::new(opts.endpoints.clone(), opts.prefer_first),
        first_check: None,
        opts,
        client: client.clone(),
        events: events_tx,
        acks: OrderedAcks::default(),
        unqueued: Default::default(),
        ack_waits_logged: false,
        subscribe_waiting: false,
        epoch: 0,
        closed: closed.clone(),
        probed: None,
        last_polled: Instant::now(),
        max_packet: max_packet.clone(),
        refusals: 0,
        closes: 0,
        link_keep_alive: opts_keep_alive,
        reaches,
    };
    tokio::spawn(task.run(polled_rx, commands_rx, publishes_rx, poller));
    (
        Parts {
            client,
            publishes: publishes_tx,
            commands: commands_tx,
            closed,
            max_packet,
        },
        events,
    )
}

/// The answer of the first endpoint's check under way (`failover.rs`);
/// pending while there is none.
async fn first_check_answer(check: &mut Option<oneshot::Receiver<bool>>) -> bool {
    match check {
        Some(answer) => answer.await.unwrap_or(false),
        None => std::future::pending().await,
    }
}

struct Task<T> {
    opts: Options,
    client: Client,
    events: mpsc::Sender<Event<T>>,
    flow: Flow<Tracked<T>>,
    endpoints: Endpoints,
    /// A check of the first endpoint under way (`prefer_first`).
    first_check: Option<oneshot::Receiver<bool>>,
    acks: OrderedAcks<Received>,
    /// Acks released, in order, that rumqttc's request queue had no room
    /// for yet (`incoming.rs`).
    unqueued: std::collections::VecDeque<Received>,
    /// Whether the wait of the acks in `unqueued` was logged.
    ack_waits_logged: bool,
    /// The SUBSCRIBE of this connection found no room yet.
    subscribe_waiting: bool,
    epoch: u64,
    closed: Arc<Notify>,
    /// Pings to answer, once the owner asked.
    probed: Option<crate::health::Probed>,
    /// When the poller last handed over an event or an error.
    last_polled: Instant,
    /// The largest publish the connection takes (MQTT 5: the broker's
    /// CONNACK says; `usize::MAX`: not checked here), shared with the
    /// owner's handles for their untracked publishes.
    max_packet: Arc<std::sync::atomic::AtomicUsize>,
    /// Publishes the broker refused (MQTT 5 PUBACKs), for the log's bound.
    refusals: u64,
    /// Connections the broker closed soon after accepting them, in a row
    /// (see `failure.rs`).
    closes: u32,
    /// The keep-alive of the connection up (a new one applies from the
    /// next connection; until then the longer of the two).
    link_keep_alive: std::time::Duration,
    /// New ways to reach the broker, handed to the poller (`reach.rs`).
    reaches: super::reached::Reaches,
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
            || self.last_polled.elapsed() < self.link_keep_alive * 3
    }

    async fn run(
        mut self,
        mut polled: mpsc::UnboundedReceiver<FromPoller>,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut publishes: mpsc::Receiver<Outgoing<T>>,
        // Dropped (and the connection with it) when the session ends.
        _poller: PollerGuard,
    ) {
        let mut link = Link::Down { failures: 0 };
        let mut handles = true;
        let wedge_at = wedge::test_wedge(&self.opts.name);
        loop {
            if wedge_at.is_some_and(|at| Instant::now() >= at) {
                warn!(event = "link_session_wedged", link = %self.opts.name, "session task wedged on purpose (TEST_FERRY_WEDGE_*_AFTER_MS)");
                std::future::pending::<()>().await;
            }
            let connected = matches!(link, Link::Connected { .. });
            if connected && self.hand_over().await.is_none() {
                return;
            }
            if !self.unqueued.is_empty() {
                self.queue_acks();
            }
            if self.subscribe_waiting {
                self.subscribe_all();
            }
            let retry = (!self.unqueued.is_empty() || self.subscribe_waiting)
                .then(|| Instant::now() + QUEUE_RETRY);
            let probe_deadline = self.flow.probe_deadline();
            let check_at = self
                .endpoints
                .check_at()
                .filter(|_| self.first_check.is_none());
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
                        Some(Command::Reach(reach)) => link = self.reach(*reach, link),
                        Some(Command::Close(farewell)) => match link {
                            Link::Connected { .. } => {
                                self.leave(farewell);
                                link = Link::Closing;
                            }
                            Link::Down { .. } => {
                                self.closed.notify_waiters();
                                return;
                            }
                            // Its DISCONNECT is on the way already.
                            Link::Moving => link = Link::Closing,
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
                _ = sleep_until(check_at), if check_at.is_some() => {
                    self.check_first();
                    continue;
                }
                accepts = first_check_answer(&mut self.first_check) => {
                    self.first_check = None;
                    link = self.checked_first(accepts, link);
                    continue;
                }
                // Acks or the SUBSCRIBE wait for room: the next turn tries again.
                _ = sleep_until(retry), if retry.is_some() => continue,
                _ = sleep_until(probe_deadline), if probe_deadline.is_some() => {
                    if let Some(tag) = self.flow.expire_probe(Instant::now()) {
                        warn!(event = "link_probe_unanswered", link = %self.opts.name, tag = ?tag, "probe neither acknowledged nor refused; resuming");
                    }
                    continue;
                }
            };
            let next = match polled {
                // A publish's place in the poller's bound frees once handled.
                FromPoller::Event(event, _place) => self.on_event(event, link).await,
                FromPoller::Error(e, resume) => self.on_error(e, resume, link).await,
            };
            match next {
                Some(next) => link = next,
                None => return,
            }
        }
    }

    /// Handles one event; `None` ends the session.
    async fn on_event(&mut self, event: Wire, link: Link) -> Option<Link> {
        match (event, link) {
            (
                Wire::ConnAck {
                    session_present,
                    max_packet,
                },
                Link::Down { failures },
            ) => {
                self.epoch += 1;
                self.flow.connected(self.epoch);
                self.acks.connected(self.epoch);
                self.set_max_packet(max_packet);
                if self.reaches.connected() {
                    self.link_keep_alive = self.opts.keep_alive;
                }
                self.connected_to_endpoint(session_present);
                if self.opts.subscriptions.is_empty() {
                    // No SubAck will come.
                    return self
                        .subscribed(Instant::now(), failures, session_present, Vec::new())
                        .await;
                }
                self.subscribe_all();
                Some(Link::Connected {
                    at: Instant::now(),
                    failures,
                    stage: Stage::Subscribing { session_present },
                })
            }
            (
                Wire::SubAck(codes),
                Link::Connected {
                    at,
                    failures,
                    stage: Stage::Subscribing { session_present },
                },
            ) => {
                let (refused, reasons): (Vec<String>, Vec<&str>) = codes
                    .iter()
                    .zip(&self.opts.subscriptions)
                    .filter_map(|(code, filter)| code.map(|reason| (filter.clone(), reason)))
                    .unzip();
                if !refused.is_empty() {
                    warn!(event = "link_subscriptions_refused", link = %self.opts.name, filters = ?refused, reasons = ?reasons, "the broker refused subscriptions; check its ACL");
                }
                self.subscribed(at, failures, session_present, refused)
                    .await
            }
            (Wire::Written(pkid), link) => {
                self.flow.written(pkid, Instant::now());
                Some(link)
            }
            (Wire::AwaitAck(pkid), link) => {
                self.flow.collision(pkid);
                Some(link)
            }
            (Wire::PubAck { pkid, refused }, link) => self.on_puback(pkid, refused, link).await,
            (Wire::Publish(p), link) => {
                self.on_publish(p).await?;
                Some(link)
            }
            // Leaving for the first endpoint: the drop follows.
            (Wire::Disconnect, Link::Moving) => Some(Link::Moving),
            (Wire::Disconnect, _) => {
                info!(event = "link_session_closed", link = %self.opts.name, "session closed");
                self.closed.notify_waiters();
                None
            }
            (_, link) => Some(link),
        }
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
                self.up(session_present, refused).await?;
                Stage::Up
            }
        };
        Some(Link::Connected {
            at,
            failures,
            stage,
        })
    }

    /// Tells the owner the link is up (and starts the checks of the first
    /// endpoint, if it is on a later one).
    async fn up(&mut self, session_present: bool, refused: Vec<String>) -> Option<()> {
        self.endpoints.up(Instant::now());
        let (endpoint, node) = self.endpoints.current();
        let node = node.clone();
        self.emit(Event::Up {
            epoch: self.epoch,
            endpoint,
            node,
            session_present,
            refused,
        })
        .await
    }

    async fn emit(&self, event: Event<T>) -> Option<()> {
        self.events.send(event).await.ok()
    }

    /// Queues the SUBSCRIBE; if rumqttc's queue has no room, the loop
    /// tries again (`subscribe_waiting`) until it does or the link drops.
    fn subscribe_all(&mut self) {
        // Every time: rumqttc does not restore subscriptions, and a repeat
        // is harmless.
        self.subscribe_waiting = self
            .client
            .try_subscribe_many(&self.opts.subscriptions)
            .is_err();
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
            let _ = self
                .client
                .try_publish(out.topic, out.retain, out.body.to_vec());
        }
        if !self.client.try_disconnect() {
            self.closed.notify_waiters();
        }
    }
}
