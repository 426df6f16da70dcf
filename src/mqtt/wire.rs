//! What the session sees of the protocol, whichever version is underneath:
//! rumqttc's 3.1.1 client (`rumqttc`) and its MQTT 5 client
//! (`rumqttc::v5`, see `v5.rs`) behind one client handle ([`Client`]) and
//! one event type ([`Wire`]), so the session task is written once.
//!
//! What must hold for both:
//! - a refusal the broker states is carried, named: a v5 SUBACK or PUBACK
//!   reason code becomes the `&'static str` of `v5::reason_*`, never the
//!   broker's own text (a v5 reason string is clipped where it is logged);
//! - an acknowledgement is made from the publish as received
//!   ([`Received`]), on the client of the version it came on.

use bytes::Bytes;
use rumqttc::{Event, Outgoing, Packet, QoS, SubscribeFilter, SubscribeReasonCode};

/// One event of the event loop, as the session needs it.
#[derive(Debug)]
pub(super) enum Wire {
    /// Connected. `max_packet`: the largest packet the broker takes, when
    /// it said (a v5 CONNACK's maximum packet size).
    ConnAck {
        session_present: bool,
        max_packet: Option<usize>,
    },
    /// One entry per filter subscribed, in order: `None` granted,
    /// `Some(reason)` refused.
    SubAck(Vec<Option<&'static str>>),
    /// The broker acknowledged `pkid`; `refused` names the reason code of
    /// a v5 PUBACK that refuses the message.
    PubAck {
        pkid: u16,
        refused: Option<&'static str>,
    },
    /// rumqttc wrote a publish with this packet id.
    Written(u16),
    /// rumqttc holds a publish back until this packet id is acknowledged.
    AwaitAck(u16),
    Publish(Box<Incoming>),
    /// Our DISCONNECT was written.
    Disconnect,
    /// Anything else (pings, our own acks): the loop is alive.
    Other,
}

/// One incoming publish.
#[derive(Debug)]
pub(super) struct Incoming {
    pub topic: String,
    pub payload: Bytes,
    pub retain: bool,
    /// QoS 1 or 2: it wants an acknowledgement.
    pub acked: bool,
    pub received: Received,
}

/// A publish as received, for its acknowledgement.
#[derive(Debug)]
pub(super) enum Received {
    V4(rumqttc::Publish),
    V5(rumqttc::v5::mqttbytes::v5::Publish),
}

/// rumqttc's client handle of either version; cheap to clone.
#[derive(Clone)]
pub(super) enum Client {
    V4(rumqttc::AsyncClient),
    V5(rumqttc::v5::AsyncClient),
}

impl Client {
    /// Queues a QoS 1 publish; false if the request queue is full.
    pub fn try_publish(&self, topic: String, retain: bool, payload: Vec<u8>) -> bool {
        match self {
            Client::V4(c) => c
                .try_publish(topic, QoS::AtLeastOnce, retain, payload)
                .is_ok(),
            Client::V5(c) => c
                .try_publish(topic, v5_qos(), retain, Bytes::from(payload))
                .is_ok(),
        }
    }

    /// Queues a QoS 1 publish, waiting for room; false once closed.
    pub async fn publish(&self, topic: String, retain: bool, payload: Vec<u8>) -> bool {
        match self {
            Client::V4(c) => c
                .publish(topic, QoS::AtLeastOnce, retain, payload)
                .await
                .is_ok(),
            Client::V5(c) => c
                .publish(topic, v5_qos(), retain, Bytes::from(payload))
                .await
                .is_ok(),
        }
    }

    /// Subscribes QoS 1 to every filter in one SUBSCRIBE.
    pub fn try_subscribe_many(&self, filters: &[String]) -> Result<(), String> {
        match self {
            Client::V4(c) => c
                .try_subscribe_many(
                    filters
                        .iter()
                        .map(|f| SubscribeFilter::new(f.clone(), QoS::AtLeastOnce)),
                )
                .map_err(|e| e.to_string()),
            Client::V5(c) => c
                .try_subscribe_many(
                    filters
                        .iter()
                        .map(|f| rumqttc::v5::mqttbytes::v5::Filter::new(f.clone(), v5_qos())),
                )
                .map_err(|e| e.to_string()),
        }
    }

    /// Queues the acknowledgement of `received`.
    pub fn try_ack(&self, received: &Received) -> Result<(), AckError> {
        match (self, received) {
            (Client::V4(c), Received::V4(p)) => c.try_ack(p).map_err(AckError::v4),
            (Client::V5(c), Received::V5(p)) => c.try_ack(p).map_err(AckError::v5),
            _ => Err(AckError::Other(
                "a publish of the other protocol version".into(),
            )),
        }
    }

    /// Queues a DISCONNECT; false if it could not be.
    pub fn try_disconnect(&self) -> bool {
        match self {
            Client::V4(c) => c.try_disconnect().is_ok(),
            Client::V5(c) => c.try_disconnect().is_ok(),
        }
    }
}

/// Why an ack was not queued.
#[derive(Debug)]
pub(super) enum AckError {
    /// The request queue took nothing (full; or closed, when the event
    /// loop is gone and the session with it): try again later.
    Full,
    Other(String),
}

impl AckError {
    fn v4(e: rumqttc::ClientError) -> AckError {
        match e {
            rumqttc::ClientError::TryRequest(_) => AckError::Full,
            e => AckError::Other(e.to_string()),
        }
    }

    fn v5(e: rumqttc::v5::ClientError) -> AckError {
        match e {
            rumqttc::v5::ClientError::TryRequest(_) => AckError::Full,
            e => AckError::Other(e.to_string()),
        }
    }
}

fn v5_qos() -> rumqttc::v5::mqttbytes::QoS {
    rumqttc::v5::mqttbytes::QoS::AtLeastOnce
}

/// A 3.1.1 event as the session sees it.
pub(super) fn from_v4(event: Event) -> Wire {
    match event {
        Event::Incoming(Packet::ConnAck(ack)) => Wire::ConnAck {
            session_present: ack.session_present,
            max_packet: None,
        },
        Event::Incoming(Packet::SubAck(suback)) => Wire::SubAck(
            suback
                .return_codes
                .iter()
                .map(|code| matches!(code, SubscribeReasonCode::Failure).then_some("failure"))
                .collect(),
        ),
        Event::Incoming(Packet::PubAck(ack)) => Wire::PubAck {
            pkid: ack.pkid,
            refused: None,
        },
        Event::Incoming(Packet::Publish(p)) => Wire::Publish(Box::new(Incoming {
            topic: p.topic.clone(),
            payload: p.payload.clone(),
            retain: p.retain,
            acked: p.qos != QoS::AtMostOnce,
            received: Received::V4(p),
        })),
        Event::Outgoing(Outgoing::Publish(pkid)) => Wire::Written(pkid),
        Event::Outgoing(Outgoing::AwaitAck(pkid)) => Wire::AwaitAck(pkid),
        Event::Outgoing(Outgoing::Disconnect) => Wire::Disconnect,
        _ => Wire::Other,
    }
}
