//! MQTT 5 underneath a session ([`super::MqttVersion::V5`]): rumqttc's
//! `v5` client built from the session's [`super::Options`], and its events
//! and errors normalised into [`Wire`] (probed against Mosquitto 2.0.11;
//! ../shared/notes/RUMQTT.md).
//!
//! How 3.1.1's behaviour is kept:
//! - clean session off is a clean start off with a session that never
//!   expires (v5's default expiry, 0, would end it with the connection);
//! - the largest packet read is sent as the CONNECT's maximum packet size
//!   (the broker then never sends more);
//! - a keep-alive under 5 s is raised to 5 s (rumqttc's v5 floor);
//! - a CONNACK refusal, a SUBACK or PUBACK failure and a broker's
//!   DISCONNECT carry their reason code, named by the pure `reason_*`
//!   functions below; a reason string the broker adds is clipped.
//!
//! Unlike 3.1.1, rumqttc refuses on its own, by failing the connection, to
//! write a publish larger than the maximum packet size the broker's
//! CONNACK announced; the session checks that size before it hands a
//! publish over ([`Wire::ConnAck`]'s `max_packet`).

use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{
    ConnectReturnCode, LastWill, Packet, PubAckReason, SubscribeReasonCode,
};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{ConnectionError, Event, MqttOptions, StateError};
use rumqttc::Outgoing;

use super::failure::{self, Cause, LinkError};
use super::options::{Options, Transport};
use super::wire::{Incoming, Received, Wire};
use crate::config::Endpoint;

/// rumqttc's v5 options for `opts` on `endpoint`.
pub(super) fn options(opts: &Options, endpoint: &Endpoint, requests: usize) -> MqttOptions {
    let mut mqtt = MqttOptions::new(opts.client_id.clone(), endpoint.host.clone(), endpoint.port);
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    mqtt.set_keep_alive(opts.keep_alive.max(Duration::from_secs(5)))
        .set_clean_start(opts.clean_session)
        .set_manual_acks(!opts.auto_ack)
        .set_outgoing_inflight_upper_limit(opts.inflight.max(1))
        .set_max_packet_size(Some(
            u32::try_from(opts.max_incoming_packet).unwrap_or(u32::MAX),
        ))
        .set_request_channel_capacity(requests)
        .set_network_options(net);
    if !opts.clean_session {
        mqtt.set_session_expiry_interval(Some(u32::MAX));
    }
    if let Some(will) = &opts.last_will {
        mqtt.set_last_will(LastWill::new(
            will.topic.clone(),
            will.payload.to_vec(),
            QoS::AtLeastOnce,
            will.retain,
            None,
        ));
    }
    if let Some((user, pass)) = &opts.credentials {
        mqtt.set_credentials(user.clone(), pass.clone());
    }
    if let Transport::Tls(config) = &opts.transport {
        mqtt.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(config.clone()),
        ));
    }
    mqtt
}

/// A v5 event as the session sees it.
pub(super) fn from_v5(event: Event) -> Wire {
    match event {
        Event::Incoming(Packet::ConnAck(ack)) => Wire::ConnAck {
            session_present: ack.session_present,
            max_packet: ack
                .properties
                .and_then(|p| p.max_packet_size)
                .map(|m| m as usize),
        },
        Event::Incoming(Packet::SubAck(suback)) => {
            Wire::SubAck(suback.return_codes.iter().map(reason_suback).collect())
        }
        Event::Incoming(Packet::PubAck(ack)) => Wire::PubAck {
            pkid: ack.pkid,
            refused: reason_puback(&ack.reason),
        },
        Event::Incoming(Packet::Publish(p)) => Wire::Publish(Box::new(Incoming {
            topic: String::from_utf8_lossy(&p.topic).into_owned(),
            payload: p.payload.clone(),
            retain: p.retain,
            acked: p.qos != QoS::AtMostOnce,
            received: Received::V5(p),
        })),
        Event::Outgoing(Outgoing::Publish(pkid)) => Wire::Written(pkid),
        Event::Outgoing(Outgoing::AwaitAck(pkid)) => Wire::AwaitAck(pkid),
        Event::Outgoing(Outgoing::Disconnect) => Wire::Disconnect,
        _ => Wire::Other,
    }
}

