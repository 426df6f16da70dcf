//! A failed north connection in the words an operator acts on: what is
//! wrong and which key to look at. The text goes to the status file and
//! to a WARN line whose `event` names the problem.
//!
//! Always holds: a text is at most [`MAX_TEXT`] bytes, whatever the peer
//! sent.

use crate::mqtt::{Failure, Problem};

/// Longest text, in bytes.
pub const MAX_TEXT: usize = 400;

/// The log event for `problem`, if it deserves a line of its own (the
/// session's `link_down` line says the rest).
pub fn event(problem: &Problem) -> Option<&'static str> {
    match problem {
        Problem::NotMqtt { .. } => Some("north_not_mqtt_broker"),
        Problem::Refused(_) => Some("north_connect_refused"),
        Problem::Closed { .. } => Some("north_closed_by_broker"),
        Problem::SessionTaken => Some("north_session_taken"),
        // The session's `link_down` line says "connection refused".
        Problem::NotListening | Problem::Other => None,
        // The session's `link_stalled` line names the node (for the south
        // link too).
        Problem::Stalled { .. } => None,
    }
}

/// What `f` means, for the session of `client_id` of gateway `gateway`.
pub fn explain(f: &Failure, client_id: &str, gateway: &str) -> String {
    let at = &f.endpoint;
    let text = match &f.problem {
        Problem::NotMqtt { answered } => format!(
            "not an MQTT broker at {at} ({answered}); check north.endpoints, and north.tls if that port wants TLS"
        ),
        Problem::Refused(reason) => {
            let hint = match *reason {
                "bad user name or password" => "; check north.username and north.password",
                "not authorized" => {
                    "; check north.username and north.password, and the broker's ACL for them"
                }
                "client id refused" => "; check north.client_id",
                _ => "",
            };
            format!("{at} refused the connection: {reason} (client id {client_id}){hint}")
        }
        Problem::Closed { after, times } => format!(
            "{at} closed the connection {:.1} s after accepting it ({times} in a row)",
            after.as_secs_f64()
        ),
        Problem::SessionTaken => format!(
            "another client with this id ({client_id}) took the session on {at}; is a second gateway running with gateway.id = {gateway}?"
        ),
        Problem::NotListening => format!(
            "nothing listens at {at} (connection refused); is the broker running, and are north.endpoints right?"
        ),
        Problem::Stalled {
            waited,
            outstanding,
        } => format!(
            "{at} took the session but moved nothing: no PUBACK for any of {outstanding} publishes in {:.1} s (north.puback_timeout_ms); ferry left it and connects again, to the next of north.endpoints if there is one. Is that node overloaded, or cut off from its cluster?",
            waited.as_secs_f64()
        ),
        Problem::Other => format!("the connection to {at} failed: {}", f.error),
    };
    bounded(text)
}

/// `text`, cut to [`MAX_TEXT`] bytes on a character boundary.
fn bounded(mut text: String) -> String {
    if text.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mqtt::Endpoint;

    fn failure(problem: Problem, error: &str) -> Failure {
        Failure {
            endpoint: Endpoint::new("broker.plant", 8080),
            problem,
            error: error.into(),
            failures: 1,
        }
    }

    #[test]
    fn each_problem_says_what_is_wrong_and_where_to_look() {
        let http = failure(
            Problem::NotMqtt {
                answered: "it answered CONNECT with a PubAck packet".into(),
            },
            "",
        );
        assert_eq!(
            explain(&http, "ferry-gw", "gw"),
            "not an MQTT broker at broker.plant:8080 (it answered CONNECT with a PubAck packet); check north.endpoints, and north.tls if that port wants TLS"
        );
        let refused = explain(
            &failure(Problem::Refused("not authorized"), ""),
            "ferry-gw",
            "gw",
        );
        assert!(
            refused.contains("not authorized") && refused.contains("north.username"),
            "{refused}"
        );
        let taken = explain(&failure(Problem::SessionTaken, ""), "ferry-gw", "gw");
        assert_eq!(taken, "another client with this id (ferry-gw) took the session on broker.plant:8080; is a second gateway running with gateway.id = gw?");
        assert_eq!(event(&Problem::SessionTaken), Some("north_session_taken"));
        let stalled = Problem::Stalled {
            waited: std::time::Duration::from_millis(30_004),
            outstanding: 3,
        };
        assert_eq!(
            explain(&failure(stalled, ""), "ferry-gw", "gw"),
            "broker.plant:8080 took the session but moved nothing: no PUBACK for any of 3 publishes in 30.0 s (north.puback_timeout_ms); ferry left it and connects again, to the next of north.endpoints if there is one. Is that node overloaded, or cut off from its cluster?"
        );
        assert_eq!(event(&Problem::Other), None);
    }

    #[test]
    fn a_text_is_bounded_whatever_the_error_holds() {
        let long = failure(Problem::Other, &"é".repeat(10_000));
        let text = explain(&long, "ferry-gw", "gw");
        assert!(text.len() <= MAX_TEXT + '…'.len_utf8(), "{}", text.len());
        assert!(text.ends_with('…'));
    }
}
