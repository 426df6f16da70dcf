//! The connection's lifecycle as the session task sees it: one enum whose
//! variants carry what each state needs, driven by `link = match ...`.

use tokio::time::Instant;

pub(super) enum Link {
    /// Connecting, or waiting to reconnect after `failures` failures.
    Down { failures: u32 },
    /// Connected since `at`, `failures` before it.
    Connected {
        at: Instant,
        failures: u32,
        stage: Stage,
    },
    /// Leaving a working node for the first one (`prefer_first`): the
    /// DISCONNECT is requested, and the drop that follows is no failure.
    Moving,
    /// DISCONNECT requested; the session ends when it is written.
    Closing,
}

/// How far a connection got.
#[derive(Debug, PartialEq)]
pub(super) enum Stage {
    /// Waiting for the SubAck.
    Subscribing { session_present: bool },
    /// Subscribed; the announce is out, alone, so that a drop is never
    /// blamed on it when the owner's traffic follows.
    Announcing {
        session_present: bool,
        refused: Vec<String>,
    },
    /// `Up` was told: the owner publishes.
    Up,
}

/// Whether `endpoint` accepts a TCP connection within `within` (closed at
/// once: a check, not a session).
pub(super) async fn accepts(
    endpoint: crate::config::Endpoint,
    within: std::time::Duration,
) -> bool {
    let address = (endpoint.host.as_str(), endpoint.port);
    matches!(
        tokio::time::timeout(within, tokio::net::TcpStream::connect(address)).await,
        Ok(Ok(_))
    )
}
