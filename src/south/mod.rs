//! The south side: the embedded rumqttd broker devices connect to, and the
//! in-process link through which the gateway sees their traffic and answers.
//!
//! This module is the seam for the south broker: the rest of the gateway
//! sees only [`SouthMessage`]s coming in and [`SouthSender::publish`] going
//! out, so an external-broker mode can replace it without touching the
//! pipeline.
//!
//! Invariants (see ../shared/notes/RUMQTT.md for the broker facts behind them):
//! - The link's receive loop runs on its own thread and does nothing but
//!   move messages into a bounded channel and answer `Unschedule` at once.
//!   A device's PUBACK only means "in the broker's RAM"; the commit log of
//!   the device filters is sized so the link can fall far behind before the
//!   broker would overwrite anything.
//! - The link's client id is the empty string. rumqttd renames any device
//!   that connects with an empty id (`rumqtt-{uuid}`), so no device can take
//!   the link over.
//! - Sends go through one thread that owns the `LinkTx`, whose publish is a
//!   blocking channel send that must never run on a tokio worker.

pub mod presence;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::thread;

use bytes::Bytes;
use rumqttd::local::{LinkBuilder, LinkRx, LinkTx};
use rumqttd::protocol::v4::V4;
use rumqttd::{
    ConnectionSettings, LinkType, Notification, Router, RouterConfig, Server, ServerSettings,
};
use tokio::sync::mpsc;
use tracing::{debug, error, warn};

use crate::config::SouthConfig;
use crate::protocol::topics::Topics;

/// The link's client id; unreachable for devices (see the module doc).
const LINK_CLIENT_ID: &str = "";
/// Commit log of each device filter the link reads: 16 MiB × 4 segments.
/// At ~300-byte uplinks that is ~200k messages (10 s at 20k/s) of slack
/// before a stalled link could lose anything. rumqttd keeps a log's
/// segments once filled, so this is also memory the gateway will hold.
const LINK_FILTER_SEGMENT: usize = 16 << 20;
const LINK_FILTER_SEGMENTS: usize = 4;
/// Every other filter (each device's own `ack` and `inbox` topics): 8 KiB ×
/// 3. There is one per device and topic, never freed, so at 10,000 devices
/// this is up to 480 MiB; what they carry is repaired end to end (devices
/// resend until `stored`, batches are resent until confirmed), so a device
/// that falls more than a few segments behind loses nothing that matters.
const DEVICE_FILTER_SEGMENT: usize = 8 << 10;
const DEVICE_FILTER_SEGMENTS: usize = 3;
/// Messages between the link thread and the pipeline.
const INBOUND_CAPACITY: usize = 16_384;
const OUTBOUND_CAPACITY: usize = 16_384;

/// The topic kinds devices publish on, one link subscription each.
const DEVICE_KINDS: [&str; 6] = ["up/#", "confirm", "pull", "read", "nack", "status"];

#[derive(Debug, thiserror::Error)]
pub enum SouthError {
    #[error("south.listen {addr}: cannot listen: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("embedded broker link: {0}")]
    Link(String),
}

/// A message a device published.
#[derive(Debug, Clone)]
pub struct SouthMessage {
    pub topic: String,
    pub payload: Bytes,
}

/// Sends to devices; cheap to clone.
#[derive(Clone)]
pub struct SouthSender {
    tx: mpsc::Sender<(String, Bytes)>,
}

impl SouthSender {
    /// Queues a publish to devices. Returns false once the south side is gone.
    pub async fn publish(&self, topic: String, payload: Bytes) -> bool {
        self.tx.send((topic, payload)).await.is_ok()
    }
}

/// The running south side.
pub struct South {
    pub inbound: mpsc::Receiver<SouthMessage>,
    pub outbound: SouthSender,
    /// Resolves only if the listener stops, which is fatal.
    pub listener: tokio::task::JoinHandle<String>,
    /// Connects, disconnects and subscriptions the broker reported, if the
    /// presence layer is installed.
    pub broker_events: Option<mpsc::UnboundedReceiver<presence::BrokerEvent>>,
}

