//! ferry: what a client's MQTT 5 properties may do on a connection, and
//! what the CONNACK tells it, settled in the connection's own task before
//! the router (and isolation) see a packet.
//!
//! - Topic aliases from the client are resolved here, per connection, so
//!   every publish reaches the isolation check with its real topic (the
//!   router resolved them after the check, so an alias could carry a
//!   publish past it). At most [`crate::ConnectionSettings::topic_alias_max`]
//!   aliases, each topic counted; the broker sends no aliases of its own.
//! - User properties named `ferry-...` are the broker's own marks
//!   ([`crate::PUBLISHER_PROPERTY`], [`crate::TOPIC_PROPERTY`],
//!   [`crate::OVERSIZE_PROPERTY`]): a client's are removed as its packets
//!   are decoded ([`strip_reserved`]), so no client can forge them.
//! - A client may not send subscription identifiers on a publish.
//! - A CONNECT with a receive maximum or maximum packet size of 0 is a
//!   protocol error ([`connect_protocol_error`]).

use std::collections::HashMap;

use bytes::Bytes;

use crate::protocol::{
    ConnAckProperties, ConnectProperties, DisconnectReasonCode, Publish, PublishProperties,
};

/// The prefix of the user properties that are the broker's own.
pub const RESERVED_PREFIX: &str = "ferry-";

/// The aliases one client set, bounded by the maximum it was told.
#[derive(Debug, Default)]
pub(crate) struct Aliases {
    max: u16,
    topics: HashMap<u16, Bytes>,
}

impl Aliases {
    pub(crate) fn new(max: u16) -> Aliases {
        Aliases {
            max,
            topics: HashMap::new(),
        }
    }

    /// Gives `publish` its real topic and takes the alias off its
    /// properties; an alias out of range, or an empty topic with an alias
    /// never set, is the client's protocol error (MQTT 5 §3.3.2.3.4).
    pub(crate) fn resolve(
        &mut self,
        publish: &mut Publish,
        properties: &mut Option<PublishProperties>,
    ) -> Result<(), DisconnectReasonCode> {
        let Some(alias) = properties.as_mut().and_then(|p| p.topic_alias.take()) else {
            if publish.topic.is_empty() {
                return Err(DisconnectReasonCode::ProtocolError);
            }
            return Ok(());
        };
        if alias == 0 || alias > self.max {
            return Err(DisconnectReasonCode::TopicAliasInvalid);
        }
        if publish.topic.is_empty() {
            let topic = self
                .topics
                .get(&alias)
                .ok_or(DisconnectReasonCode::ProtocolError)?;
            publish.topic = topic.clone();
        } else {
            // Its own copy: a slice would pin the read buffer.
            self.topics
                .insert(alias, Bytes::copy_from_slice(&publish.topic));
        }
        Ok(())
    }
}

/// Removes the `ferry-...` user properties of a publish, or of a will, as
/// the client sent it (the network reader calls it on every packet it
/// decodes, before it marks an oversized publish itself): a will is
/// published with its properties, so its marks could be forged as well.
pub(crate) fn strip_reserved(packet: &mut crate::protocol::Packet) {
    let properties = match packet {
        crate::protocol::Packet::Publish(_, Some(p)) => &mut p.user_properties,
        crate::protocol::Packet::Connect(_, _, _, Some(will), _) => &mut will.user_properties,
        _ => return,
    };
    properties.retain(|(name, _)| !name.starts_with(RESERVED_PREFIX));
}

/// A publish a client may not send (one with subscription identifiers) is
/// its protocol error.
pub(crate) fn check_client_properties(
    properties: &Option<PublishProperties>,
) -> Result<(), DisconnectReasonCode> {
    match properties {
        Some(p) if !p.subscription_identifiers.is_empty() => {
            Err(DisconnectReasonCode::ProtocolError)
        }
        _ => Ok(()),
    }
}

/// Why the properties of a CONNECT are a protocol error, if they are: a
/// receive maximum or a maximum packet size of 0 (MQTT 5 §3.1.2.11.3,
/// §3.1.2.11.4). The broker refuses such a CONNECT with CONNACK 0x82.
pub(crate) fn connect_protocol_error(
    properties: Option<&ConnectProperties>,
) -> Option<&'static str> {
    let p = properties?;
    if p.receive_maximum == Some(0) {
        return Some("receive maximum 0");
    }
    if p.max_packet_size == Some(0) {
        return Some("maximum packet size 0");
    }
    None
}

/// What the broker's CONNACK tells a client about this connection (MQTT 5;
/// a 3.1.1 CONNACK carries none of it).
#[derive(Debug, Clone, Default)]
pub(crate) struct Granted {
    /// The keep-alive the connection is held to, when it is not the one
    /// the client asked for.
    pub(crate) server_keep_alive: Option<u16>,
    /// The session expiry granted, when it is less than asked.
    pub(crate) session_expiry: Option<u32>,
    /// The largest packet the broker reads (0: no limit said).
    pub(crate) max_packet_size: u32,
    /// The most aliases the client may set.
    pub(crate) topic_alias_max: u16,
    /// Publishes the client may have unacknowledged.
    pub(crate) receive_max: u16,
}

