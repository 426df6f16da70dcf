//! Who may CONNECT to the embedded broker: the broker's connect hook.
//!
//! - A client id must be a device id (`[A-Za-z0-9._-]{1,64}`, PROTOCOL.md
//!   "Identifiers"): anything else can never be a device, so it is refused
//!   with CONNACK 2 (identifier rejected) before any other check, at no
//!   cost. The broker itself refuses ids over 64 bytes even when the
//!   CONNECT is too large to read (vendor/README.md).
//! - With `south.auth = "password"`, the password must then match
//!   ([`Authenticator::check`]).
//! - Every refusal is counted (`ferry_devices_refused_total`); the log gets the first
//!   few per peer address and window, then one summary line
//!   (`rumqttd::refusals`), and never more of a client id than
//!   `rumqttd::refusals::CLIP` bytes.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use rumqttd::protocol::ConnectReturnCode;
use rumqttd::refusals::{self, Clip};
use rumqttd::{ConnectHook, ConnectInfo};
use tracing::{info, warn};

use super::auth::{Authenticator, Refusal};
use crate::ids::{DeviceId, IdError};
use crate::metrics::{self, Count};

/// Longest client id the broker reads: a device id's.
pub const MAX_CLIENT_ID: usize = 64;

/// Why a CONNECT was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refused {
    NotADeviceId(IdError),
    Auth(Refusal),
}

impl Refused {
    fn code(&self) -> ConnectReturnCode {
        match self {
            Refused::NotADeviceId(_) => ConnectReturnCode::ClientIdentifierNotValid,
            Refused::Auth(r) => r.code(),
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::NotADeviceId(e) => write!(f, "client id is not a device id: {e}"),
            Refused::Auth(r) => r.fmt(f),
        }
    }
}

/// The connect hook: the client id checked, then (with `auth`) the
/// password; each refusal counted and logged within bounds.
pub fn hook(auth: Option<Arc<Authenticator>>) -> ConnectHook {
    Arc::new(move |info: ConnectInfo| {
        let auth = auth.clone();
        Box::pin(async move {
            let result = admit(auth.as_deref(), &info).await;
            if let Err(refusal) = &result {
                metrics::count(Count::DevicesRefused);
                if refusals::admit(info.peer.ip()) {
                    log_refusal(&info.client_id, info.peer, refusal);
                }
            }
            result.map_err(|r| r.code())
        })
    })
}

async fn admit(auth: Option<&Authenticator>, info: &ConnectInfo) -> Result<(), Refused> {
    DeviceId::new(info.client_id.as_str()).map_err(Refused::NotADeviceId)?;
    let Some(auth) = auth else {
        return Ok(());
    };
    auth.check(
        &info.client_id,
        info.username.as_deref(),
        info.password.as_deref(),
    )
    .await
    .map_err(Refused::Auth)
}

fn log_refusal(client_id: &str, peer: SocketAddr, reason: &Refused) {
    let client_id = Clip(client_id);
    match reason {
        // Load, not a credential: in a reconnect storm of thousands of
        // devices this is most connects for a while, and each comes back.
        Refused::Auth(Refusal::Busy) => {
            info!(event = "device_refused_busy", %client_id, %peer, %reason, "device refused for now")
        }
        _ => warn!(event = "device_refused", %client_id, %peer, %reason, "device refused"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(client_id: &str) -> ConnectInfo {
        ConnectInfo {
            client_id: client_id.into(),
            username: None,
            password: None,
            peer: "127.0.0.1:5000".parse().unwrap(),
        }
    }

    #[tokio::test]
    async fn without_passwords_a_device_id_is_admitted_and_anything_else_gets_code_2() {
        assert_eq!(admit(None, &info("press-7")).await, Ok(()));
        for bad in ["", "a/b", "a+", "#", &"x".repeat(65), "dev ice"] {
            let got = admit(None, &info(bad)).await.unwrap_err();
            assert_eq!(
                got.code(),
                ConnectReturnCode::ClientIdentifierNotValid,
                "{bad:?}"
            );
        }
    }

    #[tokio::test]
    async fn the_hook_answers_the_code_of_its_refusal() {
        let hook = hook(None);
        assert_eq!(hook(info("press-7")).await, Ok(()));
        assert_eq!(
            hook(info("no/slash")).await,
            Err(ConnectReturnCode::ClientIdentifierNotValid)
        );
    }
}
