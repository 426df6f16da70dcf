//! Embedded mode: the rumqttd broker devices connect to, and the
//! in-process link through which the gateway sees their traffic and answers.
//!
//! Invariants (see ../shared/notes/RUMQTT.md for the broker facts behind
//! them, and vendor/README.md for the patches they rely on):
//! - A device's publish goes from its connection's task straight to
//!   intake (`rumqttd::PublishSink`, bounded in count and bytes: a full
//!   sink makes the connection wait, reading nothing more from its device),
//!   never through the router's commit logs; its PUBACK (PUBREC) is sent
//!   by the connection once intake answers for it (its commit, or its
//!   refusal), in the order the device's publishes came.
//! - What the broker publishes itself (wills) comes through the link.
//!   Nothing there is overwritten before the gateway has read it: the
//!   link's receive loop only moves messages into a bounded channel; when
//!   that channel runs low on room, the link holds the broker back until it
//!   has room again, so its commit logs never wrap over unread messages.
//! - Nothing for a device that stays connected and reads is dropped.
//!   Receipts and inbox batches are delivered straight to the device's
//!   connection ([`rumqttd::local::Deliverer`]), in order, never through a
//!   commit log that could wrap; while a device has more than
//!   [`DEVICE_QUEUE`] of them unread, its own publishes are held back.
//! - A publish over `south.max_payload_bytes` never costs the broker more
//!   than its head: it is skipped on the wire and arrives here marked, to be
//!   answered `rejected`.
//! - The broker keeps nothing of a device that left (no session, no
//!   retained messages, no logs of filters nobody reads), bounds keep-alive
//!   and subscriptions, and refuses a CONNECT beyond `max_connections` with
//!   a CONNACK.
//! - A device is held to its own topics (vendor/README.md, patch 22): it
//!   publishes only on `{prefix}/{its id}/...` device topics and subscribes
//!   only to its own `ack` and `inbox`. A publish anywhere else reaches
//!   only the gateway, quarantined and marked with its sender, and is
//!   answered `rejected` (reason `unauthorized`); any other SUBSCRIBE
//!   filter gets 0x80. Who a device is, is its client id; with
//!   `south.auth = "password"` a CONNECT is accepted only when the client
//!   id is the username and the password matches (`auth.rs`).
//!   With `south.tls.client_ca` that id must be its certificate's CN
//!   (vendor/README.md, patch 42), so a device speaks only as itself.
//! - With TLS, the handshake runs in the connection's own task, and with
//!   the CONNECT must finish within `south.connect_timeout_ms`: a client
//!   that never finishes it delays no one (patch 40).
//! - The link's client id is the empty string, which is no device id: a
//!   CONNECT with it is refused (CONNACK 2, `admission.rs`), so no device
//!   can take the link over.
//! - Receipts and inbox batches go from the pipeline's tasks onto the
//!   device's connection themselves, past the router's thread (vendor
//!   patch 68); only one for a device not connected goes through the
//!   router, to its session. The connection's task settles the device's
//!   PUBACKs for them, and writes a publish's PUBACK and its `stored`
//!   receipt in one write.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use rumqttd::local::{LinkBuilder, LinkRx};
use rumqttd::protocol::any::AnyVersion;
use rumqttd::{
    ConnectionSettings, LinkType, Notification, PublishSink, Router, RouterConfig, Server,
    ServerSettings, TlsConfig, QUARANTINE_TOPIC,
};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tracing::{debug, error, info, warn};

use super::admission;
use super::auth::{self, Authenticator};
use super::presence;
use super::published::{from_device, south_message};
use super::seam::{
    beside_filters, device_filters, max_packet_bytes, may_publish_beside, Inbound, InboundTx,
    Outbound, South, SouthMessage, SouthSender, Started, INBOUND_CAPACITY, OVERSIZE_HEAD,
};
use crate::config::{ListenerTls, SouthAuth, SouthConfig};
use crate::protocol::topics::Topics;

/// The link's client id; unreachable for devices (see the module doc).
const LINK_CLIENT_ID: &str = "";
/// Commit log of each device filter the link reads: 256 KiB × 256 segments.
/// The link is the only reader, and what it has read is freed a segment at
/// a time, so the log holds what is unread (plus at most a segment): the
/// capacity is slack, not memory. At ~300-byte uplinks 64 MiB is ~200k
/// messages; the link holds devices back long before (see the module doc).
const LINK_FILTER_SEGMENT: usize = 256 << 10;
const LINK_FILTER_SEGMENTS: usize = 256;
/// Every other filter (each device's own `ack` and `inbox`): the gateway
/// delivers to devices directly, so these logs only exist because the
/// broker keeps one per subscription; the smallest it allows, freed when
/// the device leaves.
const DEVICE_FILTER_SEGMENT: usize = 1024;
const DEVICE_FILTER_SEGMENTS: usize = 1;
/// Every device's publishes are held back while the inbound channel has
/// less room than this, or holds more than [`INBOUND_BYTES`], and released
/// once it has twice the room and half the bytes.
const INBOUND_LOW: usize = INBOUND_CAPACITY / 4;
const INBOUND_BYTES: usize = 32 << 20;
/// Receipts and batches waiting for one device beyond what it has in
/// flight, before its own publishes are held back until it reads them.
pub const DEVICE_QUEUE: usize = 1000;
/// Topic aliases an MQTT 5 device may set: more than its topics.
const TOPIC_ALIASES: u16 = 32;

