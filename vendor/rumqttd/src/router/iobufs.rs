use std::{
    collections::{HashMap, VecDeque},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use flume::{Receiver, Sender};
use parking_lot::Mutex;
use tracing::{debug, warn};

use crate::{
    protocol::Packet,
    router::{FilterIdx, MAX_CHANNEL_CAPACITY},
    Cursor, Notification,
};

use super::{Forward, IncomingMeter, OutgoingMeter};

const MAX_INFLIGHT: usize = 100;
/// ferry: the filter index direct publishes are recorded under in flight
/// (no log; their cursor is `None`, so no retransmission map names them).
const DIRECT_FILTER: FilterIdx = FilterIdx::MAX;
const MAX_PKID: u16 = MAX_INFLIGHT as u16;

#[derive(Debug)]
pub struct Incoming {
    /// Identifier associated with connected client
    pub(crate) client_id: String,
    /// Recv buffer
    pub(crate) buffer: Arc<Mutex<VecDeque<Packet>>>,
    /// incoming metrics
    pub(crate) meter: IncomingMeter,
    /// ferry: publishes held back, unacknowledged, while `holding`.
    pub(crate) held: VecDeque<Packet>,
    /// ferry: bytes of payload in `held`.
    pub(crate) held_bytes: usize,
    /// ferry: this client's publishes are being held back.
    pub(crate) holding: bool,
}

impl Incoming {
    #[inline]
    pub(crate) fn new(client_id: String) -> Self {
        Self {
            // ferry: allocated when used, not up front per connection.
            buffer: Arc::new(Mutex::new(VecDeque::new())),
            meter: Default::default(),
            client_id,
            held: VecDeque::new(),
            held_bytes: 0,
            holding: false,
        }
    }

    #[inline]
    pub(crate) fn buffer(&self) -> Arc<Mutex<VecDeque<Packet>>> {
        self.buffer.clone()
    }

    #[inline]
    pub(crate) fn exchange(&mut self, mut v: VecDeque<Packet>) -> VecDeque<Packet> {
        std::mem::swap(&mut v, &mut self.buffer.lock());
        v
    }
}

/// ferry: what a client is sent, in flight and queued, under one lock
/// shared by the router, the client's connection task (which settles the
/// client's PUBACKs for direct publishes itself) and the gateway's
/// deliverers (which queue direct publishes straight here, see
/// [`Directory`]): a receipt then never waits for the router's thread.
#[derive(Debug)]
pub struct Out {
    client_id: String,
    /// The connection's send buffer and its wake-up (as in [`Outgoing`]);
    /// the wake-up is dropped once the connection is closed, as the
    /// router drops its own, since the connection's task ends when the
    /// last one is gone.
    data_buffer: Arc<Mutex<VecDeque<Notification>>>,
    handle: Option<Sender<()>>,
    /// The buffer to keep track of inflight packets.
    inflight_buffer: VecDeque<(u16, FilterIdx, Option<Cursor>)>,
    /// Direct publishes (their QoS, their tag) waiting for a free slot.
    pub(crate) direct: VecDeque<(crate::protocol::Publish, u8, Option<u64>)>,
    /// The QoS 1 direct publishes in flight and their tags, oldest first
    /// (their `inflight_buffer` entries are under [`DIRECT_FILTER`]), kept
    /// for a session that outlives the connection.
    direct_inflight: VecDeque<(crate::protocol::Publish, Option<u64>)>,
    /// Where the client's PUBACK of a tagged direct publish is told
    /// ([`crate::ClientEvent::Delivered`]): the router's client events.
    pub(crate) events: Option<tokio::sync::mpsc::UnboundedSender<crate::ClientEvent>>,
    /// The CONNACK is not out yet: nothing is delivered before it.
    pub(crate) connack_pending: bool,
    /// Last packet id
    last_pkid: u16,
    /// Publishes in flight at most: [`MAX_INFLIGHT`], or fewer when the
    /// client's receive maximum (MQTT 5) says so.
    max_inflight: usize,
    /// The largest packet the client reads (0: no limit said).
    pub(crate) max_packet_size: usize,
    /// Metrics of outgoing messages of this connection
    pub(crate) meter: OutgoingMeter,
    /// The client's subscriptions and their QoS, as the router granted
    /// them: a direct publish goes at the highest QoS among those that
    /// match its topic (at most 1), or not at all.
    pub(crate) subscriptions: Vec<(String, u8)>,
    /// The connection is gone (or never was registered): what is meant for
    /// the client goes through the router, to its session if it has one.
    pub(crate) closed: bool,
    /// `RouterConfig::max_direct_queue` (0: none), for a holdable client.
    max_queue: usize,
    /// Shared with the connection's task: the client has `max_queue`
    /// direct publishes unread (and until it is down to half of that), so
    /// its task hands none of its publishes on to the gateway meanwhile.
    pub(crate) behind: Arc<AtomicBool>,
}

/// What became of a direct publish offered to [`Out::deliver`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Delivered {
    Queued,
    /// The client holds no subscription that matches it.
    NotSubscribed,
    /// Larger than the client's maximum packet size (MQTT 5).
    TooLarge,
}