/// A v5 connection error as one log-safe line that names any reason code,
/// sorted as [`failure::v4`] sorts a 3.1.1 one.
pub(super) fn error(e: &ConnectionError) -> LinkError {
    use rumqttc::v5::mqttbytes::v5::DisconnectReasonCode;
    use rumqttc::v5::mqttbytes::Error as Bytes;
    let closed = |io: &std::io::Error| {
        matches!(
            io.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
        )
    };
    let (text, cause) = match e {
        ConnectionError::ConnectionRefused(code)
        | ConnectionError::MqttState(StateError::ConnFail { reason: code }) => (
            format!("connection refused (CONNACK {})", reason_connack(code)),
            Cause::Refused(failure::refusal_v5(reason_connack(code))),
        ),
        ConnectionError::MqttState(StateError::ServerDisconnect {
            reason_code,
            reason_string,
        }) => (
            format!(
                "the broker disconnected (DISCONNECT {reason_code:?}{})",
                reason_string
                    .as_deref()
                    .map(|r| format!(": {}", crate::clip::Clip(r)))
                    .unwrap_or_default()
            ),
            if *reason_code == DisconnectReasonCode::SessionTakenOver {
                Cause::TakenOver
            } else {
                Cause::Closed
            },
        ),
        // rumqttc's text would print the whole packet.
        ConnectionError::NotConnAck(packet) => {
            let name = failure::packet_name(&format!("{packet:?}"));
            (
                format!("expected a CONNACK, received {name}"),
                Cause::Garbage(format!("it answered CONNECT with {name}")),
            )
        }
        ConnectionError::MqttState(StateError::ConnectionAborted) => {
            (crate::clip::display(e), Cause::Closed)
        }
        ConnectionError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            (crate::clip::display(e), Cause::NotListening)
        }
        ConnectionError::MqttState(StateError::Io(io)) | ConnectionError::Io(io) if closed(io) => {
            (crate::clip::display(e), Cause::Closed)
        }
        ConnectionError::MqttState(StateError::Deserialization(Bytes::Io(io))) if closed(io) => {
            (crate::clip::display(e), Cause::Closed)
        }
        ConnectionError::MqttState(StateError::Deserialization(what)) => (
            crate::clip::display(e),
            Cause::Garbage(format!(
                "it sent bytes that are not MQTT ({})",
                crate::clip::display(what)
            )),
        ),
        other => (crate::clip::display(other), Cause::Other),
    };
    LinkError { text, cause }
}

/// The name of a CONNACK reason code (MQTT 5, 3.2.2.2).
pub(super) fn reason_connack(code: &ConnectReturnCode) -> &'static str {
    use ConnectReturnCode as C;
    match code {
        C::Success => "success",
        C::RefusedProtocolVersion => "refused_protocol_version",
        C::BadClientId => "bad_client_id",
        C::ServiceUnavailable => "service_unavailable",
        C::UnspecifiedError => "unspecified_error",
        C::MalformedPacket => "malformed_packet",
        C::ProtocolError => "protocol_error",
        C::ImplementationSpecificError => "implementation_specific_error",
        C::UnsupportedProtocolVersion => "unsupported_protocol_version",
        C::ClientIdentifierNotValid => "client_identifier_not_valid",
        C::BadUserNamePassword => "bad_user_name_or_password",
        C::NotAuthorized => "not_authorized",
        C::ServerUnavailable => "server_unavailable",
        C::ServerBusy => "server_busy",
        C::Banned => "banned",
        C::BadAuthenticationMethod => "bad_authentication_method",
        C::TopicNameInvalid => "topic_name_invalid",
        C::PacketTooLarge => "packet_too_large",
        C::QuotaExceeded => "quota_exceeded",
        C::PayloadFormatInvalid => "payload_format_invalid",
        C::RetainNotSupported => "retain_not_supported",
        C::QoSNotSupported => "qos_not_supported",
        C::UseAnotherServer => "use_another_server",
        C::ServerMoved => "server_moved",
        C::ConnectionRateExceeded => "connection_rate_exceeded",
    }
}

/// Why a SUBACK refused a filter; `None` when it granted it.
pub(super) fn reason_suback(code: &SubscribeReasonCode) -> Option<&'static str> {
    use SubscribeReasonCode as S;
    Some(match code {
        S::Success(_) => return None,
        S::Failure | S::Unspecified => "unspecified_error",
        S::ImplementationSpecific => "implementation_specific_error",
        S::NotAuthorized => "not_authorized",
        S::TopicFilterInvalid => "topic_filter_invalid",
        S::PkidInUse => "packet_identifier_in_use",
        S::QuotaExceeded => "quota_exceeded",
        S::SharedSubscriptionsNotSupported => "shared_subscriptions_not_supported",
        S::SubscriptionIdNotSupported => "subscription_identifiers_not_supported",
        S::WildcardSubscriptionsNotSupported => "wildcard_subscriptions_not_supported",
    })
}

/// Why a PUBACK refused a message; `None` when the broker took it ("no
/// matching subscribers" is taken: nobody was listening, nothing was
/// wrong with the message).
pub(super) fn reason_puback(code: &PubAckReason) -> Option<&'static str> {
    use PubAckReason as P;
    Some(match code {
        P::Success | P::NoMatchingSubscribers => return None,
        P::UnspecifiedError => "unspecified_error",
        P::ImplementationSpecificError => "implementation_specific_error",
        P::NotAuthorized => "not_authorized",
        P::TopicNameInvalid => "topic_name_invalid",
        P::PacketIdentifierInUse => "packet_identifier_in_use",
        P::QuotaExceeded => "quota_exceeded",
        P::PayloadFormatInvalid => "payload_format_invalid",
    })
}