#[derive(Debug, thiserror::Error)]
pub enum SouthError {
    #[error("south.listen {addr}: cannot listen: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("embedded broker link: {0}")]
    Link(String),
    #[error("south.password_file: {0}")]
    PasswordFile(#[from] crate::config::passwords::FileError),
}

/// Starts the broker, its listener (on the current tokio runtime) and the link.
pub(crate) fn start(cfg: &SouthConfig, topics: &Topics) -> Result<Started, SouthError> {
    // Fail fast and by name if an address is taken: rumqttd would only log it.
    for l in &cfg.listeners {
        std::net::TcpListener::bind(l.listen).map_err(|source| SouthError::Listen {
            addr: l.listen,
            source,
        })?;
    }

    // A SIGHUP from here on, before the reload task listens, is applied.
    let hangups = crate::signals::hangups();
    let authenticator = match &cfg.auth {
        SouthAuth::Password { file } => {
            let auth = Authenticator::load(file, cfg.connect_timeout)?;
            info!(event = "south_auth_password", file = %file.display(), "devices authenticate with passwords");
            auth::reload_on_hangup(Some(auth.clone()), hangups);
            Some(auth)
        }
        SouthAuth::None => {
            // Client certificates prove each device's id: not open then.
            let certificates = cfg.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
            for l in &cfg.listeners {
                if l.open_to_network(certificates) {
                    warn!(
                        event = "south_auth_open",
                        listen = %l.listen,
                        "south.auth = \"none\" with south.allow_anonymous: ANY CLIENT THAT CAN \
                         REACH THIS PORT CAN ACT AS ANY DEVICE"
                    );
                }
            }
            auth::reload_on_hangup(None, hangups);
            None
        }
    };
    // A client id must be a device id; with passwords, the password match.
    let connect_hook = Some(admission::hook(authenticator));

    let filters: HashMap<String, rumqttd::SegmentConfig> = link_filters(topics)
        .map(|filter| (filter, link_segment()))
        .collect();
    let mut router = Router::new(
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
            ephemeral: true,
            max_subscriptions: cfg.max_subscriptions,
            max_direct_queue: DEVICE_QUEUE,
            // A device subscribes to its own `ack` and `inbox` only.
            isolation: Some(topics.south_prefix().to_string()),
            // And to its plain command topic.
            also_subscribe: cfg.plain_down.as_ref().map(|d| d.as_str().to_string()),
            // A session for every device at most (each bounded in time by
            // `south.max_session_expiry_s` and in size by the broker).
            max_sessions: if cfg.max_session_expiry.is_zero() {
                0
            } else {
                cfg.max_connections
            },
            // And what their messages cost in memory, all together.
            max_session_bytes: cfg.max_session_bytes,
        },
    );
    let (presence_tx, presence_rx) = mpsc::unbounded_channel();
    tokio::spawn(presence::run(
        router.client_events(),
        presence_tx,
        topics.clone(),
        cfg.plain_down.clone(),
    ));
    let directory = router.directory();
    let router_tx = router.spawn();

    let (link_tx, link_rx, _connack) = LinkBuilder::new(LINK_CLIENT_ID, router_tx.clone())
        .build()
        .map_err(|e| SouthError::Link(e.to_string()))?;
    let mut link_tx = link_tx;
    for filter in link_filters(topics) {
        link_tx
            .subscribe(filter)
            .map_err(|e| SouthError::Link(e.to_string()))?;
    }

    let (in_tx, inbound) = Inbound::new();
    // Devices' publishes, straight from their connections' tasks.
    let (sink, direct) = PublishSink::new(INBOUND_CAPACITY, INBOUND_BYTES as u32);
    let inbound = inbound.with_direct(direct, from_device);
    thread::Builder::new()
        .name("ferry-south-rx".into())
        .spawn(move || receive(link_rx, in_tx))
        .map_err(|e| SouthError::Link(e.to_string()))?;
    // Receipts and batches for devices go from the pipeline's tasks to
    // the router themselves (`SouthSender::publish`).
    let deliverer = link_tx.deliverer(directory);
    tokio::spawn(follow_plain_topics(link_tx, topics.clone()));

