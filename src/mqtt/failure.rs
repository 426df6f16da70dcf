//! Why a connection failed, in terms an owner can tell an operator: each
//! failure is reported as [`super::Event::Failed`] with a [`Problem`].
//!
//! Two steps, both free of I/O:
//! - the poller's error, of either protocol version, is sorted into a
//!   [`Cause`] by what rumqttc returned ([`v4`], and `v5::error`);
//! - the session adds how far the connection got ([`diagnose`]): garbage
//!   or a close before any CONNACK means the peer is no MQTT broker, a
//!   CONNACK refusal is named, and a broker that closes connection after
//!   connection soon after accepting them (3.1.1 says no more) is taken
//!   for another client with the same client id taking the session over
//!   (MQTT 5 says so with a DISCONNECT reason code).
//!
//! One failure is the session's own verdict, not rumqttc's: a node that
//! took the session and acknowledged none of its publishes for the bound
//! (`stall.rs`) is cut by the poller ([`stalled`]) and reported as
//! [`Problem::Stalled`].
//!
//! Always holds: no text here carries more than [`crate::clip::MAX`] bytes
//! of what the peer sent.

use std::io::ErrorKind;
use std::time::Duration;

use rumqttc::{ConnectReturnCode, ConnectionError, StateError};

use super::stall::Stalled;
use crate::config::Endpoint;

/// Closes soon after a CONNACK, in a row, that are taken for a second
/// client with the same client id (each takes the session from the other).
pub const TAKEN_AFTER: u32 = 3;

/// One failed connection, as [`super::Event::Failed`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// The node tried.
    pub endpoint: Endpoint,
    pub problem: Problem,
    /// rumqttc's error as one log-safe line.
    pub error: String,
    /// The link's failures in a row, this one included (a drop explained
    /// by one message is not counted).
    pub failures: u32,
}

/// What a failure says about the peer.
#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    /// It answered CONNECT with something that is not MQTT (`answered`
    /// says what), or closed the connection without a CONNACK.
    NotMqtt { answered: String },
    /// Its CONNACK refused the connection, for this reason (in words).
    Refused(&'static str),
    /// It closed the connection soon (`after`) after accepting it, the
    /// `times`th in a row.
    Closed { after: Duration, times: u32 },
    /// Another client with the same client id took the session over:
    /// the broker said so (MQTT 5), or closed [`TAKEN_AFTER`] connections
    /// in a row soon after accepting them.
    SessionTaken,
    /// Nothing listens there (the TCP connect was refused): the broker
    /// may be starting, or the address is wrong.
    NotListening,
    /// It took the session but acknowledged none of the `outstanding`
    /// publishes for `waited` (the session's bound): overloaded, or cut
    /// off from its cluster. The session left it.
    Stalled {
        waited: Duration,
        outstanding: usize,
    },
    /// Anything else: the TLS handshake failed, a timeout, a drop
    /// explained by one message.
    Other,
}

impl Problem {
    /// The problem's name, for a log event's field.
    pub fn as_str(&self) -> &'static str {
        match self {
            Problem::NotMqtt { .. } => "not_mqtt",
            Problem::Refused(_) => "refused",
            Problem::Closed { .. } => "closed",
            Problem::SessionTaken => "session_taken",
            Problem::NotListening => "not_listening",
            Problem::Stalled { .. } => "stalled",
            Problem::Other => "other",
        }
    }
}

/// Why a connection failed: one log-safe line, and what it says.
#[derive(Debug)]
pub(super) struct LinkError {
    pub text: String,
    pub cause: Cause,
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// What the poller's error alone says.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Cause {
    /// A CONNACK refused, for this reason.
    Refused(&'static str),
    /// Bytes that are not MQTT, described.
    Garbage(String),
    /// The peer closed or reset the connection.
    Closed,
    /// The broker said another client took the session (MQTT 5).
    TakenOver,
    /// The TCP connect was refused: nothing listens at the address.
    NotListening,
    /// The session cut a link that moved nothing (`stall.rs`).
    Stalled(Stalled),
    Other,
}

/// What `failed` says, given how long the connection had been accepted
/// (`None`: no CONNACK came) and whether one message explains the drop.
/// `streak` counts the closes after a CONNACK in a row: a close within
/// `soon` adds one, an older connection's close starts it again (and is
/// `Other`), anything else ends it.
pub(super) fn diagnose(
    cause: &Cause,
    accepted_for: Option<Duration>,
    explained: bool,
    soon: Duration,
    streak: &mut u32,
) -> Problem {
    let problem = match (cause, accepted_for) {
        _ if explained => Problem::Other,
        (Cause::Refused(reason), _) => Problem::Refused(reason),
        (Cause::NotListening, _) => Problem::NotListening,
        (Cause::Stalled(s), _) => Problem::Stalled {
            waited: s.waited,
            outstanding: s.outstanding,
        },
        (Cause::TakenOver, Some(_)) => Problem::SessionTaken,
        (Cause::Garbage(what), None) => Problem::NotMqtt {
            answered: what.clone(),
        },
        (Cause::Closed, None) => Problem::NotMqtt {
            answered: "it closed the connection without a CONNACK".into(),
        },
        // A long-lived connection's close is news of its own (a broker
        // restart, a session taken), and may start a streak.
        (Cause::Closed, Some(after)) if after >= soon => {
            *streak = 1;
            return Problem::Other;
        }
        (Cause::Closed, Some(after)) => {
            *streak += 1;
            return if *streak >= TAKEN_AFTER {
                Problem::SessionTaken
            } else {
                Problem::Closed {
                    after,
                    times: *streak,
                }
            };
        }
        _ => Problem::Other,
    };
    *streak = 0;
    problem
}

fn closed(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
    )
}

