//! The harness's MQTT clients, all on ferry's own session
//! ([`ferry::mqtt::Session`]): [`Session`] is what the device and backend
//! helpers ([`super::clients`]) are built on; [`BareClient`] is a session
//! with nothing on top, for misbehaving devices and malformed input.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use ferry::mqtt::{self, Event, Message, Reconnect};
use ferry::protocol::control::{self, Status};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::{Ferry, Mode, CONNECT_TIMEOUT, MAX_PACKET};

static CLIENT_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique client id with a readable prefix.
pub fn unique_client_id(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        CLIENT_COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Called for every incoming message, before it is queued for the test.
pub type PublishHook = Box<dyn Fn(&Message) + Send + Sync>;

/// Sends QoS 1 publishes on a session, from any task.
#[derive(Clone)]
pub struct Client(mqtt::Session<()>);

impl Client {
    /// Queues a QoS 1 publish, waiting for room; false once the session
    /// is gone.
    pub async fn publish(&self, topic: impl Into<String>, bytes: impl Into<Vec<u8>>) -> bool {
        self.0.send_wait(topic, bytes, false).await
    }

    /// Like [`Client::publish`], retained.
    pub async fn publish_retained(
        &self,
        topic: impl Into<String>,
        bytes: impl Into<Vec<u8>>,
    ) -> bool {
        self.0.send_wait(topic, bytes, true).await
    }
}

/// Passwords of devices of gateways with `south.auth = "password"`, by
/// (south port, device id): a device of such a gateway knows its password,
/// so every client of the harness logs in with it there.
static LOGINS: Mutex<BTreeMap<(u16, String), String>> = Mutex::new(BTreeMap::new());

/// From now on, clients connecting to `port` as `device` log in with
/// `password` (username = device id).
pub fn register_login(port: u16, device: &str, password: &str) {
    LOGINS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((port, device.to_string()), password.to_string());
}

/// The login a client with `client_id` uses on `port`, if any.
pub fn login_for(port: u16, client_id: &str) -> Option<(String, String)> {
    LOGINS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(port, client_id.to_string()))
        .map(|p| (client_id.to_string(), p.clone()))
}

/// Options for a test client: reconnects quickly (tests restart brokers).
fn options(client_id: &str, port: u16, filters: Vec<String>, clean_session: bool) -> mqtt::Options {
    options_via(
        mqtt::Transport::Tcp,
        client_id,
        port,
        filters,
        clean_session,
    )
}

/// [`options`] over `transport`.
fn options_via(
    transport: mqtt::Transport,
    client_id: &str,
    port: u16,
    filters: Vec<String>,
    clean_session: bool,
) -> mqtt::Options {
    let mut o = mqtt::Options::new(client_id, "127.0.0.1", port, client_id);
    o.credentials = login_for(port, client_id);
    o.transport = transport;
    o.max_incoming_packet = MAX_PACKET;
    o.max_outgoing_packet = MAX_PACKET;
    o.clean_session = clean_session;
    o.keep_alive = Duration::from_secs(10);
    o.subscriptions = filters;
    o.reconnect = Reconnect {
        base: Duration::from_millis(100),
        max: Duration::from_millis(500),
        stable_after: Duration::ZERO,
    };
    o
}

/// A session that forwards incoming messages and counts connections.
pub struct Session {
    pub client: Client,
    incoming: mpsc::UnboundedReceiver<Message>,
    /// Connections that got as far as subscribed (one per (re)connect).
    pub subacks: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl Session {
    /// Connects and re-subscribes `filters` on every connection; returns
    /// once the first connection is subscribed.
    pub async fn connect(
        client_id: &str,
        port: u16,
        filters: Vec<String>,
        clean_session: bool,
        hook: Option<PublishHook>,
    ) -> Session {
        let tcp = mqtt::Transport::Tcp;
        Session::connect_via(tcp, client_id, port, filters, clean_session, hook).await
    }

    /// [`Session::connect`] over `transport` (TLS, for instance).
    pub async fn connect_via(
        transport: mqtt::Transport,
        client_id: &str,
        port: u16,
        filters: Vec<String>,
        clean_session: bool,
        hook: Option<PublishHook>,
    ) -> Session {
        let opts = options_via(transport, client_id, port, filters, clean_session);
        let (session, mut events) = mqtt::Session::start(opts);
        let (tx, incoming) = mpsc::unbounded_channel();
        let (subacks_tx, subacks) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                match event {
                    Event::Up { .. } => subacks_tx.send_modify(|n| *n += 1),
                    Event::Message(m) => {
                        if let Some(hook) = &hook {
                            hook(&m);
                        }
                        let _ = tx.send(m);
                    }
                    _ => {}
                }
            }
        });
        let mut session = Session {
            client: Client(session),
            incoming,
            subacks,
            task,
        };
        assert!(
            session.wait_subacks(1, CONNECT_TIMEOUT).await,
            "client {client_id} was not connected and subscribed at 127.0.0.1:{port} within {CONNECT_TIMEOUT:?}"
        );
        session
    }

    /// Waits until at least `n` connections were subscribed; false after
    /// `timeout`.
    pub async fn wait_subacks(&mut self, n: u64, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.subacks.wait_for(|c| *c >= n))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    /// Collects `parse`d messages until `done(all collected so far)` holds
    /// or `timeout` passes; returns what it collected either way.
    pub async fn collect_until<T>(
        &mut self,
        timeout: Duration,
        parse: impl Fn(&Message) -> T,
        mut done: impl FnMut(&[T]) -> bool,
    ) -> Vec<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut all = Vec::new();
        while !done(&all) {
            match tokio::time::timeout_at(deadline, self.incoming.recv()).await {
                Ok(Some(m)) => all.push(parse(&m)),
                _ => break,
            }
        }
        all
    }

    /// The next incoming message; `None` after `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Message> {
        tokio::time::timeout(timeout, self.incoming.recv())
            .await
            .ok()
            .flatten()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Ends the event reader, and with it the session and its connection.
        self.task.abort();
    }
}