impl Granted {
    pub(crate) fn into_properties(self, mut p: ConnAckProperties) -> ConnAckProperties {
        p.server_keep_alive = self.server_keep_alive;
        if self.session_expiry.is_some() {
            p.session_expiry_interval = self.session_expiry;
        }
        if self.max_packet_size > 0 {
            p.max_packet_size = Some(self.max_packet_size);
        }
        p.topic_alias_max = Some(self.topic_alias_max);
        p.receive_max = Some(self.receive_max);
        // No retained messages, wildcards, shared subscriptions or
        // subscription identifiers for an isolated client: said up front.
        p.retain_available = Some(0);
        p.wildcard_subscription_available = Some(0);
        p.shared_subscription_available = Some(0);
        p.subscription_identifiers_available = Some(0);
        p
    }
}

/// The session expiry a client asked for (MQTT 5's property; a 3.1.1
/// client without a clean session asks for the longest there is), held to
/// `max` seconds: what it gets, and whether that is less than it asked.
pub(crate) fn session_expiry(
    v5: bool,
    clean_session: bool,
    props: Option<&ConnectProperties>,
    max: u32,
) -> (u32, bool) {
    let asked = if v5 {
        props.and_then(|p| p.session_expiry_interval).unwrap_or(0)
    } else if clean_session {
        0
    } else {
        u32::MAX
    };
    (asked.min(max), asked > max && v5)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(topic: &'static str) -> Publish {
        Publish::new(topic, "x", false)
    }

    fn alias(n: u16) -> Option<PublishProperties> {
        Some(PublishProperties {
            topic_alias: Some(n),
            ..Default::default()
        })
    }

    #[test]
    fn an_alias_is_set_by_a_topic_and_used_by_an_empty_one() {
        let mut aliases = Aliases::new(4);
        let (mut p, mut props) = (publish("devices/a/up/t"), alias(2));
        aliases.resolve(&mut p, &mut props).unwrap();
        assert_eq!(props.unwrap().topic_alias, None);
        let (mut p, mut props) = (publish(""), alias(2));
        aliases.resolve(&mut p, &mut props).unwrap();
        assert_eq!(&p.topic[..], b"devices/a/up/t");
    }

    #[test]
    fn an_alias_out_of_range_or_never_set_is_a_protocol_error() {
        let mut aliases = Aliases::new(4);
        for n in [0, 5] {
            let (mut p, mut props) = (publish("devices/a/up/t"), alias(n));
            assert_eq!(
                aliases.resolve(&mut p, &mut props),
                Err(DisconnectReasonCode::TopicAliasInvalid)
            );
        }
        let (mut p, mut props) = (publish(""), alias(3));
        assert_eq!(
            aliases.resolve(&mut p, &mut props),
            Err(DisconnectReasonCode::ProtocolError)
        );
        let (mut p, mut props) = (publish(""), None);
        assert_eq!(
            aliases.resolve(&mut p, &mut props),
            Err(DisconnectReasonCode::ProtocolError)
        );
    }

    #[test]
    fn a_clients_ferry_properties_are_removed_and_its_own_kept() {
        let props = Some(PublishProperties {
            user_properties: vec![
                ("ferry-publisher".into(), "dev-b".into()),
                ("line".into(), "3".into()),
                ("ferry-oversize".into(), "9".into()),
            ],
            ..Default::default()
        });
        let mut packet = crate::protocol::Packet::Publish(publish("devices/a/up/t"), props);
        strip_reserved(&mut packet);
        let crate::protocol::Packet::Publish(_, Some(props)) = packet else {
            unreachable!()
        };
        assert_eq!(
            props.user_properties,
            vec![("line".to_string(), "3".to_string())]
        );
        let will = crate::protocol::LastWillProperties {
            delay_interval: None,
            payload_format_indicator: None,
            message_expiry_interval: None,
            content_type: None,
            response_topic: None,
            correlation_data: None,
            user_properties: vec![
                ("ferry-topic".into(), "devices/b/up/t".into()),
                ("k".into(), "v".into()),
            ],
        };
        let connect = crate::protocol::Connect {
            keep_alive: 60,
            client_id: "a".into(),
            clean_session: true,
        };
        let mut packet = crate::protocol::Packet::Connect(connect, None, None, Some(will), None);
        strip_reserved(&mut packet);
        let crate::protocol::Packet::Connect(_, _, _, Some(will), _) = packet else {
            unreachable!()
        };
        assert_eq!(
            will.user_properties,
            vec![("k".to_string(), "v".to_string())]
        );
        let props = Some(PublishProperties {
            subscription_identifiers: vec![1],
            ..Default::default()
        });
        assert!(check_client_properties(&props).is_err());
    }

    #[test]
    fn a_session_expiry_is_held_to_the_cap() {
        let asked = |secs| ConnectProperties {
            session_expiry_interval: Some(secs),
            receive_maximum: None,
            max_packet_size: None,
            topic_alias_max: None,
            request_response_info: None,
            request_problem_info: None,
            user_properties: vec![],
            authentication_method: None,
            authentication_data: None,
        };
        assert_eq!(
            session_expiry(true, true, Some(&asked(60)), 3600),
            (60, false)
        );
        assert_eq!(
            session_expiry(true, false, Some(&asked(u32::MAX)), 3600),
            (3600, true)
        );
        assert_eq!(session_expiry(true, false, None, 3600), (0, false));
        assert_eq!(session_expiry(false, false, None, 3600), (3600, false));
        assert_eq!(session_expiry(false, true, None, 3600), (0, false));
        assert_eq!(session_expiry(false, false, None, 0), (0, false));
    }
}