impl Out {
    pub fn free_slots(&self) -> usize {
        self.max_inflight.saturating_sub(self.inflight_buffer.len())
    }

    /// Wakes the connection's task to send what is in its buffer.
    fn wake(&self) {
        if let Some(handle) = &self.handle {
            handle.try_send(()).ok();
        }
    }

    /// The connection is gone: nothing more is queued here, and its wake-up
    /// is let go.
    pub(crate) fn close(&mut self) {
        self.closed = true;
        self.handle = None;
    }

    /// Holds what is sent to the client's own limits (MQTT 5's receive
    /// maximum and maximum packet size; 0: no limit said), and its queue
    /// to `max_queue` unread direct publishes when it is holdable.
    pub(crate) fn set_client_limits(
        &mut self,
        receive_max: u16,
        max_packet_size: u32,
        max_queue: usize,
    ) {
        self.max_inflight = (receive_max as usize).clamp(1, MAX_INFLIGHT);
        self.max_packet_size = max_packet_size as usize;
        self.max_queue = max_queue;
    }

    /// Push packets to the outgoing buffer.
    pub fn push_forwards(
        &mut self,
        publishes: impl Iterator<Item = Forward>,
        qos: u8,
        filter_idx: usize,
    ) -> (usize, usize) {
        let mut buffer = self.data_buffer.lock();

        if qos == 0 {
            for p in publishes {
                self.meter.publish_count += 1;
                buffer.push_back(Notification::Forward(p));
            }
            let buffer_count = buffer.len();
            let inflight_count = self.inflight_buffer.len();
            return (buffer_count, inflight_count);
        }

        for mut p in publishes {
            // Index and pkid of current outgoing packet
            self.last_pkid += 1;
            p.publish.pkid = self.last_pkid;

            self.inflight_buffer
                .push_back((self.last_pkid, filter_idx, p.cursor));

            // Place max pkid packet at index 0
            if self.last_pkid == MAX_PKID {
                self.last_pkid = 0;
            }

            self.meter.publish_count += 1;
            self.meter.total_size += p.publish.topic.len() + p.publish.payload.len();
            buffer.push_back(Notification::Forward(p));
        }

        let buffer_count = buffer.len();
        let inflight_count = self.inflight_buffer.len();

        if inflight_count > MAX_INFLIGHT {
            warn!(
                event = "inflight_over_max",
                "More inflight publishes than max allowed, inflight count = {}, max allowed = {}",
                inflight_count,
                MAX_INFLIGHT
            );
        }

        (buffer_count, inflight_count)
    }

