//! The seam's types: what the pipelines get from the devices' side
//! ([`SouthMessage`]s through [`Inbound`], [`DeviceControl`]s) and how they
//! answer ([`SouthSender`], [`Ack`]), whichever implementation is behind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use rumqttd::DirectPublish;
use tokio::sync::mpsc;
use tracing::error;

use super::presence;
use crate::ids::DeviceId;
use crate::mqtt::{self, AckToken};
use crate::protocol::control::ControlKind;
use crate::protocol::topics::Topics;
use crate::protocol::user_props::is_internal;

/// Messages between the south side and the pipeline.
pub(super) const INBOUND_CAPACITY: usize = 8192;
/// Bytes of an oversized publish kept: enough for its `msg_id`.
pub(super) const OVERSIZE_HEAD: usize = mqtt::OVERSIZE_HEAD;
/// Room for the topic in the packet limit (a valid device topic is well
/// under it; a longer one is cut short like an oversized payload).
pub(super) const TOPIC_ALLOWANCE: usize = 1024;

/// The largest publish a device may send, bytes: the whole packet (the
/// maximum packet size an MQTT 5 CONNACK gives); a larger one reaches the
/// pipeline cut short, with its real size.
pub fn max_packet_bytes(max_payload_bytes: usize) -> usize {
    max_payload_bytes + TOPIC_ALLOWANCE
}

/// Publishes to devices dropped for want of room towards the site broker
/// (the protocol repairs them: the device resends, or pulls).
static SITE_DROPPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Logs a drop: the first ones and then every power of two.
fn site_publish_dropped(device: &DeviceId) {
    let n = SITE_DROPPED.fetch_add(1, Ordering::Relaxed) + 1;
    if n <= 3 || n.is_power_of_two() {
        tracing::warn!(event = "site_publish_dropped", device = %device, dropped = n, "the queue towards the site broker is full: a receipt or inbox batch for a device was dropped (it resends, or pulls)");
    }
}

/// The filters ferry reads device traffic from, one per topic kind.
pub(super) fn device_filters(topics: &Topics) -> impl Iterator<Item = String> {
    topics.device_filters().into_iter()
}

/// The filters of what devices publish beside their device topics: plain
/// devices' topics, each `{device}` as `+`, and Sparkplug B edge nodes'.
pub(super) fn beside_filters(topics: &Topics) -> impl Iterator<Item = String> + '_ {
    let plain: Vec<String> = topics
        .plain()
        .filters()
        .iter()
        .map(|f| f.subscription())
        .collect();
    plain
        .into_iter()
        .chain(topics.sparkplug().map(|s| s.filters()).unwrap_or_default())
}

/// Whether client `client` may publish on `topic` beside its device
/// topics: as a plain device or a Sparkplug edge node, of itself when
/// `bound` (its id is proven), of anyone otherwise.
pub(super) fn may_publish_beside(topics: &Topics, bound: bool, client: &str, topic: &str) -> bool {
    topics.plain().may_publish(bound, client, topic)
        || topics
            .sparkplug()
            .is_some_and(|s| s.may_publish(bound, client, topic))
}

/// A message a device published.
#[derive(Debug)]
pub struct SouthMessage {
    pub topic: String,
    pub payload: Bytes,
    /// Its real size, when it was over the limit and only its head is in
    /// `payload`.
    pub oversize: Option<usize>,
    /// Set when the broker found it outside its sender's own topics
    /// (embedded mode): the client id that sent it. It was routed nowhere
    /// else, and is answered `rejected`, reason `unauthorized`.
    pub publisher: Option<String>,
    /// When ferry took it from the broker (ms since the epoch): the
    /// message's `received` time in `ferry trace`.
    pub received_ms: i64,
    /// The site broker kept it for ferry's session while ferry was away,
    /// and replays it in the burst after a reconnect ([`super::backlog`]): not a
    /// device sending fast, so not held to the per-device limits. Always
    /// false in embedded mode.
    pub replayed: bool,
    /// What its MQTT 5 publish carried beside the payload; empty for MQTT
    /// 3.1.1 (and in external mode).
    pub v5: PublishProps,
    /// Embedded mode: the broker's number for it, unique per run; a
    /// resend (DUP) of a publish whose PUBACK never went out carries the
    /// first send's (`rumqttd::DevicePublish::number`). A plain uplink's
    /// `msg_id` is made of it. `None`: a will, or external mode.
    pub number: Option<u64>,
    /// The QoS the device published with (embedded mode).
    pub qos: Option<u8>,
    /// The publish's retain flag.
    pub retain: bool,
    /// Pass to [`SouthSender::ack`] once the message is committed (or
    /// handed on, for a control message).
    pub ack: Ack,
}

