//! The benches' backends on the upstream broker.
//!
//! - [`AckingBackend`] (uplink): one [`ferry::mqtt::Session`] subscribed to
//!   every uplink of the gateway, acking each `ok`, in arrays of up to
//!   [`ACK_BATCH`], as fast as they come.
//! - [`queue_downlinks`] (the storm's setup): a [`BackendClient`] that
//!   publishes the storm's downlinks once the gateway is online, then
//!   [`count_receipts`]: reads the delivery receipts it hears and counts
//!   distinct `stored` and `delivered` ones per (message, device).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::ids::{GatewayId, MsgId};
use ferry::mqtt::{Event, Options, Session};
use ferry::protocol::ack::{encode_acks, BackendAck};
use ferry::protocol::envelope::{Payload, WireEnvelope};
use ferry::protocol::north::NorthMessage;
use ferry::protocol::receipt::NorthStatus;
use ferry::protocol::topics::NorthTopics;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at};

use super::arrivals::Arrivals;

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
        AckingBackend::start_recording(port, gateway, lifetime, None).await
    }

    /// [`Self::start`], also recording every uplink's envelope in
    /// `arrivals` (the end-to-end consumer of the compare bench).
    pub async fn start_recording(
        port: u16,
        gateway: &str,
        lifetime: Duration,
        arrivals: Option<Arc<Arrivals>>,
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
        // Failed attempts (the broker not up yet) are retried: wait for Up.
        let subscribed = timeout(CONNECT_TIMEOUT, async {
            loop {
                match events.recv().await {
                    Some(Event::Up { .. }) => return true,
                    Some(Event::Failed(_)) => {}
                    _ => return false,
                }
            }
        });
        if subscribed.await != Ok(true) {
            return Err(format!(
                "backend: not subscribed to {} on port {port} within {CONNECT_TIMEOUT:?}",
                topics.up_filter()
            ));
        }
        let stats = Arc::new(AckStats::default());
        let (stop, stop_rx) = watch::channel(false);
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        let end = tokio::time::Instant::now() + lifetime;
        let reader = tokio::spawn(read_uplinks(
            events,
            arrivals,
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
    arrivals: Option<Arc<Arrivals>>,
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
                // One uplink, or a batch (`north.batch_max` > 1).
                let parsed = if m.payload.first() == Some(&b'[') {
                    serde_json::from_slice::<Vec<NorthMessage>>(&m.payload)
                } else {
                    serde_json::from_slice::<NorthMessage>(&m.payload).map(|up| vec![up])
                };
                match parsed {
                    Ok(ups) => {
                        for up in ups {
                            if let Some(arrivals) = &arrivals {
                                let (id, sent_ns) = stamp_of(&up);
                                arrivals.record_id(id, sent_ns);
                            }
                            let _ = acks.send(BackendAck::ok(up.device, up.envelope.msg_id));
                        }
                    }
                    Err(_) => {
                        if let Some(arrivals) = &arrivals {
                            arrivals.record_foreign();
                        }
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

/// An uplink's bench id and send stamp: its envelope's, or for a plain
/// uplink (stream `plain`, whose msg_id is ferry's own) those of the
/// stamped envelope a plain publisher sent as its payload.
fn stamp_of(up: &NorthMessage) -> (&str, Option<u64>) {
    match &up.envelope.payload {
        Payload::Json(v) if up.stream == "plain" => match v.get("msg_id").and_then(Value::as_str) {
            Some(id) => (id, v.get("payload").and_then(|p| p.get("t")?.as_u64())),
            None => (up.envelope.msg_id.as_str(), None),
        },
        Payload::Json(v) => (
            up.envelope.msg_id.as_str(),
            v.get("t").and_then(Value::as_u64),
        ),
        Payload::Base64(_) => (up.envelope.msg_id.as_str(), None),
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

/// The storm's downlinks: `per_device` envelopes `{msg_prefix}{k}`
/// (k = 1..=per_device), each addressed to every one of `devices`.
pub struct DownlinkLoad<'a> {
    /// The upstream broker.
    pub port: u16,
    pub gateway: &'a str,
    pub devices: &'a [String],
    pub per_device: usize,
    /// Approximate payload of each envelope, bytes.
    pub payload_bytes: usize,
    pub msg_prefix: &'a str,
    /// Most device ids in one `to` list.
    pub max_to: usize,
}

/// What [`queue_downlinks`] left running: [`count_receipts`] on its
/// backend, until the `stop` it was given.
pub struct Queued {
    pub stats: Arc<ReceiptStats>,
    pub task: JoinHandle<()>,
    /// Envelopes published on `ferry/{gw}/down`.
    pub envelopes: usize,
}

/// Connects a backend to the upstream, waits until it is subscribed and
/// the gateway `online`, publishes `load`, and returns once every delivery
/// has its `stored` receipt (Err if any of this is not done by `deadline`),
/// leaving the receipts counted until `stop`.
pub async fn queue_downlinks(
    load: DownlinkLoad<'_>,
    deadline: Instant,
    stop: watch::Receiver<bool>,
) -> Result<Queued, String> {
    let stats = Arc::new(ReceiptStats::default());
    let mut backend = BackendClient::connect(BackendOptions {
        // Only a safety net: a resend is answered again and deduplicated.
        resend_after: Duration::from_secs(30),
        ..BackendOptions::new("127.0.0.1", load.port, load.gateway)
    });
    let mut connected = false;
    let mut online = false;
    while !(connected && online) {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, backend.events.recv()).await {
            Ok(Some(BackendEvent::Connected)) => connected = true,
            Ok(Some(BackendEvent::Status(s))) => online = s.online,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                return Err(format!(
                    "backend connected {connected}, gateway online {online}"
                ))
            }
        }
    }
    stats.connects.fetch_add(1, Ordering::Relaxed);
    let text = "x".repeat(load.payload_bytes);
    let mut envelopes = 0;
    for k in 1..=load.per_device {
        for chunk in load.devices.chunks(load.max_to) {
            let to: Vec<&str> = chunk.iter().map(String::as_str).collect();
            let msg_id = MsgId::new(format!("{}{k}", load.msg_prefix)).expect("a valid msg_id");
            backend.send_downlink(
                &to,
                WireEnvelope::json(msg_id, json!({"k": k, "text": text})),
            );
            envelopes += 1;
        }
    }
    let task = tokio::spawn(count_receipts(
        backend,
        stats.clone(),
        load.msg_prefix.to_string(),
        stop,
    ));
    let total = (load.devices.len() * load.per_device) as u64;
    while stats.stored.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stored = stats.stored.load(Ordering::Relaxed);
    if stored < total {
        return Err(format!(
            "{envelopes} envelopes published, {stored}/{total} `stored` receipts"
        ));
    }
    Ok(Queued {
        stats,
        task,
        envelopes,
    })
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