    /// Queues a direct publish for the client if one of its subscriptions
    /// matches the topic (at that subscription's QoS, at most 1), and
    /// moves what is queued into flight while there is room.
    pub(crate) fn deliver(&mut self, d: crate::DirectPublish) -> Delivered {
        // A tagged publish already queued or in flight is not sent twice:
        // the gateway may offer it again (a resumed session holds it).
        if let Some(tag) = d.tag {
            let held = self.direct.iter().any(|(_, _, t)| *t == Some(tag))
                || self.direct_inflight.iter().any(|(_, t)| *t == Some(tag));
            if held {
                return Delivered::Queued;
            }
        }
        let topic = std::str::from_utf8(&d.topic).unwrap_or_default();
        let qos = self
            .subscriptions
            .iter()
            .filter(|(f, _)| crate::protocol::matches(topic, f))
            .map(|(_, q)| *q)
            .max();
        let Some(qos) = qos else {
            debug!(
                client_id = %crate::refusals::Clip(&self.client_id),
                topic, "direct publish for a client not subscribed dropped"
            );
            return Delivered::NotSubscribed;
        };
        let qos = qos.min(1);
        // A packet over the client's maximum packet size (MQTT 5) is not
        // sent (§3.1.2.11.4): counted, said, and left to the protocol (the
        // gateway's message stays where its receipts say).
        let size = d.topic.len() + d.payload.len() + 16;
        if self.max_packet_size > 0 && size > self.max_packet_size {
            crate::counters::DIRECT_TOO_LARGE.fetch_add(1, Ordering::Relaxed);
            if crate::refusals::admit_client(&self.client_id) {
                warn!(
                    event = "delivery_over_client_packet_size",
                    client_id = %crate::refusals::Clip(&self.client_id),
                    bytes = size,
                    limit = self.max_packet_size,
                    "a delivery over the client's maximum packet size was not sent"
                );
            }
            return Delivered::TooLarge;
        }
        let publish = crate::protocol::Publish {
            dup: false,
            qos: crate::protocol::qos(qos).unwrap_or(crate::protocol::QoS::AtMostOnce),
            retain: false,
            topic: d.topic,
            pkid: 0,
            payload: d.payload,
        };
        self.direct.push_back((publish, qos, d.tag));
        Delivered::Queued
    }

    /// Moves queued direct publishes into flight while there is room;
    /// true if any moved (the connection is woken to send them).
    pub(crate) fn flush_direct(&mut self) -> bool {
        let mut moved = false;
        if self.connack_pending {
            return false;
        }
        while let Some((_, qos, _)) = self.direct.front() {
            if *qos > 0 && self.free_slots() == 0 {
                break;
            }
            let (mut publish, qos, tag) = self.direct.pop_front().expect("front exists");
            moved = true;
            if qos == 0 {
                let forward = Forward {
                    cursor: None,
                    size: 0,
                    publish,
                    properties: None,
                };
                self.push_forwards(std::iter::once(forward), 0, DIRECT_FILTER);
                continue;
            }
            // A publish a resumed session sent before goes again under its
            // own packet id [MQTT-4.4.0-1], and the ids go on after it;
            // any other takes the next one.
            if publish.pkid == 0 {
                self.last_pkid = if self.last_pkid >= MAX_PKID {
                    1
                } else {
                    self.last_pkid + 1
                };
                publish.pkid = self.last_pkid;
            } else {
                self.last_pkid = publish.pkid;
            }
            self.direct_inflight.push_back((publish.clone(), tag));
            self.inflight_buffer
                .push_back((publish.pkid, DIRECT_FILTER, None));
            self.meter.publish_count += 1;
            self.meter.total_size += publish.topic.len() + publish.payload.len();
            self.data_buffer
                .lock()
                .push_back(Notification::Forward(Forward {
                    cursor: None,
                    size: 0,
                    publish,
                    properties: None,
                }));
        }
        if moved {
            self.wake();
        }
        moved
    }

    // Returns (unsolicited, outoforder) flags
    // Return: Out of order or unsolicited acks
    pub fn register_ack(&mut self, pkid: u16) -> Option<()> {
        let (head, filter_idx, _cursor) = self.inflight_buffer.pop_front()?;
        if filter_idx == DIRECT_FILTER {
            self.direct_acked();
        }

        // We don't support out of order acks
        if pkid != head {
            // ferry: the client's fault, logged (within its budget) by the caller.
            debug!(pkid, head, "out of order ack.");
            return None;
        }

        Some(())
    }

