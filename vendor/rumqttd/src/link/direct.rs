//! ferry: a client's publishes handed from its connection's task straight
//! to the gateway ([`PublishSink`]), and acknowledged (PUBACK, PUBREC)
//! only once the gateway says so ([`Acker::ack`]), in the order they came.
//!
//! Nothing of a publish passes the router: it would only hold it in a
//! commit log the gateway reads back, and acknowledge it from there, before
//! anything was on disk. Here the gateway commits it, and its ack is the
//! connection's PUBACK.
//!
//! An ack the gateway drops unanswered (its store failed, it is stopping)
//! ends the connection: what was not acknowledged the client sends again.
//!
//! Each publish is numbered ([`DevicePublish::number`]), once per process:
//! a resend (DUP) of a publish whose acknowledgement its connection never
//! wrote carries the first send's number, so the gateway can tell a
//! client's redelivery from a new message that happens to reuse a packet
//! id (`Numbers`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};

use crate::protocol::{
    Packet, PubAck, PubAckReason, PubComp, PubCompReason, PubRec, PubRecReason, Publish,
    PublishProperties, QoS,
};

/// A client's publish, for the gateway.
#[derive(Debug)]
pub struct DevicePublish {
    /// The client that sent it.
    pub client_id: Arc<str>,
    pub publish: Publish,
    pub properties: Option<PublishProperties>,
    /// Unique per sink, from 1 on; a resend (DUP, same packet id) of a
    /// publish whose PUBACK (PUBREC) the client's last connection never
    /// wrote carries that publish's number instead.
    pub number: u64,
    /// Its acknowledgement to the client (QoS 1 and 2): answer it once the
    /// publish is committed or its refusal answered. Dropped unanswered,
    /// it ends the client's connection.
    pub ack: Option<Acker>,
    /// Its share of the bytes the sink may hold; freed with it.
    _bytes: Option<OwnedSemaphorePermit>,
}

impl DevicePublish {
    /// Frees its share of the sink's bytes (the gateway has taken it).
    pub fn taken(&mut self) {
        self._bytes = None;
    }
}

/// Where connections hand their clients' publishes: a bounded channel,
/// bounded in bytes too. A connection whose publish finds it full waits,
/// reading nothing more from its client meanwhile.
#[derive(Clone, Debug)]
pub struct PublishSink {
    tx: mpsc::Sender<DevicePublish>,
    bytes: Arc<Semaphore>,
    max_bytes: u32,
    numbers: Arc<Numbers>,
}

/// How long the publishes a connection left unacknowledged are kept for a
/// resend on the client's next connection.
const UNWRITTEN_KEPT: Duration = Duration::from_secs(24 * 3600);
/// Clients whose unacknowledged publishes are kept, at most (the oldest
/// go first): a resend past it is numbered as new.
const UNWRITTEN_CLIENTS: usize = 65_536;

/// The sink's numbering, and each client's publishes its last connection
/// took but never acknowledged on the wire: `(packet id, number)`.
#[derive(Debug, Default)]
struct Numbers {
    next: AtomicU64,
    /// The clients in `unwritten` (read without the lock: most publishes
    /// find nobody there).
    clients: AtomicUsize,
    unwritten: Mutex<HashMap<Arc<str>, Unwritten>>,
}

/// When a client's connection ended, and the packet ids it left
/// unacknowledged with their publish numbers.
type Unwritten = (Instant, Vec<(u16, u64)>);

impl Numbers {
    fn fresh(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// `publish`'s number: its first send's, when it is a resend of one
    /// left unacknowledged; a new one otherwise. A publish that reuses
    /// the packet id without DUP ends the wait for that id's resend.
    fn of(&self, client: &Arc<str>, publish: &Publish) -> u64 {
        if publish.qos == QoS::AtMostOnce || self.clients.load(Ordering::Relaxed) == 0 {
            return self.fresh();
        }
        let mut unwritten = self.unwritten.lock().unwrap_or_else(|e| e.into_inner());
        let first = unwritten.get_mut(client).and_then(|(_, left)| {
            let at = left.iter().position(|(pkid, _)| *pkid == publish.pkid)?;
            let (_, number) = left.swap_remove(at);
            Some(number)
        });
        if unwritten
            .get(client)
            .is_some_and(|(_, left)| left.is_empty())
        {
            unwritten.remove(client);
        }
        self.clients.store(unwritten.len(), Ordering::Relaxed);
        drop(unwritten);
        match first {
            Some(number) if publish.dup => number,
            _ => self.fresh(),
        }
    }

    /// A connection of `client` ended with `left` unacknowledged on the
    /// wire.
    fn left(&self, client: &Arc<str>, left: Vec<(u16, u64)>) {
        let mut unwritten = self.unwritten.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        unwritten.retain(|_, (at, _)| now.duration_since(*at) < UNWRITTEN_KEPT);
        if left.is_empty() {
            unwritten.remove(client);
        } else {
            if unwritten.len() >= UNWRITTEN_CLIENTS && !unwritten.contains_key(client) {
                let oldest = unwritten
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(c, _)| c.clone());
                if let Some(oldest) = oldest {
                    unwritten.remove(&oldest);
                }
            }
            unwritten.insert(client.clone(), (now, left));
        }
        self.clients.store(unwritten.len(), Ordering::Relaxed);
    }