/// What an MQTT 5 device publish carries that ferry passes on
/// (docs/PROTOCOL.md, "Payload envelope"), as the device sent it: intake
/// judges it ([`crate::protocol::envelope::with_publish`]). Its size is
/// bounded by the broker's packet limit only; the protocol's bounds on
/// user properties are intake's to apply, with a rejection, not here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishProps {
    /// The device's user properties, in order; never the gateway's own
    /// (`ferry-...`, [`crate::protocol::user_props::INTERNAL_PREFIX`]).
    pub user: Vec<(String, String)>,
    /// The message expiry interval, seconds.
    pub expiry_s: Option<u32>,
}

impl PublishProps {
    /// What the embedded broker forwarded with a device's publish, without
    /// the broker's own marks (`ferry-...`, read apart from these).
    pub(super) fn of(properties: Option<rumqttd::protocol::PublishProperties>) -> PublishProps {
        let Some(p) = properties else {
            return PublishProps::default();
        };
        PublishProps {
            user: p
                .user_properties
                .into_iter()
                .filter(|(k, _)| !is_internal(k))
                .collect(),
            expiry_s: p.message_expiry_interval,
        }
    }
}

/// Acknowledges one device message once the pipeline has answered for it:
/// to the site broker (external mode), or to the device itself, whose
/// PUBACK (PUBREC) it is (embedded mode). Dropped unanswered, it leaves
/// the message unacknowledged, and its sender sends it again.
#[derive(Debug, Default)]
pub struct Ack(pub(super) AckTo);

#[derive(Debug, Default)]
pub(super) enum AckTo {
    /// QoS 0, or nothing to acknowledge.
    #[default]
    Nobody,
    Site(AckToken),
    Device(rumqttd::Acker),
}

/// Sends to devices; cheap to clone.
#[derive(Clone)]
pub struct SouthSender(pub(super) Outbound);

#[derive(Clone)]
pub(super) enum Outbound {
    Embedded(rumqttd::local::Deliverer),
    External(mqtt::Session<()>),
}

impl SouthSender {
    /// External mode: the session to the site broker answers `probed`'s
    /// pings (see [`crate::health`]); true. The embedded broker runs on
    /// threads of its own and is not probed: false.
    pub fn answer_probes(&self, probed: crate::health::Probed) -> bool {
        match &self.0 {
            Outbound::External(session) => {
                session.answer_probes(probed);
                true
            }
            Outbound::Embedded(_) => false,
        }
    }

    /// Queues a publish to one device: dropped if it is not there to take
    /// it (the protocol repairs that: the device resends, or pulls). False
    /// once the south side is gone.
    pub async fn publish(&self, device: &DeviceId, topic: String, payload: Bytes) -> bool {
        match &self.0 {
            Outbound::Embedded(tx) => deliver(tx, direct(device, topic, payload, None)).await,
            Outbound::External(session) => {
                // Never waits. rumqttc takes requests only while its window
                // has room, the window frees only as the session hands on
                // the broker's PUBACKs, and the session hands events on only
                // as the pipeline (this caller) reads them: a wait here for
                // room deadlocks, and even a short one per publish slows the
                // pipeline to a crawl while the queue is full.
                if !session.send(topic, payload.to_vec(), false) {
                    site_publish_dropped(device);
                }
                true
            }
        }
    }

