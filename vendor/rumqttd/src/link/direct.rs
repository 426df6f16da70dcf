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

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

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
        };
        (sink, rx)
    }

    /// Hands `publish` on, waiting for room; false once the gateway is gone.
    pub(crate) async fn send(
        &self,
        client_id: &Arc<str>,
        publish: Publish,
        properties: Option<PublishProperties>,
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
    /// The packet each slot answers with, in slot order.
    packets: VecDeque<Packet>,
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
    pub(crate) fn slot(&mut self, publish: &Publish) -> Option<Acker> {
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
        Some(self.push(packet, Outcome::Waiting))
    }

    /// A PUBREL's PUBCOMP, answered in turn: the publish it releases was
    /// handed on when it came (ferry keeps one copy of a message, by its
    /// id, however often it comes).
    pub(crate) fn release(&mut self, pkid: u16) {
        let comp = PubComp {
            pkid,
            reason: PubCompReason::Success,
        };
        let acker = self.push(Packet::PubComp(comp, None), Outcome::Acked);
        drop(acker);
    }

    fn push(&mut self, packet: Packet, outcome: Outcome) -> Acker {
        let mut slots = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.first + slots.outcomes.len() as u64;
        slots.outcomes.push_back(outcome);
        let head = slots.outcomes.len() == 1 && outcome != Outcome::Waiting;
        drop(slots);
        self.packets.push_back(packet);
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
                    out.extend(self.packets.pop_front());
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
        let one = acks.slot(&publish(1, QoS::AtLeastOnce)).unwrap();
        let two = acks.slot(&publish(2, QoS::ExactlyOnce)).unwrap();
        assert!(acks.slot(&publish(0, QoS::AtMostOnce)).is_none());
        let three = acks.slot(&publish(3, QoS::AtLeastOnce)).unwrap();
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
        let one = acks.slot(&publish(1, QoS::AtLeastOnce)).unwrap();
        let two = acks.slot(&publish(2, QoS::AtLeastOnce)).unwrap();
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
}