    /// `client` starts a clean session: it resends nothing of before.
    fn forget(&self, client: &str) {
        if self.clients.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut unwritten = self.unwritten.lock().unwrap_or_else(|e| e.into_inner());
        unwritten.remove(client);
        self.clients.store(unwritten.len(), Ordering::Relaxed);
    }
}

impl PublishSink {
    /// A sink of `capacity` publishes and `max_bytes` of payload at most,
    /// and its receiving end.
    pub fn new(capacity: usize, max_bytes: u32) -> (PublishSink, mpsc::Receiver<DevicePublish>) {
        let (tx, rx) = mpsc::channel(capacity);
        let bytes = Arc::new(Semaphore::new(max_bytes as usize));
        let sink = PublishSink {
            tx,
            bytes,
            max_bytes,
            numbers: Arc::default(),
        };
        (sink, rx)
    }

    /// `publish`'s number (see [`DevicePublish::number`]).
    pub(crate) fn number(&self, client_id: &Arc<str>, publish: &Publish) -> u64 {
        self.numbers.of(client_id, publish)
    }

    /// A connection of `client_id` ended with these publishes
    /// (`(packet id, number)`) unacknowledged on the wire.
    pub(crate) fn left_unacknowledged(&self, client_id: &Arc<str>, left: Vec<(u16, u64)>) {
        self.numbers.left(client_id, left)
    }

    /// `client_id` starts a clean session.
    pub(crate) fn clean_start(&self, client_id: &str) {
        self.numbers.forget(client_id)
    }

    /// Hands `publish` on, waiting for room; false once the gateway is gone.
    pub(crate) async fn send(
        &self,
        client_id: &Arc<str>,
        publish: Publish,
        properties: Option<PublishProperties>,
        number: u64,
        ack: Option<Acker>,
    ) -> bool {
        // A publish larger than the whole budget waits for all of it.
        let n = (publish.payload.len().min(self.max_bytes as usize) as u32).max(1);
        let Ok(permit) = self.bytes.clone().acquire_many_owned(n).await else {
            return false;
        };
        let publish = DevicePublish {
            client_id: client_id.clone(),
            publish,
            properties,
            number,
            ack,
            _bytes: Some(permit),
        };
        self.tx.send(publish).await.is_ok()
    }
}

/// What became of one acknowledgement the gateway holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Waiting,
    Acked,
    Dropped,
}

#[derive(Debug, Default)]
struct Slots {
    /// The number of the first slot in `outcomes`.
    first: u64,
    outcomes: VecDeque<Outcome>,
}

#[derive(Debug, Default)]
struct Shared {
    slots: Mutex<Slots>,
    ready: Notify,
}

/// The acknowledgement of one publish, held by the gateway.
#[derive(Debug)]
pub struct Acker {
    shared: Arc<Shared>,
    slot: u64,
    answered: bool,
}

impl Acker {
    /// The publish is committed (or its refusal answered): the client gets
    /// its PUBACK (PUBREC) once every publish before it has had its own.
    pub fn ack(mut self) {
        self.answered = true;
        self.set(Outcome::Acked);
    }

    fn set(&self, outcome: Outcome) {
        let mut slots = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
        let Some(at) = self.slot.checked_sub(slots.first) else {
            return;
        };
        if let Some(o) = slots.outcomes.get_mut(at as usize) {
            *o = outcome;
        }
        let head = at == 0;
        drop(slots);
        if head {
            self.shared.ready.notify_one();
        }
    }
}