/// The size of a QoS 1 publish without properties on the wire, for the
/// check against the broker's maximum packet size.
pub(super) fn publish_size(topic: &str, payload: usize) -> usize {
    // Topic (length-prefixed), packet id, the properties' length (empty).
    let remaining = 2 + topic.len() + 2 + 1 + payload;
    let length_bytes = match remaining {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    };
    1 + length_bytes + remaining
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use rumqttc::v5::mqttbytes::v5::{ConnAck, ConnAckProperties, PubAck, SubAck};

    #[test]
    fn a_puback_that_refuses_names_its_reason_and_one_that_takes_names_none() {
        assert_eq!(reason_puback(&PubAckReason::Success), None);
        assert_eq!(reason_puback(&PubAckReason::NoMatchingSubscribers), None);
        assert_eq!(
            reason_puback(&PubAckReason::NotAuthorized),
            Some("not_authorized")
        );
        assert_eq!(
            reason_puback(&PubAckReason::QuotaExceeded),
            Some("quota_exceeded")
        );
        let refused = from_v5(Event::Incoming(Packet::PubAck(PubAck {
            pkid: 7,
            reason: PubAckReason::TopicNameInvalid,
            properties: None,
        })));
        assert!(matches!(
            refused,
            Wire::PubAck {
                pkid: 7,
                refused: Some("topic_name_invalid")
            }
        ));
    }

    #[test]
    fn a_suback_refuses_exactly_the_filters_whose_code_is_a_failure() {
        let suback = from_v5(Event::Incoming(Packet::SubAck(SubAck {
            pkid: 1,
            return_codes: vec![
                SubscribeReasonCode::Success(QoS::AtLeastOnce),
                SubscribeReasonCode::NotAuthorized,
                SubscribeReasonCode::Success(QoS::AtMostOnce),
                SubscribeReasonCode::SharedSubscriptionsNotSupported,
            ],
            properties: None,
        })));
        let Wire::SubAck(codes) = suback else {
            panic!("a SubAck: {suback:?}");
        };
        assert_eq!(
            codes,
            vec![
                None,
                Some("not_authorized"),
                None,
                Some("shared_subscriptions_not_supported")
            ]
        );
    }

    #[test]
    fn a_refused_connack_names_its_reason_code() {
        let e = error(&ConnectionError::ConnectionRefused(
            ConnectReturnCode::BadUserNamePassword,
        ));
        assert_eq!(
            e.to_string(),
            "connection refused (CONNACK bad_user_name_or_password)"
        );
        assert_eq!(e.cause, Cause::Refused("bad user name or password"));
    }

    #[test]
    fn a_session_taken_over_is_told_apart_from_other_disconnects() {
        use rumqttc::v5::mqttbytes::v5::DisconnectReasonCode as Code;
        let by = |reason_code| {
            error(&ConnectionError::MqttState(StateError::ServerDisconnect {
                reason_code,
                reason_string: None,
            }))
            .cause
        };
        assert_eq!(by(Code::SessionTakenOver), Cause::TakenOver);
        assert_eq!(by(Code::ServerShuttingDown), Cause::Closed);
    }

    #[test]
    fn a_brokers_disconnect_reason_string_is_clipped() {
        let e = error(&ConnectionError::MqttState(StateError::ServerDisconnect {
            reason_code: rumqttc::v5::mqttbytes::v5::DisconnectReasonCode::NotAuthorized,
            reason_string: Some(format!("line\n{}", "x".repeat(10_000))),
        }));
        let text = e.to_string();
        assert!(text.starts_with("the broker disconnected (DISCONNECT NotAuthorized: line\\n"));
        assert!(text.len() < 300, "{} bytes", text.len());
    }

    #[test]
    fn the_connack_carries_the_brokers_maximum_packet_size() {
        let props = ConnAckProperties {
            session_expiry_interval: None,
            receive_max: Some(20),
            max_qos: None,
            retain_available: None,
            max_packet_size: Some(2000),
            assigned_client_identifier: None,
            topic_alias_max: Some(10),
            reason_string: None,
            user_properties: Vec::new(),
            wildcard_subscription_available: None,
            subscription_identifiers_available: None,
            shared_subscription_available: None,
            server_keep_alive: None,
            response_information: None,
            server_reference: None,
            authentication_method: None,
            authentication_data: None,
        };
        let ack = from_v5(Event::Incoming(Packet::ConnAck(ConnAck {
            session_present: true,
            code: ConnectReturnCode::Success,
            properties: Some(props),
        })));
        assert!(matches!(
            ack,
            Wire::ConnAck {
                session_present: true,
                max_packet: Some(2000)
            }
        ));
    }

    #[test]
    fn the_size_of_a_publish_is_what_rumqttc_writes() {
        for len in [0, 100, 126, 3000, 20_000] {
            let payload = Bytes::from(vec![1u8; len]);
            let mut p = rumqttc::v5::mqttbytes::v5::Publish::new(
                "devices/d/ack",
                QoS::AtLeastOnce,
                payload.clone(),
                None,
            );
            p.pkid = 1;
            let mut buf = bytes::BytesMut::new();
            let written = Packet::Publish(p).write(&mut buf, None).unwrap();
            assert_eq!(publish_size("devices/d/ack", len), written, "{len}");
        }
    }
}