    let connections = ConnectionSettings {
        // A client that opens TCP and never completes its TLS handshake
        // and CONNECT within this is closed; each waits in its own task,
        // so none delays another device's connect.
        connection_timeout_ms: cfg.connect_timeout.as_millis().min(u16::MAX as u128) as u16,
        // A larger packet (MQTT 5 properties included) is skipped on
        // the wire and reaches the gateway as its head and its size, to
        // be answered `rejected`.
        max_payload_size: max_packet_bytes(cfg.max_payload_bytes),
        oversize_head: OVERSIZE_HEAD,
        max_inflight_count: 256,
        auth: None,
        external_auth: None,
        // With passwords: client id = username, password verified.
        connect_hook,
        // A device publishing outside the protocol's topics is disconnected.
        dynamic_filters: false,
        max_keep_alive: cfg.max_keep_alive.as_secs().min(u16::MAX as u64) as u16,
        // A device publishes on its own topics only; anything else
        // reaches the gateway quarantined, to be answered `rejected`.
        isolation: Some(topics.south_prefix().to_string()),
        // And on plain devices' topics: its own, when its id is proven.
        also_publish: plain_hook(cfg, topics),
        // A longer client id is no device id: CONNACK 2, also when the
        // CONNECT is too large to read.
        max_client_id_len: admission::MAX_CLIENT_ID,
        max_session_expiry: cfg.max_session_expiry.as_secs().min(u32::MAX as u64) as u32,
        // A device has a handful of topics; aliases beyond are refused.
        topic_alias_max: TOPIC_ALIASES,
        // Every publish goes from its connection to intake, and its
        // PUBACK (PUBREC) waits for intake's answer: its commit, or
        // its refusal answered.
        publish_sink: Some(sink),
        // Set for each WebSocket listener.
        ws_path: None,
    };
    // Every listener serves the one broker, with the same settings.
    let servers: Vec<_> = cfg
        .listeners
        .iter()
        .map(|l| {
            let settings = ServerSettings {
                name: format!("south {}", l.listen),
                listen: l.listen,
                tls: if l.tls {
                    cfg.tls.as_ref().map(listener_tls)
                } else {
                    None
                },
                next_connection_delay_ms: 0,
                connections: ConnectionSettings {
                    ws_path: l.ws_path.clone(),
                    ..connections.clone()
                },
            };
            let mut server = Server::new(settings, router_tx.clone(), AnyVersion::default());
            let listen = l.listen;
            // MQTT over WebSocket: the handshake (after TLS, for wss) and then
            // the same connection as over TCP.
            let link = if l.ws_path.is_some() {
                LinkType::Websocket
            } else {
                LinkType::Remote
            };
            Box::pin(async move {
                match server.start(link).await {
                    Ok(()) => format!("south listener {listen} stopped"),
                    Err(e) => format!("south listener {listen} failed: {e}"),
                }
            })
        })
        .collect();
    // The first listener to stop stops the south.
    let stopped = tokio::spawn(async move {
        let (why, _, _) = futures_util::future::select_all(servers).await;
        why
    });
    let south = South {
        inbound,
        outbound: SouthSender(Outbound::Embedded(deliverer)),
        stopped,
        presence: Some(presence_rx),
    };
    Ok(Started { south, link: None })
}

/// rumqttd's TLS settings for the device listener (the files were checked
/// when the config was loaded). With a client CA, a device is who its
/// certificate's CN says: rumqttd refuses a CONNECT with any other client
/// id (CONNACK 5), so isolation, which goes by client id, goes by the
/// certificate (vendor/README.md, patch 42).
fn listener_tls(tls: &ListenerTls) -> TlsConfig {
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    TlsConfig::Rustls {
        capath: tls.client_ca.as_deref().map(path),
        certpath: path(&tls.cert),
        keypath: path(&tls.key),
        crlpath: tls.crl.as_deref().map(path),
        cn_is_client_id: true,
    }
}