/// A 3.1.1 connection error, sorted, as one log-safe line.
pub(super) fn v4(e: &ConnectionError) -> LinkError {
    use rumqttc::mqttbytes::Error as Bytes;
    let cause = match e {
        ConnectionError::ConnectionRefused(code) => Cause::Refused(refusal_v4(code)),
        ConnectionError::NotConnAck(packet) => Cause::Garbage(format!(
            "it answered CONNECT with {}",
            packet_name(&format!("{packet:?}"))
        )),
        ConnectionError::MqttState(StateError::ConnectionAborted) => Cause::Closed,
        ConnectionError::Io(io) if io.kind() == ErrorKind::ConnectionRefused => Cause::NotListening,
        ConnectionError::MqttState(StateError::Io(io)) | ConnectionError::Io(io)
            if closed(io.kind()) =>
        {
            Cause::Closed
        }
        ConnectionError::MqttState(StateError::Deserialization(Bytes::Io(io)))
            if closed(io.kind()) =>
        {
            Cause::Closed
        }
        ConnectionError::MqttState(StateError::Deserialization(
            Bytes::PayloadSizeLimitExceeded(_) | Bytes::OutgoingPacketTooLarge { .. },
        )) => Cause::Other,
        ConnectionError::MqttState(StateError::Deserialization(what)) => Cause::Garbage(format!(
            "it sent bytes that are not MQTT ({})",
            crate::clip::display(what)
        )),
        _ => Cause::Other,
    };
    let text = match e {
        // rumqttc's text would print the whole packet.
        ConnectionError::NotConnAck(packet) => format!(
            "expected a CONNACK, received {}",
            packet_name(&format!("{packet:?}"))
        ),
        // rumqttc's own texts, bounded but for an I/O error's.
        other => other.to_string(),
    };
    LinkError { text, cause }
}

/// The error of a link the session cut because it moved nothing.
pub(super) fn stalled(s: Stalled) -> LinkError {
    LinkError {
        text: format!(
            "no PUBACK for any of {} publishes in {} ms: the broker takes the session but moves nothing",
            s.outstanding,
            s.waited.as_millis()
        ),
        cause: Cause::Stalled(s),
    }
}

/// A connection made on settings since replaced, to a node they no
/// longer list: left at once (`session/reach.rs`).
pub(super) fn unlisted(node: &crate::config::Endpoint) -> LinkError {
    LinkError {
        text: format!("{node} is no longer among the endpoints (systemctl reload): leaving it"),
        cause: Cause::Other,
    }
}

/// `PubAck(PubAck { pkid: 21536 })` → `a PubAck packet`.
pub(super) fn packet_name(debug: &str) -> String {
    let name: String = debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .take(32)
        .collect();
    format!("a {name} packet")
}

/// A 3.1.1 CONNACK refusal in words.
fn refusal_v4(code: &ConnectReturnCode) -> &'static str {
    match code {
        ConnectReturnCode::Success => "success",
        ConnectReturnCode::RefusedProtocolVersion => "protocol version refused",
        ConnectReturnCode::BadClientId => "client id refused",
        ConnectReturnCode::ServiceUnavailable => "server unavailable",
        ConnectReturnCode::BadUserNamePassword => "bad user name or password",
        ConnectReturnCode::NotAuthorized => "not authorized",
    }
}

