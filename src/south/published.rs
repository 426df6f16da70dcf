//! A device's publish as the pipeline sees it ([`SouthMessage`]), from
//! either way it reaches the gateway in embedded mode: straight from its
//! connection ([`from_device`]), its PUBACK waiting for the pipeline's
//! answer, or forwarded by the broker (a will, [`south_message`]).

use rumqttd::{Forward, OVERSIZE_PROPERTY, PUBLISHER_PROPERTY, TOPIC_PROPERTY};
use tracing::warn;

use super::seam::{Ack, AckTo, PublishProps, SouthMessage};
use crate::protocol::now_ms;

/// A publish the broker forwarded (a will) as the pipeline sees it.
pub(super) fn south_message(f: Forward) -> Option<SouthMessage> {
    // The broker acknowledged it when the link took it.
    message(f.publish, f.properties, None, Ack::default())
}

/// A device's publish, straight from its connection, as the pipeline sees
/// it: its PUBACK (PUBREC) waits for the pipeline's answer.
pub(super) fn from_device(mut p: rumqttd::DevicePublish) -> Option<SouthMessage> {
    p.taken();
    let ack = p
        .ack
        .take()
        .map_or_else(Ack::default, |a| Ack(AckTo::Device(a)));
    message(p.publish, p.properties, Some(p.number), ack)
}

fn message(
    publish: rumqttd::protocol::Publish,
    properties: Option<rumqttd::protocol::PublishProperties>,
    number: Option<u64>,
    ack: Ack,
) -> Option<SouthMessage> {
    let Ok(topic) = String::from_utf8(publish.topic.to_vec()) else {
        // The broker only takes UTF-8 topics; this cannot happen.
        warn!(
            event = "device_publish_bad_utf8",
            "dropping a device publish whose topic is not UTF-8"
        );
        return None;
    };
    let property = |name: &str| {
        properties.as_ref().and_then(|p| {
            p.user_properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    };
    let oversize = property(OVERSIZE_PROPERTY).and_then(|v| v.parse().ok());
    // A quarantined publish: who sent it, on which topic.
    let publisher = property(PUBLISHER_PROPERTY);
    let topic = match (&publisher, property(TOPIC_PROPERTY)) {
        (Some(_), Some(own)) => own,
        _ => topic,
    };
    Some(SouthMessage {
        number,
        qos: Some(publish.qos_level()),
        retain: publish.retain,
        publisher,
        topic,
        payload: publish.payload,
        oversize,
        received_ms: now_ms(),
        replayed: false,
        v5: PublishProps::of(properties),
        ack,
    })
}
