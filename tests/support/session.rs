//! The harness's rumqttc clients: every rumqttc event loop of the tests
//! lives in this file, so that moving them to another MQTT session is a
//! change in one place. [`Session`] is the loop the device and backend
//! helpers ([`super::clients`]) are built on; [`BareClient`] is a session
//! with nothing on top, for misbehaving devices and malformed input.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, Publish, QoS};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::{CONNECT_TIMEOUT, MAX_PACKET};

/// Pause after every event-loop error (rumqttc reconnects with no backoff).
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

static CLIENT_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique client id with a readable prefix.
pub fn unique_client_id(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        CLIENT_COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Called from the event-loop task for every incoming publish.
pub type PublishHook = Box<dyn Fn(&Publish) + Send + Sync>;

/// An rumqttc client whose event loop runs in its own task; it
/// re-subscribes after every ConnAck and forwards incoming publishes.
pub struct Session {
    pub client: AsyncClient,
    incoming: mpsc::UnboundedReceiver<Publish>,
    pub subacks: watch::Receiver<u64>,
    connacks: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl Session {
    /// Connects and re-subscribes `filters` after every ConnAck; returns
    /// after the first SubAck (the first ConnAck when `filters` is empty).
    pub async fn connect(
        client_id: &str,
        port: u16,
        filters: Vec<String>,
        clean_session: bool,
        hook: Option<PublishHook>,
    ) -> Session {
        let mut options = MqttOptions::new(client_id, "127.0.0.1", port);
        options.set_max_packet_size(MAX_PACKET, MAX_PACKET);
        options.set_clean_session(clean_session);
        options.set_keep_alive(Duration::from_secs(10));
        let (client, mut eventloop) = AsyncClient::new(options, 256);
        let (tx, incoming) = mpsc::unbounded_channel();
        let (subacks_tx, subacks) = watch::channel(0u64);
        let (connacks_tx, connacks) = watch::channel(0u64);
        let resubscriber = client.clone();
        let wants_subscription = !filters.is_empty();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        connacks_tx.send_modify(|n| *n += 1);
                        if !filters.is_empty() {
                            // Not awaited here: the request channel is drained
                            // by this very loop.
                            let client = resubscriber.clone();
                            let topics: Vec<_> = filters
                                .iter()
                                .map(|f| rumqttc::SubscribeFilter::new(f.clone(), QoS::AtLeastOnce))
                                .collect();
                            tokio::spawn(async move {
                                let _ = client.subscribe_many(topics).await;
                            });
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        subacks_tx.send_modify(|n| *n += 1);
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if let Some(hook) = &hook {
                            hook(&p);
                        }
                        let _ = tx.send(p);
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(RECONNECT_PAUSE).await,
                }
            }
        });
        let mut session = Session {
            client,
            incoming,
            subacks,
            connacks,
            task,
        };
        let ready = if wants_subscription {
            session.wait_subacks(1, CONNECT_TIMEOUT).await
        } else {
            let connacks = session.connacks.wait_for(|c| *c >= 1);
            matches!(
                tokio::time::timeout(CONNECT_TIMEOUT, connacks).await,
                Ok(Ok(_))
            )
        };
        assert!(
            ready,
            "client {client_id} got no {} from 127.0.0.1:{port} within {CONNECT_TIMEOUT:?}",
            if wants_subscription {
                "SubAck"
            } else {
                "ConnAck"
            }
        );
        session
    }

    /// Waits until at least `n` SubAcks were seen; false after `timeout`.
    pub async fn wait_subacks(&mut self, n: u64, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.subacks.wait_for(|c| *c >= n))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    /// The next incoming publish; `None` after `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Publish> {
        tokio::time::timeout(timeout, self.incoming.recv())
            .await
            .ok()
            .flatten()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A bare rumqttc client: re-subscribes `filters` after every ConnAck and
/// hands over incoming publishes as they are. For devices that misbehave or
/// whose raw batches a test inspects, and for publishing malformed bytes.
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

    /// A device subscribed to its inbox only, confirming nothing by itself.
    pub async fn device(south_port: u16, id: &str) -> BareClient {
        BareClient::connect(south_port, id, vec![format!("devices/{id}/inbox")]).await
    }

    /// Publishes bytes on any topic at QoS 1.
    pub async fn publish(&self, topic: &str, bytes: impl Into<Vec<u8>>) {
        self.session
            .client
            .publish(topic, QoS::AtLeastOnce, false, bytes.into())
            .await
            .expect("queue publish");
    }

    /// The next incoming publish as JSON; `None` after `timeout`.
    pub async fn next_json(&mut self, timeout: Duration) -> Option<Value> {
        let p = self.session.next(timeout).await?;
        Some(serde_json::from_slice(&p.payload).unwrap_or_else(|e| {
            panic!(
                "not JSON on {} ({e}): {:?}",
                p.topic,
                String::from_utf8_lossy(&p.payload)
            )
        }))
    }

    /// SubAcks seen so far (one per (re)connect).
    pub fn subacks(&self) -> u64 {
        *self.session.subacks.borrow()
    }
}

/// Connects and at once drops a client with `id`: the broker takes the
/// device's session over, so the device's real client is cut off and
/// reconnects.
pub async fn cut_off(south_port: u16, id: &str) {
    let mut options = MqttOptions::new(id, "127.0.0.1", south_port);
    options.set_keep_alive(Duration::from_secs(5));
    let (_client, mut eventloop) = AsyncClient::new(options, 16);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, eventloop.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => return,
            Ok(Ok(_)) => {}
            Ok(Err(_)) => tokio::time::sleep(RECONNECT_PAUSE).await,
            Err(_) => panic!("intruder {id} got no ConnAck within 20 s"),
        }
    }
}