    /// The client's PUBACK `pkid` settled here, by its connection's task,
    /// if it is for the direct publish at the head of what is in flight:
    /// the next ones move into flight. Anything else (a publish from a
    /// log, an unsolicited ack) is the router's to settle: false.
    pub(crate) fn ack_direct(&mut self, pkid: u16) -> bool {
        match self.inflight_buffer.front() {
            Some(&(head, DIRECT_FILTER, _)) if head == pkid => {
                self.inflight_buffer.pop_front();
                self.direct_acked();
                self.flush_direct();
                self.update_behind();
                true
            }
            _ => false,
        }
    }

    /// The direct publish at the head of the flight is acknowledged: its
    /// tag, if it has one, is told as delivered.
    fn direct_acked(&mut self) {
        if let Some((_, Some(tag))) = self.direct_inflight.pop_front() {
            if let Some(events) = &self.events {
                let _ = events.send(crate::ClientEvent::Delivered {
                    client_id: self.client_id.clone(),
                    tag,
                });
            }
        }
    }

    /// Whether the client has too many direct publishes unread
    /// (`max_queue`, and until it is down to half of that), told through
    /// the flag its connection's task reads; the task is woken when it
    /// clears.
    pub(crate) fn update_behind(&mut self) {
        let was = self.behind.load(Ordering::Acquire);
        let queued = self.direct.len();
        let max = self.max_queue;
        let behind = max > 0 && if was { queued > max / 2 } else { queued >= max };
        if behind != was {
            self.behind.store(behind, Ordering::Release);
            debug!(
                client_id = %crate::refusals::Clip(&self.client_id),
                queued,
                behind,
                "client's publishes held back / released for its unread deliveries"
            );
            if !behind {
                self.wake();
            }
        }
    }

    /// The QoS 1 direct publishes not acknowledged, in the order they
    /// were meant to reach the client: those in flight, then those queued
    /// (for a session that outlives the connection).
    ///
    /// A tagged one is kept only while in flight, with its tag (its packet
    /// id names it again on resume); one queued is the gateway's to offer
    /// again when the client is back.
    pub(crate) fn take_unacked_direct(&mut self) -> Vec<(crate::protocol::Publish, Option<u64>)> {
        let mut unacked: Vec<_> = self.direct_inflight.drain(..).collect();
        unacked.extend(
            self.direct
                .drain(..)
                .filter(|(_, q, tag)| *q > 0 && tag.is_none())
                .map(|(p, _, _)| (p, None)),
        );
        unacked
    }

    // Here we are assuming that the first unique filter_idx we find while iterating will have the
    // least corresponding cursor because of the way we insert into the inflight_buffer
    pub fn retransmission_map(&self) -> HashMap<FilterIdx, Cursor> {
        let mut o = HashMap::new();
        for (_, filter_idx, cursor) in self.inflight_buffer.iter() {
            // if cursor in None, it means it was a retained publish
            if !o.contains_key(filter_idx) && cursor.is_some() {
                o.insert(*filter_idx, cursor.unwrap());
            }
        }

        o
    }
}

#[derive(Debug)]
pub struct Outgoing {
    /// Client identifier
    pub(crate) client_id: String,
    /// Send buffer
    pub(crate) data_buffer: Arc<Mutex<VecDeque<Notification>>>,
    /// Handle which is given to router to allow router to communicate with this connection
    pub(crate) handle: Sender<()>,
    /// PubRels waiting for PubComp
    pub(crate) unacked_pubrels: VecDeque<u16>,
    /// ferry: what is in flight and queued, shared (see [`Out`]).
    pub(crate) out: Arc<Mutex<Out>>,
}

impl Outgoing {
    #[inline]
    pub(crate) fn new(client_id: String) -> (Self, Receiver<()>) {
        let (handle, rx) = flume::bounded(MAX_CHANNEL_CAPACITY);
        // ferry: allocated when used, not up front per connection (an idle
        // device cost tens of KiB in these alone).
        let data_buffer = Arc::new(Mutex::new(VecDeque::new()));
        let out = Out {
            client_id: client_id.clone(),
            data_buffer: data_buffer.clone(),
            handle: Some(handle.clone()),
            inflight_buffer: VecDeque::new(),
            direct: VecDeque::new(),
            direct_inflight: VecDeque::new(),
            events: None,
            connack_pending: true,
            last_pkid: 0,
            max_inflight: MAX_INFLIGHT,
            max_packet_size: 0,
            meter: Default::default(),
            subscriptions: Vec::new(),
            closed: true,
            max_queue: 0,
            behind: Arc::new(AtomicBool::new(false)),
        };
        let outgoing = Self {
            client_id,
            data_buffer,
            handle,
            unacked_pubrels: VecDeque::new(),
            out: Arc::new(Mutex::new(out)),
        };

        (outgoing, rx)
    }

