//! The benches' backends on the upstream broker.
//!
//! - [`AckingBackend`] (uplink): one [`ferry::mqtt::Session`] subscribed to
//!   every uplink of the gateway, acking each `ok`, in arrays of up to
//!   [`ACK_BATCH`], as fast as they come.
//! - [`count_receipts`] (storm): reads the delivery receipts a
//!   [`BackendClient`] hears and counts distinct `stored` and `delivered`
//!   ones per (message, device).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry::client::backend::{BackendClient, BackendEvent};
use ferry::ids::GatewayId;
use ferry::mqtt::{Event, Options, Session};
use ferry::protocol::ack::{encode_acks, BackendAck};
use ferry::protocol::north::NorthMessage;
use ferry::protocol::receipt::NorthStatus;
use ferry::protocol::topics::NorthTopics;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at};

/// Largest number of acks the backend puts in one JSON array.
pub const ACK_BATCH: usize = 100;
/// The north topic prefix (ferry's default).
const NORTH_PREFIX: &str = "ferry";
/// How long the backend may take to be connected and subscribed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

// ------------------------------------------------------------------- uplink

#[derive(Default)]
pub struct AckStats {
    pub received: AtomicU64,
    pub acked: AtomicU64,
    pub ack_publishes: AtomicU64,
    pub unparsable: AtomicU64,
    /// Connections that were up and dropped.
    pub drops: AtomicU64,
}

/// A backend that acks every uplink `ok`; stopped by [`Self::stop`].
pub struct AckingBackend {
    pub stats: Arc<AckStats>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl AckingBackend {
    /// Connects to the upstream on `port`, subscribes to `gateway`'s
    /// uplinks and returns once subscribed; runs until `stop` or for at
    /// most `lifetime`.
    pub async fn start(
        port: u16,
        gateway: &str,
        lifetime: Duration,
    ) -> Result<AckingBackend, String> {
        let gateway = GatewayId::new(gateway).map_err(|e| format!("gateway {gateway}: {e}"))?;
        let topics = NorthTopics::new(NORTH_PREFIX, &gateway);
        let client_id = format!("bench-backend-{}", std::process::id());
        let mut opts = Options::new(client_id.as_str(), "127.0.0.1", port, client_id.as_str());
        opts.subscriptions = vec![topics.up_filter()];
        opts.inflight = 1000;
        opts.max_incoming_packet = 1 << 20;
        opts.max_outgoing_packet = 1 << 20;
        opts.max_message_bytes = 1 << 20;
        let (session, mut events) = Session::<()>::start(opts);
        match timeout(CONNECT_TIMEOUT, events.recv()).await {
            Ok(Some(Event::Up { .. })) => {}
            _ => {
                return Err(format!(
                    "backend: not subscribed to {} on port {port} within {CONNECT_TIMEOUT:?}",
                    topics.up_filter()
                ))
            }
        }
        let stats = Arc::new(AckStats::default());
        let (stop, stop_rx) = watch::channel(false);
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        let end = tokio::time::Instant::now() + lifetime;
        let reader = tokio::spawn(read_uplinks(
            events,
            acks_tx,
            stats.clone(),
            stop_rx.clone(),
            end,
        ));
        let acker = tokio::spawn(send_acks(
            session,
            topics.ack(),
            acks_rx,
            stats.clone(),
            stop_rx,
            end,
        ));
        Ok(AckingBackend {
            stats,
            stop,
            tasks: vec![reader, acker],
        })
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = timeout(Duration::from_secs(2), t).await;
        }
    }
}