/// A bare client: re-subscribes `filters` on every connection and hands
/// over incoming messages as they are. For devices that misbehave or whose
/// raw batches a test inspects, and for publishing malformed bytes.
pub struct BareClient {
    session: Session,
}

impl BareClient {
    /// Connects with a clean session; returns once `filters` are subscribed
    /// (once connected when there are none).
    pub async fn connect(port: u16, client_id: &str, filters: Vec<String>) -> BareClient {
        BareClient {
            session: Session::connect(client_id, port, filters, true, None).await,
        }
    }

    /// [`BareClient::connect`] over TLS with `tls`.
    pub async fn connect_tls(
        port: u16,
        client_id: &str,
        filters: Vec<String>,
        tls: Arc<rustls::ClientConfig>,
    ) -> BareClient {
        let transport = mqtt::Transport::Tls(tls);
        BareClient {
            session: Session::connect_via(transport, client_id, port, filters, true, None).await,
        }
    }

    /// A device of `ferry` subscribed to its inbox only, confirming
    /// nothing by itself. Behind a site broker (external mode) it says it is
    /// online, retained, as the protocol has devices do: that is all ferry
    /// learns of its presence there, also after ferry restarts. (The
    /// embedded broker reports the subscription itself.)
    pub async fn device(ferry: &Ferry, id: &str) -> BareClient {
        let topics = super::clients::device_topics(id);
        let client = BareClient::connect(ferry.south_port, id, vec![topics.inbox()]).await;
        if ferry.mode == Mode::External {
            let online = control::to_bytes(&Status {
                online: true,
                ts: None,
            });
            assert!(
                client
                    .session
                    .client
                    .publish_retained(topics.status(), online)
                    .await,
                "status queued"
            );
        }
        client
    }

    /// Publishes bytes on any topic at QoS 1.
    pub async fn publish(&self, topic: &str, bytes: impl Into<Vec<u8>>) {
        assert!(
            self.session.client.publish(topic, bytes).await,
            "publish queued"
        );
    }

    /// The next incoming publish as JSON; `None` after `timeout`.
    pub async fn next_json(&mut self, timeout: Duration) -> Option<Value> {
        let m = self.session.next(timeout).await?;
        Some(serde_json::from_slice(&m.payload).unwrap_or_else(|e| {
            panic!(
                "not JSON on {} ({e}): {:?}",
                m.topic,
                String::from_utf8_lossy(&m.payload)
            )
        }))
    }

    /// The next alert of `kind` (on a client subscribed to an alerts
    /// topic), skipping others; `None` after `timeout`.
    pub async fn next_alert(&mut self, kind: &str, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let a = self.next_json(left).await?;
            if a["kind"] == kind {
                return Some(a);
            }
        }
    }

    /// Connections subscribed so far (one per (re)connect).
    pub fn subacks(&self) -> u64 {
        *self.session.subacks.borrow()
    }
}

/// Connects and at once drops a client with `id`: the broker takes the
/// device's session over, so the device's real client is cut off and
/// reconnects.
pub async fn cut_off(south_port: u16, id: &str) {
    let (_session, mut events) =
        mqtt::Session::<()>::start(options(id, south_port, Vec::new(), true));
    let up = async {
        while let Some(event) = events.recv().await {
            if matches!(event, Event::Up { .. }) {
                return true;
            }
        }
        false
    };
    assert!(
        matches!(
            tokio::time::timeout(Duration::from_secs(20), up).await,
            Ok(true)
        ),
        "intruder {id} got no ConnAck within 20 s"
    );
}