    #[inline]
    pub(crate) fn buffer(&self) -> Arc<Mutex<VecDeque<Notification>>> {
        self.data_buffer.clone()
    }

    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, Out> {
        self.out.lock()
    }

    pub fn free_slots(&self) -> usize {
        self.lock().free_slots()
    }

    pub fn push_notification(&mut self, notification: Notification) -> usize {
        let mut buffer = self.data_buffer.lock();
        buffer.push_back(notification);
        buffer.len()
    }

    /// Push packets to the outgoing buffer.
    pub fn push_forwards(
        &mut self,
        publishes: impl Iterator<Item = Forward>,
        qos: u8,
        filter_idx: usize,
    ) -> (usize, usize) {
        self.lock().push_forwards(publishes, qos, filter_idx)
    }

    pub(crate) fn flush_direct(&mut self) -> bool {
        self.lock().flush_direct()
    }

    pub fn register_ack(&mut self, pkid: u16) -> Option<()> {
        self.lock().register_ack(pkid)
    }

    pub(crate) fn take_unacked_direct(&mut self) -> Vec<(crate::protocol::Publish, Option<u64>)> {
        self.lock().take_unacked_direct()
    }

    pub fn register_pubrec(&mut self, pkid: u16) {
        // NOTE: we can return true of false
        // to indicate whether this is duplicate or not
        self.unacked_pubrels.push_back(pkid);
    }

    // OASIS standards don't specify anything about ordering of PubComp
    // https://docs.oasis-open.org/mqtt/mqtt/v5.0/os/mqtt-v5.0-os.html#_Toc3901240
    // But we don't support out of order / unsolicited pubcomps
    // to be consistent with the behaviour with other acks
    pub fn register_pubcomp(&mut self, pkid: u16) -> Option<()> {
        let id = self.unacked_pubrels.pop_front()?;

        // out of order acks
        if pkid != id {
            // ferry: as above.
            debug!(pkid, id, "out of order ack.");
            return None;
        }

        Some(())
    }

    pub fn retransmission_map(&self) -> HashMap<FilterIdx, Cursor> {
        self.lock().retransmission_map()
    }
}

/// ferry: the connections direct publishes can be queued on without the
/// router (see [`Out`]), by client id, kept by the router as clients come
/// and go; and how many deliveries are on their way through the router
/// meanwhile (for a client not connected at the time): while any is, every
/// delivery goes that way too, so none overtakes another.
#[derive(Debug, Default)]
pub struct Directory {
    pub(crate) links: parking_lot::RwLock<HashMap<String, Arc<Mutex<Out>>>>,
    pub(crate) via_router: std::sync::atomic::AtomicUsize,
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn retransmission_map_is_calculated_accurately() {
        let (outgoing, _) = Outgoing::new("retransmission-test".to_string());
        let mut result = HashMap::new();

        result.insert(0, (0, 8));
        result.insert(1, (0, 1));
        result.insert(2, (1, 1));
        result.insert(3, (1, 0));

        let buf = vec![
            (1, 0, Some((0, 8))),
            (1, 0, Some((0, 10))),
            (1, 1, Some((0, 1))),
            (3, 1, Some((0, 4))),
            (2, 2, Some((1, 1))),
            (1, 2, Some((2, 6))),
            (1, 2, Some((2, 1))),
            (1, 3, Some((1, 0))),
            (1, 3, Some((1, 1))),
            (1, 3, Some((1, 3))),
            (1, 3, Some((1, 3))),
        ];

        outgoing.lock().inflight_buffer.extend(buf);
        assert_eq!(outgoing.retransmission_map(), result);
    }

    fn direct(topic: &str) -> crate::DirectPublish {
        crate::DirectPublish {
            client_id: "dev-1".into(),
            topic: bytes::Bytes::copy_from_slice(topic.as_bytes()),
            payload: bytes::Bytes::from_static(b"{}"),
            tag: None,
        }
    }