/// Turns every uplink into an `ok` for the acker.
async fn read_uplinks(
    mut events: mpsc::Receiver<Event<()>>,
    acks: mpsc::UnboundedSender<BackendAck>,
    stats: Arc<AckStats>,
    mut stop: watch::Receiver<bool>,
    end: tokio::time::Instant,
) {
    loop {
        let event = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            e = timeout_at(end, events.recv()) => match e {
                Ok(Some(e)) => e,
                _ => break,
            },
        };
        match event {
            Event::Message(m) => {
                stats.received.fetch_add(1, Ordering::Relaxed);
                match serde_json::from_slice::<NorthMessage>(&m.payload) {
                    Ok(up) => {
                        let _ = acks.send(BackendAck::ok(up.device, up.envelope.msg_id));
                    }
                    Err(_) => {
                        stats.unparsable.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Event::Down if stats.drops.fetch_add(1, Ordering::Relaxed) < 2 => {
                eprintln!("backend: connection dropped");
            }
            _ => {}
        }
    }
}

/// Publishes what `read_uplinks` hands over, up to [`ACK_BATCH`] per
/// message, as soon as there is any.
async fn send_acks(
    session: Session<()>,
    topic: String,
    mut acks: mpsc::UnboundedReceiver<BackendAck>,
    stats: Arc<AckStats>,
    mut stop: watch::Receiver<bool>,
    end: tokio::time::Instant,
) {
    let mut batch = Vec::with_capacity(ACK_BATCH);
    loop {
        let first = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            a = acks.recv() => match a { Some(a) => a, None => break },
        };
        batch.clear();
        batch.push(first);
        while batch.len() < ACK_BATCH {
            let Ok(a) = acks.try_recv() else { break };
            batch.push(a);
        }
        let sent = session.send_wait(topic.as_str(), encode_acks(&batch), false);
        match timeout_at(end, sent).await {
            Ok(true) => {
                stats.acked.fetch_add(batch.len() as u64, Ordering::Relaxed);
                stats.ack_publishes.fetch_add(1, Ordering::Relaxed);
            }
            _ => break,
        }
    }
    session.close(None, Duration::from_secs(1)).await;
}

// -------------------------------------------------------------------- storm

/// What the storm's backend heard.
#[derive(Default)]
pub struct ReceiptStats {
    /// Distinct (message, device) pairs with a `stored` receipt.
    pub stored: AtomicU64,
    /// Distinct (message, device) pairs with a `delivered` receipt.
    pub delivered: AtomicU64,
    pub receipts: AtomicU64,
    /// Receipts with another status (expired, failed, rejected, read).
    pub other: AtomicU64,
    /// Receipts the bench could not attribute to one of its pairs.
    pub foreign: AtomicU64,
    pub connects: AtomicU64,
}

/// Consumes `backend`'s events until `stop`, counting receipts for
/// messages `{msg_prefix}{k}` to devices `dev-{i}`.
pub async fn count_receipts(
    mut backend: BackendClient,
    stats: Arc<ReceiptStats>,
    msg_prefix: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut stored = HashSet::new();
    let mut delivered = HashSet::new();
    loop {
        let ev = tokio::select! {
            ev = backend.events.recv() => ev,
            _ = stop.changed() => return,
        };
        let Some(ev) = ev else { return };
        let r = match ev {
            BackendEvent::Receipt(r) => r,
            BackendEvent::Connected => {
                stats.connects.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            _ => continue,
        };
        stats.receipts.fetch_add(1, Ordering::Relaxed);
        let key = r
            .msg_id
            .as_deref()
            .and_then(|m| m.strip_prefix(msg_prefix.as_str())?.parse::<u64>().ok())
            .zip(r.device.as_deref().and_then(device_index))
            .map(|(k, d)| (d << 20) | k);
        let Some(key) = key else {
            stats.foreign.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        match r.kind() {
            Some(NorthStatus::Stored) => {
                if stored.insert(key) {
                    stats.stored.fetch_add(1, Ordering::Relaxed);
                }
            }
            Some(NorthStatus::Delivered) => {
                if delivered.insert(key) {
                    stats.delivered.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                stats.other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// `dev-{i}` → i.
pub fn device_index(name: &str) -> Option<u64> {
    name.strip_prefix("dev-")?.parse().ok()
}
