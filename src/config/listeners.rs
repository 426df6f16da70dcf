//! The embedded broker's device listeners: `south.listeners`, a list of
//! `{ listen = "ADDR:PORT", transport = "tcp" | "tls" }`, or the single
//! `south.listen` (TLS when `[south.tls]` has a certificate). Every
//! listener serves the same broker: the same isolation, authentication
//! and limits. TLS listeners share `[south.tls]`.

use std::collections::HashSet;
use std::net::SocketAddr;

use super::check::{ConfigError, Problems};
use super::raw::RawSouth;

/// `south.listen`'s default: left as it is when `south.listeners` is set.
const DEFAULT_LISTEN: &str = "127.0.0.1:1883";
/// The most listeners one gateway opens.
const MAX_LISTENERS: usize = 16;

/// One device listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    pub listen: SocketAddr,
    /// TLS with `[south.tls]`; plain TCP otherwise.
    pub tls: bool,
}

impl Listener {
    /// Whether a client on the network could connect here as any device
    /// without a password: off loopback, and not TLS with client
    /// certificates (`client_certificates`: `south.tls.client_ca` is set).
    pub fn open_to_network(&self, client_certificates: bool) -> bool {
        !(self.listen.ip().is_loopback() || self.tls && client_certificates)
    }
}

/// The listeners, each problem noted in `p` under its key; `tls_set`:
/// whether `[south.tls]` has a certificate.
pub(super) fn check(raw: &RawSouth, tls_set: bool, p: &mut Problems) -> Option<Vec<Listener>> {
    if raw.listeners.is_empty() {
        let listen = p.take(address("south.listen", &raw.listen))?;
        return Some(vec![Listener {
            listen,
            tls: tls_set,
        }]);
    }
    let before = p.len();
    if raw.listen != DEFAULT_LISTEN {
        p.note(ConfigError::new(
            "south.listen",
            "is replaced by south.listeners: set one or the other (list this address \
             in south.listeners)",
        ));
    }
    if raw.listeners.len() > MAX_LISTENERS {
        p.note(ConfigError::new(
            "south.listeners",
            format!("at most {MAX_LISTENERS} listeners"),
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, l) in raw.listeners.iter().enumerate() {
        let key = |field: &str| format!("south.listeners[{i}].{field}");
        let listen = p.take(address(&key("listen"), &l.listen));
        let tls = p.take(transport(&key("transport"), &l.transport, tls_set));
        if let Some(listen) = listen {
            if !seen.insert(listen) {
                p.note(ConfigError::new(
                    &key("listen"),
                    format!("{listen} is listed twice"),
                ));
            }
            if let Some(tls) = tls {
                out.push(Listener { listen, tls });
            }
        }
    }
    if tls_set && !raw.listeners.iter().any(|l| l.transport == "tls") {
        p.note(ConfigError::new(
            "south.tls.cert",
            "is set, but no listener in south.listeners has transport = \"tls\"",
        ));
    }
    (p.len() == before).then_some(out)
}

fn address(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse().map_err(|e| {
        ConfigError::new(
            key,
            format!("{e}; expected host:port, e.g. \"0.0.0.0:1883\""),
        )
    })
}

fn transport(key: &str, value: &str, tls_set: bool) -> Result<bool, ConfigError> {
    match value {
        "tcp" => Ok(false),
        "tls" if tls_set => Ok(true),
        "tls" => Err(ConfigError::new(
            key,
            "\"tls\" needs south.tls.cert and south.tls.key",
        )),
        "ws" | "wss" => Err(ConfigError::new(
            key,
            format!("{value:?} (MQTT over WebSocket) is not supported yet; use \"tcp\" or \"tls\""),
        )),
        other => Err(ConfigError::new(
            key,
            format!("{other:?} is not a transport; use \"tcp\" or \"tls\""),
        )),
    }
}