    /// Queues plain downlink `seq` to a device on its command topic
    /// (`south.plain_down`), tagged with its seq: the device's PUBACK comes
    /// back as [`presence::Presence::PlainDelivered`]. Offered again while
    /// queued or in flight, it is not sent twice; a device not connected
    /// is not sent it (it is offered again when the device is back).
    /// Embedded mode only (the configuration allows `plain_down` nowhere
    /// else): elsewhere nothing is sent. False once the south side is gone.
    pub async fn publish_plain(
        &self,
        device: &DeviceId,
        topic: String,
        payload: Bytes,
        seq: crate::ids::Seq,
    ) -> bool {
        match &self.0 {
            Outbound::Embedded(tx) => {
                deliver(tx, direct(device, topic, payload, Some(seq.0))).await
            }
            Outbound::External(_) => true,
        }
    }

    /// Leaves the south broker: an external session sends the acks queued
    /// before this call, then DISCONNECTs (waiting at most `within`). The
    /// embedded broker has nothing to leave.
    pub async fn close(&self, within: std::time::Duration) {
        if let Outbound::External(session) = &self.0 {
            session.close(None, within).await;
        }
    }

    /// The message behind `ack` is committed: acknowledge it to the south
    /// broker (in receive order, on its own connection).
    pub fn ack(&self, ack: Ack) {
        match (&self.0, ack.0) {
            (Outbound::External(session), AckTo::Site(token)) => session.ack(token),
            (_, AckTo::Device(acker)) => acker.ack(),
            _ => {}
        }
    }
}

/// One direct publish for `device`, tagged or not (see `DirectPublish`).
fn direct(
    device: &DeviceId,
    topic: String,
    payload: Bytes,
    tag: Option<u64>,
) -> Vec<DirectPublish> {
    vec![DirectPublish {
        client_id: device.to_string(),
        topic: Bytes::from(topic),
        payload,
        tag,
    }]
}

/// Hands `publishes` to the embedded broker; false once it is gone.
async fn deliver(tx: &rumqttd::local::Deliverer, publishes: Vec<DirectPublish>) -> bool {
    match tx.deliver(publishes).await {
        Ok(()) => true,
        Err(e) => {
            // Said once: every later send fails the same way.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| error!(event = "embedded_broker_lost", error = %e, "embedded broker link lost; stopping sends to devices"));
            false
        }
    }
}

/// Device publishes for the pipeline, in the order the broker took them.
pub struct Inbound {
    rx: mpsc::Receiver<SouthMessage>,
    /// Payload bytes in the channel, shared with the producer.
    bytes: Arc<AtomicUsize>,
    /// Embedded mode: what devices publish, straight from their
    /// connections (`rx` then brings only what the broker publishes for
    /// them: wills).
    direct: Option<(mpsc::Receiver<rumqttd::DevicePublish>, ToMessage)>,
}

/// How a publish straight from a device's connection becomes a
/// [`SouthMessage`] (`None`: dropped, unacknowledged).
pub(super) type ToMessage = fn(rumqttd::DevicePublish) -> Option<SouthMessage>;

impl Inbound {
    pub(super) fn new() -> (InboundTx, Inbound) {
        let (tx, rx) = mpsc::channel(INBOUND_CAPACITY);
        let bytes = Arc::new(AtomicUsize::new(0));
        (
            InboundTx {
                tx,
                bytes: bytes.clone(),
            },
            Inbound {
                rx,
                bytes,
                direct: None,
            },
        )
    }

    /// Also takes what devices publish straight from their connections.
    pub(super) fn with_direct(
        mut self,
        direct: mpsc::Receiver<rumqttd::DevicePublish>,
        to_message: ToMessage,
    ) -> Self {
        self.direct = Some((direct, to_message));
        self
    }

    pub async fn recv(&mut self) -> Option<SouthMessage> {
        while let Some((direct, to_message)) = &mut self.direct {
            tokio::select! {
                biased;
                Some(publish) = direct.recv() => match to_message(publish) {
                    Some(msg) => return Some(msg),
                    None => continue,
                },
                msg = self.rx.recv() => return self.took(msg),
            }
        }
        let msg = self.rx.recv().await;
        self.took(msg)
    }