/// An MQTT 5 CONNACK refusal in words (its reason code's name for the
/// rarer ones).
pub(super) fn refusal_v5(name: &'static str) -> &'static str {
    match name {
        "bad_user_name_or_password" => "bad user name or password",
        "not_authorized" => "not authorized",
        "client_identifier_not_valid" => "client id refused",
        "unsupported_protocol_version" => "protocol version refused",
        "server_unavailable" => "server unavailable",
        "server_busy" => "server busy",
        "banned" => "banned",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOON: Duration = Duration::from_secs(30);

    fn io(kind: ErrorKind) -> std::io::Error {
        std::io::Error::new(kind, "x")
    }

    #[test]
    fn a_3_1_1_error_is_sorted_by_what_rumqttc_returned() {
        let refused = v4(&ConnectionError::ConnectionRefused(
            ConnectReturnCode::NotAuthorized,
        ));
        assert_eq!(refused.cause, Cause::Refused("not authorized"));
        let http = v4(&ConnectionError::NotConnAck(rumqttc::Packet::PubAck(
            rumqttc::PubAck::new(21536),
        )));
        assert_eq!(
            http.cause,
            Cause::Garbage("it answered CONNECT with a PubAck packet".into())
        );
        assert_eq!(http.text, "expected a CONNACK, received a PubAck packet");
        let eof = ConnectionError::MqttState(StateError::Deserialization(
            rumqttc::mqttbytes::Error::Io(io(ErrorKind::UnexpectedEof)),
        ));
        assert_eq!(v4(&eof).cause, Cause::Closed);
        let partial = ConnectionError::MqttState(StateError::Deserialization(
            rumqttc::mqttbytes::Error::Io(io(ErrorKind::Other)),
        ));
        assert!(matches!(v4(&partial).cause, Cause::Garbage(_)));
        let junk = ConnectionError::MqttState(StateError::Deserialization(
            rumqttc::mqttbytes::Error::MalformedPacket,
        ));
        assert!(matches!(v4(&junk).cause, Cause::Garbage(_)));
        assert_eq!(
            v4(&ConnectionError::MqttState(StateError::ConnectionAborted)).cause,
            Cause::Closed
        );
        let refused_tcp = ConnectionError::Io(io(ErrorKind::ConnectionRefused));
        assert_eq!(v4(&refused_tcp).cause, Cause::NotListening);
        let mut streak = 0;
        assert_eq!(
            diagnose(
                &Cause::NotListening,
                None,
                false,
                Duration::from_secs(30),
                &mut streak
            ),
            Problem::NotListening
        );
    }

    #[test]
    fn garbage_or_a_close_before_a_connack_is_no_mqtt_broker() {
        let mut streak = 0;
        let garbage = Cause::Garbage("it answered CONNECT with a PubAck packet".into());
        assert_eq!(
            diagnose(&garbage, None, false, SOON, &mut streak),
            Problem::NotMqtt {
                answered: "it answered CONNECT with a PubAck packet".into()
            }
        );
        assert!(matches!(
            diagnose(&Cause::Closed, None, false, SOON, &mut streak),
            Problem::NotMqtt { .. }
        ));
        // After a CONNACK, a malformed packet is a broker's fault, not a
        // sign it is none.
        assert_eq!(
            diagnose(&garbage, Some(SOON), false, SOON, &mut streak),
            Problem::Other
        );
    }

    #[test]
    fn closes_soon_after_accepting_in_a_row_are_a_session_taken_over() {
        let mut streak = 0;
        let close = |after: u64, streak: &mut u32| {
            diagnose(
                &Cause::Closed,
                Some(Duration::from_secs(after)),
                false,
                SOON,
                streak,
            )
        };
        // A long-lived connection's close starts the count.
        assert_eq!(close(600, &mut streak), Problem::Other);
        assert!(matches!(
            close(1, &mut streak),
            Problem::Closed { times: 2, .. }
        ));
        assert_eq!(close(2, &mut streak), Problem::SessionTaken);
        assert_eq!(close(1, &mut streak), Problem::SessionTaken);
        // A failed connect in between ends the streak (a broker restart).
        let refused = Cause::Other;
        assert_eq!(
            diagnose(&refused, None, false, SOON, &mut streak),
            Problem::Other
        );
        assert!(matches!(
            close(1, &mut streak),
            Problem::Closed { times: 1, .. }
        ));
        // A drop explained by one message is not counted.
        assert_eq!(
            diagnose(
                &Cause::Closed,
                Some(Duration::ZERO),
                true,
                SOON,
                &mut streak
            ),
            Problem::Other
        );
        assert_eq!(streak, 0);
        // MQTT 5 says so at once.
        assert_eq!(
            diagnose(&Cause::TakenOver, Some(SOON), false, SOON, &mut streak),
            Problem::SessionTaken
        );
    }

    #[test]
    fn a_packet_is_named_by_its_type_only() {
        assert_eq!(
            packet_name("Publish(Publish { topic: \"secret\" })"),
            "a Publish packet"
        );
        assert_eq!(packet_name(&"A".repeat(100)).len(), "a  packet".len() + 32);
    }
}