/// Moves device publishes from the link into `tx`. While `tx` is low on
/// room, every device's publishes are held back in the broker (so it never
/// acknowledges what its logs would have to overwrite), and released once
/// there is room again. `bytes` counts the payload bytes in `tx`.
fn receive(mut rx: LinkRx, inbound: InboundTx) {
    let InboundTx { tx, bytes } = inbound;
    let mut holding = false;
    let full = |tx: &mpsc::Sender<SouthMessage>| {
        tx.capacity() < INBOUND_LOW || bytes.load(Ordering::Relaxed) > INBOUND_BYTES
    };
    let roomy = |tx: &mpsc::Sender<SouthMessage>| {
        tx.capacity() >= 2 * INBOUND_LOW && bytes.load(Ordering::Relaxed) <= INBOUND_BYTES / 2
    };
    loop {
        let next = if holding {
            // Nothing new comes while held: look at the room now and then.
            rx.recv_deadline(Instant::now() + Duration::from_millis(20))
        } else {
            rx.recv()
        };
        if holding && roomy(&tx) {
            holding = false;
            if rx.hold_remote(false).is_err() {
                error!(event = "embedded_broker_lost", "embedded broker link lost");
                return;
            }
            info!(
                event = "device_intake_resumed",
                "the gateway caught up; devices' publishes are taken again"
            );
        }
        match next {
            Ok(Some(Notification::Forward(f))) => {
                let Some(msg) = south_message(f) else {
                    continue;
                };
                if !holding && full(&tx) {
                    holding = true;
                    warn!(event = "device_intake_held", "the gateway is behind its devices; their publishes are held back until it catches up");
                    if rx.hold_remote(true).is_err() {
                        error!(event = "embedded_broker_lost", "embedded broker link lost");
                        return;
                    }
                }
                bytes.fetch_add(msg.payload.len(), Ordering::Relaxed);
                let msg = match tx.try_send(msg) {
                    Ok(()) => continue,
                    Err(TrySendError::Full(msg)) => msg,
                    Err(TrySendError::Closed(_)) => {
                        debug!("south receiver closed; link reader stops");
                        return;
                    }
                };
                if tx.blocking_send(msg).is_err() {
                    debug!("south receiver closed; link reader stops");
                    return;
                }
            }
            Ok(Some(Notification::Unschedule)) => {
                if let Err(e) = rx.ready() {
                    error!(event = "embedded_broker_lost", error = %e, "embedded broker link lost");
                    return;
                }
            }
            Ok(Some(Notification::Disconnect(..))) => {
                error!(
                    event = "embedded_broker_lost",
                    "embedded broker disconnected the gateway's link"
                );
                return;
            }
            Ok(_) => {}
            // Only a hold reads with a deadline.
            Err(e) if e.is_timeout() => {}
            Err(e) => {
                error!(event = "embedded_broker_lost", error = %e, "embedded broker link lost");
                return;
            }
        }
    }
}

/// What the link reads: every device topic kind, and the quarantine.
fn link_filters(topics: &Topics) -> impl Iterator<Item = String> + '_ {
    device_filters(topics)
        .chain(std::iter::once(QUARANTINE_TOPIC.to_string()))
        // Plain devices' and edge nodes' wills, which the broker publishes.
        .chain(beside_filters(topics))
}

/// The commit log of a filter the link reads (see [`LINK_FILTER_SEGMENT`]).
fn link_segment() -> rumqttd::SegmentConfig {
    rumqttd::SegmentConfig {
        max_segment_size: LINK_FILTER_SEGMENT,
        max_segment_count: LINK_FILTER_SEGMENTS,
    }
}

/// Plain topics added by `systemctl reload` ([`Topics::set_plain`]): the
/// link subscribes to each new one, its log sized as the link's filters
/// made at start are (told to the router before the subscribe, so no
/// message lands in a device-sized log). A topic taken out stays
/// subscribed, and carries nothing: the publish hook no longer lets a
/// device publish there.
async fn follow_plain_topics(mut link_tx: rumqttd::local::LinkTx, topics: Topics) {
    let mut changes = topics.plain_changes();
    let mut subscribed: std::collections::HashSet<String> = link_filters(&topics).collect();
    while changes.changed().await.is_ok() {
        let plain = changes.borrow_and_update().clone();
        for filter in plain.filters().iter().map(|f| f.subscription()) {
            if !subscribed.insert(filter.clone()) {
                continue;
            }
            if let Err(e) = link_tx.subscribe_sized(filter.as_str(), link_segment()) {
                error!(event = "embedded_broker_lost", error = %e, filter = %filter, "embedded broker link lost while subscribing to a new plain topic");
                return;
            }
            info!(event = "plain_topic_added", filter = %filter, "the gateway now reads devices' plain publishes on this topic");
        }
    }
}

/// Where else than its device topics a client may publish: on plain
/// devices' and Sparkplug edge nodes' topics, as itself when its id is
/// proven (passwords, client certificates), as anyone with
/// `south.auth = "none"` (the topic names the device).
/// Installed whether or not there are plain topics now: `systemctl
/// reload` may add some.
fn plain_hook(cfg: &SouthConfig, topics: &Topics) -> Option<rumqttd::PublishHook> {
    let topics = topics.clone();
    let certificates = cfg.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    let bound = certificates || matches!(cfg.auth, SouthAuth::Password { .. });
    Some(std::sync::Arc::new(move |client: &str, topic: &str| {
        may_publish_beside(&topics, bound, client, topic)
    }))
}

#[cfg(test)]
mod tests;