impl Drop for Acker {
    fn drop(&mut self) {
        if !self.answered {
            self.set(Outcome::Dropped);
        }
    }
}

/// A connection's acknowledgements, in the order its publishes came.
#[derive(Debug, Default)]
pub(crate) struct Acks {
    shared: Arc<Shared>,
    /// The packet each slot answers with, in slot order, and the number
    /// of the publish it acknowledges.
    packets: VecDeque<(Packet, Option<u64>)>,
}

/// Acknowledgements waiting at most, per connection: past it the
/// connection reads nothing more from its client until some are answered
/// (an MQTT 5 client is held to its receive maximum well before).
pub(crate) const MAX_WAITING: usize = 1024;

impl Acks {
    /// Whether there is room for another publish.
    pub(crate) fn has_room(&self) -> bool {
        self.packets.len() < MAX_WAITING
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// A slot for `publish`'s acknowledgement, if its QoS has one.
    /// A quarantined publish (isolation put it there) is acknowledged too,
    /// and an MQTT 5 client told it was not authorized.
    pub(crate) fn slot(&mut self, publish: &Publish, number: u64) -> Option<Acker> {
        let quarantined = &publish.topic[..] == crate::QUARANTINE_TOPIC.as_bytes();
        let packet = match publish.qos {
            QoS::AtMostOnce => return None,
            QoS::AtLeastOnce => {
                let ack = PubAck {
                    pkid: publish.pkid,
                    reason: if quarantined {
                        PubAckReason::NotAuthorized
                    } else {
                        PubAckReason::Success
                    },
                };
                Packet::PubAck(ack, None)
            }
            QoS::ExactlyOnce => {
                let rec = PubRec {
                    pkid: publish.pkid,
                    reason: if quarantined {
                        PubRecReason::NotAuthorized
                    } else {
                        PubRecReason::Success
                    },
                };
                Packet::PubRec(rec, None)
            }
        };
        Some(self.push(packet, Some(number), Outcome::Waiting))
    }

    /// The publishes not acknowledged on the wire yet: `(packet id,
    /// number)`.
    pub(crate) fn unacknowledged(&self) -> Vec<(u16, u64)> {
        self.packets
            .iter()
            .filter_map(|(packet, number)| match packet {
                Packet::PubAck(ack, _) => Some((ack.pkid, (*number)?)),
                Packet::PubRec(rec, _) => Some((rec.pkid, (*number)?)),
                _ => None,
            })
            .collect()
    }

    /// A PUBREL's PUBCOMP, answered in turn: the publish it releases was
    /// handed on when it came (ferry keeps one copy of a message, by its
    /// id, however often it comes).
    pub(crate) fn release(&mut self, pkid: u16) {
        let comp = PubComp {
            pkid,
            reason: PubCompReason::Success,
        };
        let acker = self.push(Packet::PubComp(comp, None), None, Outcome::Acked);
        drop(acker);
    }

    fn push(&mut self, packet: Packet, number: Option<u64>, outcome: Outcome) -> Acker {
        let mut slots = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.first + slots.outcomes.len() as u64;
        slots.outcomes.push_back(outcome);
        let head = slots.outcomes.len() == 1 && outcome != Outcome::Waiting;
        drop(slots);
        self.packets.push_back((packet, number));
        if head {
            self.shared.ready.notify_one();
        }
        Acker {
            shared: self.shared.clone(),
            slot,
            answered: outcome != Outcome::Waiting,
        }
    }

    /// Waits until the first acknowledgement is answered.
    pub(crate) async fn ready(&self) {
        self.shared.ready.notified().await
    }

    /// The acknowledgements answered, from the first on, to be written;
    /// `Err` when the gateway dropped one unanswered.
    pub(crate) fn answered(&mut self, out: &mut Vec<Packet>) -> Result<(), Dropped> {
        let mut slots = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(&outcome) = slots.outcomes.front() {
            match outcome {
                Outcome::Waiting => break,
                Outcome::Dropped => return Err(Dropped),
                Outcome::Acked => {
                    slots.outcomes.pop_front();
                    slots.first += 1;
                    out.extend(self.packets.pop_front().map(|(packet, _)| packet));
                }
            }
        }
        Ok(())
    }
}

/// The gateway dropped an acknowledgement unanswered.
#[derive(Debug)]
pub(crate) struct Dropped;

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn publish(pkid: u16, qos: QoS) -> Publish {
        let mut p = Publish::new(Bytes::from_static(b"t"), Bytes::from_static(b"x"), false);
        p.pkid = pkid;
        p.qos = qos;
        p
    }