/// Starts the broker, its listener (on the current tokio runtime) and the link.
pub fn start(cfg: &SouthConfig, topics: &Topics) -> Result<South, SouthError> {
    let broker_events = presence::subscribe();
    // Fail fast and by name if the address is taken: rumqttd would only log it.
    std::net::TcpListener::bind(cfg.listen).map_err(|source| SouthError::Listen {
        addr: cfg.listen,
        source,
    })?;

    let filters: HashMap<String, rumqttd::SegmentConfig> = DEVICE_KINDS
        .iter()
        .map(|k| {
            let seg = rumqttd::SegmentConfig {
                max_segment_size: LINK_FILTER_SEGMENT,
                max_segment_count: LINK_FILTER_SEGMENTS,
            };
            (format!("{}/+/{k}", topics.south_prefix()), seg)
        })
        .collect();
    let router = Router::new(
        0,
        RouterConfig {
            // One slot for the link itself.
            max_connections: cfg.max_connections + 1,
            max_outgoing_packet_count: 1024,
            max_segment_size: DEVICE_FILTER_SEGMENT,
            max_segment_count: DEVICE_FILTER_SEGMENTS,
            custom_segment: Some(filters),
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        },
    );
    let router_tx = router.spawn();

    let (link_tx, link_rx, _connack) = LinkBuilder::new(LINK_CLIENT_ID, router_tx.clone())
        // Receipts go to per-device topics nobody may have subscribed yet.
        .dynamic_filters(true)
        .build()
        .map_err(|e| SouthError::Link(e.to_string()))?;
    let mut link_tx = link_tx;
    for kind in DEVICE_KINDS {
        link_tx
            .subscribe(format!("{}/+/{kind}", topics.south_prefix()))
            .map_err(|e| SouthError::Link(e.to_string()))?;
    }

    let (in_tx, inbound) = mpsc::channel(INBOUND_CAPACITY);
    thread::Builder::new()
        .name("ferry-south-rx".into())
        .spawn(move || receive(link_rx, in_tx))
        .map_err(|e| SouthError::Link(e.to_string()))?;
    let (out_tx, out_rx) = mpsc::channel(OUTBOUND_CAPACITY);
    thread::Builder::new()
        .name("ferry-south-tx".into())
        .spawn(move || send(link_tx, out_rx))
        .map_err(|e| SouthError::Link(e.to_string()))?;

    let settings = ServerSettings {
        name: "south".into(),
        listen: cfg.listen,
        tls: None,
        next_connection_delay_ms: 0,
        connections: ConnectionSettings {
            connection_timeout_ms: 10_000,
            // Larger than south.max_payload_bytes so an oversize message
            // reaches the gateway and gets a `rejected` receipt instead of
            // a disconnect.
            max_payload_size: (cfg.max_payload_bytes * 4).max(1 << 20),
            max_inflight_count: 256,
            auth: None,
            external_auth: None,
            // A device publishing outside the protocol's topics is disconnected.
            dynamic_filters: false,
        },
    };
    let mut server = Server::new(settings, router_tx, V4);
    let listener = tokio::spawn(async move {
        match server.start(LinkType::Remote).await {
            Ok(()) => "south listener stopped".to_string(),
            Err(e) => format!("south listener failed: {e}"),
        }
    });
    Ok(South {
        inbound,
        outbound: SouthSender { tx: out_tx },
        listener,
        broker_events,
    })
}

fn receive(mut rx: LinkRx, tx: mpsc::Sender<SouthMessage>) {
    loop {
        match rx.recv() {
            Ok(Some(Notification::Forward(f))) => {
                let topic = match String::from_utf8(f.publish.topic.to_vec()) {
                    Ok(t) => t,
                    Err(_) => {
                        warn!("dropping a device publish whose topic is not UTF-8");
                        continue;
                    }
                };
                if tx
                    .blocking_send(SouthMessage {
                        topic,
                        payload: f.publish.payload,
                    })
                    .is_err()
                {
                    debug!("south receiver closed; link reader stops");
                    return;
                }
            }
            Ok(Some(Notification::Unschedule)) => {
                if let Err(e) = rx.ready() {
                    error!(error = %e, "embedded broker link lost");
                    return;
                }
            }
            Ok(Some(Notification::Disconnect(..))) => {
                error!("embedded broker disconnected the gateway's link");
                return;
            }
            Ok(_) => {}
            Err(e) => {
                error!(error = %e, "embedded broker link lost");
                return;
            }
        }
    }
}

fn send(mut link: LinkTx, mut rx: mpsc::Receiver<(String, Bytes)>) {
    while let Some((topic, payload)) = rx.blocking_recv() {
        if let Err(e) = link.publish(topic, payload) {
            error!(error = %e, "embedded broker link lost; stopping sends to devices");
            return;
        }
    }
}