    /// An `Out` as the router leaves it for a connected client: its CONNACK
    /// out, subscribed to its `ack` at QoS 1, `max_queue` unread at most.
    fn connected(receive_max: u16, max_queue: usize) -> (Outgoing, Receiver<()>) {
        let (outgoing, rx) = Outgoing::new("dev-1".to_string());
        {
            let mut out = outgoing.lock();
            out.set_client_limits(receive_max, 0, max_queue);
            out.subscriptions = vec![("devices/dev-1/ack".into(), 1)];
            out.connack_pending = false;
            out.closed = false;
        }
        (outgoing, rx)
    }

    fn sent_pkids(outgoing: &Outgoing) -> Vec<u16> {
        outgoing
            .data_buffer
            .lock()
            .drain(..)
            .filter_map(|n| match n {
                Notification::Forward(f) => Some(f.publish.pkid),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_direct_publish_goes_only_where_the_client_subscribed() {
        let (outgoing, _rx) = connected(10, 0);
        let mut out = outgoing.lock();
        assert_eq!(out.deliver(direct("devices/dev-1/ack")), Delivered::Queued);
        assert_eq!(
            out.deliver(direct("devices/dev-1/inbox")),
            Delivered::NotSubscribed
        );
        out.max_packet_size = 20;
        assert_eq!(
            out.deliver(direct("devices/dev-1/ack")),
            Delivered::TooLarge
        );
    }

    #[test]
    fn the_connection_settles_the_pubacks_of_direct_publishes_in_order() {
        let (outgoing, rx) = connected(2, 0);
        {
            let mut out = outgoing.lock();
            for _ in 0..3 {
                out.deliver(direct("devices/dev-1/ack"));
            }
            out.flush_direct();
        }
        assert!(rx.try_recv().is_ok(), "the connection is woken");
        assert_eq!(sent_pkids(&outgoing), [1, 2], "two in flight, as it allows");
        let mut out = outgoing.lock();
        assert!(!out.ack_direct(2), "not the head: the router's to judge");
        assert!(out.ack_direct(1));
        drop(out);
        assert_eq!(sent_pkids(&outgoing), [3], "the third goes into flight");
        let mut out = outgoing.lock();
        assert!(out.ack_direct(2) && out.ack_direct(3));
        assert!(!out.ack_direct(4), "nothing in flight: unsolicited");
        assert!(out.take_unacked_direct().is_empty());
    }

    #[test]
    fn a_resumed_publish_goes_again_under_its_own_packet_id_and_new_ones_follow_it() {
        let (outgoing, _rx) = connected(10, 0);
        {
            let mut out = outgoing.lock();
            let mut again = crate::protocol::Publish::new("devices/dev-1/ack", "r", false);
            again.qos = crate::protocol::QoS::AtLeastOnce;
            again.pkid = 7;
            again.dup = true;
            out.direct.push_front((again, 1, None));
            out.deliver(direct("devices/dev-1/ack"));
            out.flush_direct();
        }
        assert_eq!(sent_pkids(&outgoing), [7, 8]);
        let mut out = outgoing.lock();
        let unacked = out.take_unacked_direct();
        assert_eq!(
            unacked.iter().map(|(p, _)| p.pkid).collect::<Vec<_>>(),
            [7, 8],
            "what is in flight keeps the ids it was sent under"
        );
    }

    #[test]
    fn a_tagged_publish_is_offered_once_its_puback_told_and_only_its_flight_kept() {
        let (outgoing, _rx) = connected(1, 0);
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let tagged = |tag| crate::DirectPublish {
            tag: Some(tag),
            ..direct("devices/dev-1/ack")
        };
        {
            let mut out = outgoing.lock();
            out.events = Some(tx);
            assert_eq!(out.deliver(tagged(7)), Delivered::Queued);
            out.flush_direct();
            assert_eq!(out.deliver(tagged(7)), Delivered::Queued, "again");
            out.deliver(tagged(8));
            out.flush_direct();
        }
        assert_eq!(sent_pkids(&outgoing), [1], "7 once; 8 waits for room");
        let mut out = outgoing.lock();
        assert!(out.ack_direct(1));
        assert_eq!(
            events.try_recv().ok(),
            Some(crate::ClientEvent::Delivered {
                client_id: "dev-1".into(),
                tag: 7
            })
        );
        out.deliver(tagged(9));
        let unacked = out.take_unacked_direct();
        assert_eq!(
            unacked
                .iter()
                .map(|(p, t)| (p.pkid, *t))
                .collect::<Vec<_>>(),
            [(2, Some(8))],
            "8 in flight is kept with its tag; 9, queued, is the gateway's to offer again"
        );
    }

    #[test]
    fn a_client_with_its_queue_full_is_behind_until_it_is_down_to_half() {
        let (outgoing, rx) = connected(1, 4);
        let mut out = outgoing.lock();
        for _ in 0..5 {
            out.deliver(direct("devices/dev-1/ack"));
            out.flush_direct();
            out.update_behind();
        }
        // One in flight, four queued: behind.
        assert!(out.behind.load(Ordering::Acquire));
        while rx.try_recv().is_ok() {}
        out.ack_direct(1);
        assert!(
            out.behind.load(Ordering::Acquire),
            "three queued: still behind"
        );
        out.ack_direct(2);
        assert!(!out.behind.load(Ordering::Acquire), "two queued: released");
        assert!(rx.try_recv().is_ok(), "and woken to go on");
    }

    #[test]
    fn a_closed_connection_lets_its_wake_up_go() {
        let (outgoing, rx) = connected(10, 0);
        let shared = outgoing.out.clone();
        shared.lock().close();
        drop(outgoing);
        // The connection's task ends when no wake-up is left, though the
        // shared state outlives the router's side (its task holds it).
        assert!(matches!(
            rx.try_recv(),
            Err(flume::TryRecvError::Disconnected)
        ));
        assert!(shared.lock().closed);
    }

    // use super::{Outgoing, MAX_INFLIGHT};
    // use crate::protocol::{Publish, QoS};
    // use crate::router::Forward;
    // use crate::Notification;
    //
    // fn publishes(count: usize) -> impl Iterator<Item = Forward> {
    //     (1..=count).map(|v| {
    //         let publish = Publish {
    //             dup: false,
    //             retain: false,
    //             pkid: 0,
    //             qos: QoS::AtLeastOnce,
    //             topic: "hello/world".into(),
    //             payload: vec![1, 2, 3].into(),
    //         };
    //
    //         Forward {
    //             cursor: (0, v as u64),
    //             publish,
    //             size: 0,
    //         }
    //     })
    // }
    //
    // #[test]
    // fn inflight_ring_buffer_pushes_correctly() {
    //     let count = MAX_INFLIGHT as usize;
    //     let (mut outgoing, _rx) = Outgoing::new("hello".to_owned());
    //     outgoing.push_forwards(publishes(count), 1, 3);
    //
    //     // Index 1 = (0, 1), Index 99 = (0, 99), Index 0 = (0, 100)
    //     assert_eq!(outgoing.inflight_buffer[0].unwrap().1, (0, count as u64));
    //     for i in 1..count {
    //         assert_eq!(outgoing.inflight_buffer[i].unwrap().1, (0, i as u64));
    //     }
    //
    //     // Outgoing publish pkids are as expected
    //     for (i, o) in outgoing.data_buffer.lock().iter().enumerate() {
    //         let pkid = match &o {
    //             Notification::Forward(f) => f.publish.pkid,
    //             _ => unreachable!(),
    //         };
    //
    //         assert_eq!(pkid, i as u16 + 1);
    //     }
    // }
    //
    // #[test]
    // fn inflight_ring_buffer_pops_correctly() {
    //     let (mut outgoing, _rx) = Outgoing::new("hello".to_owned());
    //     outgoing.push_forwards(publishes(MAX_INFLIGHT as usize), 1, 3);
    //
    //     for pkid in 1..=MAX_INFLIGHT {
    //         let (unsolicited, outoforder) = outgoing.register_ack(pkid);
    //         assert_eq!(unsolicited, false);
    //         assert_eq!(outoforder, false);
    //     }
    // }
}