    fn pkids(packets: &[Packet]) -> Vec<u16> {
        packets
            .iter()
            .map(|p| match p {
                Packet::PubAck(a, _) => a.pkid,
                Packet::PubRec(r, _) => r.pkid,
                Packet::PubComp(c, _) => c.pkid,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn acknowledgements_go_out_in_arrival_order_whatever_order_they_are_answered_in() {
        let mut acks = Acks::default();
        let one = acks.slot(&publish(1, QoS::AtLeastOnce), 1).unwrap();
        let two = acks.slot(&publish(2, QoS::ExactlyOnce), 2).unwrap();
        assert!(acks.slot(&publish(0, QoS::AtMostOnce), 0).is_none());
        let three = acks.slot(&publish(3, QoS::AtLeastOnce), 3).unwrap();
        let mut out = Vec::new();
        three.ack();
        two.ack();
        acks.answered(&mut out).unwrap();
        assert!(out.is_empty(), "nothing before the first is answered");
        one.ack();
        acks.release(2);
        acks.answered(&mut out).unwrap();
        assert_eq!(pkids(&out), [1, 2, 3, 2]);
        assert!(matches!(out[1], Packet::PubRec(..)));
        assert!(matches!(out[3], Packet::PubComp(..)));
        assert!(acks.is_empty());
    }

    #[test]
    fn an_acknowledgement_dropped_unanswered_ends_the_connection_after_those_before_it() {
        let mut acks = Acks::default();
        let one = acks.slot(&publish(1, QoS::AtLeastOnce), 1).unwrap();
        let two = acks.slot(&publish(2, QoS::AtLeastOnce), 2).unwrap();
        one.ack();
        drop(two);
        let mut out = Vec::new();
        assert!(acks.answered(&mut out).is_err());
        assert_eq!(
            pkids(&out),
            [1],
            "what was answered before it still goes out"
        );
    }

    fn dup(mut p: Publish) -> Publish {
        p.dup = true;
        p
    }

    #[test]
    fn a_resend_of_a_publish_left_unacknowledged_keeps_its_number_and_nothing_else_does() {
        let numbers = Numbers::default();
        let client: Arc<str> = Arc::from("press-7");
        let mut acks = Acks::default();
        let one = numbers.of(&client, &publish(1, QoS::AtLeastOnce));
        let two = numbers.of(&client, &publish(2, QoS::ExactlyOnce));
        let three = numbers.of(&client, &publish(3, QoS::AtLeastOnce));
        let first = acks.slot(&publish(1, QoS::AtLeastOnce), one).unwrap();
        let _two = acks.slot(&publish(2, QoS::ExactlyOnce), two).unwrap();
        let _three = acks.slot(&publish(3, QoS::AtLeastOnce), three).unwrap();
        first.ack();
        let mut out = Vec::new();
        acks.answered(&mut out).unwrap();
        // The connection ends with 2 and 3 unacknowledged on the wire.
        numbers.left(&client, acks.unacknowledged());
        assert_eq!(numbers.of(&client, &dup(publish(2, QoS::ExactlyOnce))), two);
        assert_eq!(
            numbers.of(&client, &dup(publish(2, QoS::ExactlyOnce))),
            numbers.next.load(Ordering::Relaxed),
            "once resent, the id is free again: a second resend is new"
        );
        let other: Arc<str> = Arc::from("press-8");
        assert_ne!(
            numbers.of(&other, &dup(publish(3, QoS::AtLeastOnce))),
            three,
            "another client's resend is its own"
        );
        assert_ne!(
            numbers.of(&client, &dup(publish(1, QoS::AtLeastOnce))),
            one,
            "1 was acknowledged: a DUP with its id is a new message"
        );
        // 3 reused without DUP: a new message, and the wait for 3 is over.
        let reused = numbers.of(&client, &publish(3, QoS::AtLeastOnce));
        assert_ne!(reused, three);
        assert_ne!(
            numbers.of(&client, &dup(publish(3, QoS::AtLeastOnce))),
            three
        );
        // A clean start forgets what was left.
        numbers.left(&client, vec![(9, 99)]);
        numbers.forget(&client);
        assert_ne!(numbers.of(&client, &dup(publish(9, QoS::AtLeastOnce))), 99);
        assert_eq!(numbers.clients.load(Ordering::Relaxed), 0);
    }
}