    fn took(&self, msg: Option<SouthMessage>) -> Option<SouthMessage> {
        let msg = msg?;
        self.bytes.fetch_sub(msg.payload.len(), Ordering::Relaxed);
        Some(msg)
    }
}

/// The producer's end of [`Inbound`].
pub(super) struct InboundTx {
    pub(super) tx: mpsc::Sender<SouthMessage>,
    pub(super) bytes: Arc<AtomicUsize>,
}

/// The running south side.
pub struct South {
    pub inbound: Inbound,
    pub outbound: SouthSender,
    /// Resolves only if the south side stops, which is fatal.
    pub stopped: tokio::task::JoinHandle<String>,
    /// Device presence the broker reported (embedded mode only; in
    /// external mode a device's status messages are its only word).
    pub presence: Option<mpsc::UnboundedReceiver<presence::Presence>>,
}

/// What an implementation starts: [`South`], and (external mode) the
/// site session's state, `true` when up and subscribed.
pub(crate) struct Started {
    pub south: South,
    pub link: Option<mpsc::UnboundedReceiver<bool>>,
}

/// A device's control message (confirm, pull, read, nack, status), as
/// read off its topic.
#[derive(Debug, Clone)]
pub struct DeviceControl {
    pub device: DeviceId,
    pub kind: ControlKind,
    pub payload: Bytes,
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Outbound, PublishProps, SouthSender};
    use crate::ids::DeviceId;
    use crate::mqtt::by_hand::ByHand;
    use crate::mqtt::{Options, Session};

    /// The site broker acknowledges none of ferry's publishes; the
    /// pipeline publishes receipts and reads nothing meanwhile. Every
    /// publish returns at once, also once the window and rumqttc's queue
    /// are full: none blocks the pipeline (which would block the session
    /// behind it, and the PUBACKs that would free room).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_publish_towards_a_stuck_site_broker_never_waits() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut opts = Options::new("south", "127.0.0.1", port, "ferry");
        opts.auto_ack = false;
        opts.replay = false;
        opts.inflight = 4;
        let (session, _events) = Session::<()>::start(opts);
        let broker = tokio::spawn(async move {
            let mut broker = ByHand::accept(&listener, false).await;
            // Read (and never acknowledge) whatever comes, until aborted
            // (`read` gives up after 2 s of silence; the broker does not).
            loop {
                broker.read().await;
            }
        });
        let sender = SouthSender(Outbound::External(session));
        let device = DeviceId::new("d-1").unwrap();
        let mut slowest = Duration::ZERO;
        // Past the window and rumqttc's request queue (65,536).
        for n in 0..70_000 {
            let at = Instant::now();
            let publish = sender.publish(&device, "d-1/ack".into(), "{}".into());
            let returned = tokio::time::timeout(Duration::from_secs(10), publish).await;
            assert_eq!(returned, Ok(true), "publish {n} blocked for 10 s");
            slowest = slowest.max(at.elapsed());
        }
        assert!(slowest < Duration::from_millis(500), "{slowest:?}");
        assert!(super::SITE_DROPPED.load(std::sync::atomic::Ordering::Relaxed) > 0);
        broker.abort();
    }

    #[test]
    fn a_v5_publish_brings_its_user_properties_and_expiry_without_ferrys_own() {
        let props = rumqttd::protocol::PublishProperties {
            message_expiry_interval: Some(30),
            user_properties: [("b", "1"), (rumqttd::OVERSIZE_PROPERTY, "9"), ("a", "2")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            ..Default::default()
        };
        let v5 = PublishProps::of(Some(props));
        assert_eq!(v5.expiry_s, Some(30));
        assert_eq!(
            v5.user,
            [("b".to_string(), "1".to_string()), ("a".into(), "2".into())],
            "in order, the broker's own mark left out"
        );
        assert_eq!(PublishProps::of(None), PublishProps::default());
    }
}
