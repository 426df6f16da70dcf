//! The embedded broker's device listeners: `south.listeners`, a list of
//! `{ listen = "ADDR:PORT", transport = "tcp" | "tls" | "ws" | "wss" }`
//! (the WebSocket ones on `path`, default `/mqtt`), or the single
//! `south.listen` (TLS when `[south.tls]` has a certificate). Every
//! listener serves the same broker: the same isolation, authentication
//! and limits. TLS listeners (and `wss`) share `[south.tls]`.

use std::collections::HashSet;
use std::net::SocketAddr;

use super::check::{ConfigError, Problems};
use super::raw::RawSouth;

/// `south.listen`'s default: left as it is when `south.listeners` is set.
const DEFAULT_LISTEN: &str = "127.0.0.1:1883";
/// The most listeners one gateway opens.
const MAX_LISTENERS: usize = 16;
/// Where MQTT over WebSocket is served unless `path` says otherwise (as
/// MQTT.js and most brokers have it).
pub const DEFAULT_WS_PATH: &str = "/mqtt";

/// One device listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub listen: SocketAddr,
    /// TLS with `[south.tls]` ("tls", "wss"); plain TCP otherwise.
    pub tls: bool,
    /// MQTT over WebSocket on this path ("ws", "wss").
    pub ws_path: Option<String>,
}

impl Listener {
    /// Whether a client on the network could connect here as any device
    /// without a password: off loopback, and not TLS with client
    /// certificates (`client_certificates`: `south.tls.client_ca` is set).
    pub fn open_to_network(&self, client_certificates: bool) -> bool {
        !(self.listen.ip().is_loopback() || self.tls && client_certificates)
    }
}

/// As the start line names it: `0.0.0.0:8883 (TLS)`, `127.0.0.1:8080
/// (WebSocket on /mqtt)`.
impl std::fmt::Display for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tls = if self.tls { " TLS" } else { "" };
        match &self.ws_path {
            Some(path) => write!(f, "{} (WebSocket{tls} on {path})", self.listen),
            None if self.tls => write!(f, "{} (TLS)", self.listen),
            None => write!(f, "{}", self.listen),
        }
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
            ws_path: None,
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
        let kind = p.take(transport(&key("transport"), &l.transport, tls_set));
        let ws_path = kind.and_then(|(_, ws)| p.take(ws_path(&key("path"), &l.path, ws)));
        if let Some(listen) = listen {
            if !seen.insert(listen) {
                p.note(ConfigError::new(
                    &key("listen"),
                    format!("{listen} is listed twice"),
                ));
            }
            if let (Some((tls, _)), Some(ws_path)) = (kind, ws_path) {
                out.push(Listener {
                    listen,
                    tls,
                    ws_path,
                });
            }
        }
    }
    let tls_listed = raw
        .listeners
        .iter()
        .any(|l| l.transport == "tls" || l.transport == "wss");
    if tls_set && !tls_listed {
        p.note(ConfigError::new(
            "south.tls.cert",
            "is set, but no listener in south.listeners has transport = \"tls\" or \"wss\"",
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

/// A transport: (TLS, WebSocket).
fn transport(key: &str, value: &str, tls_set: bool) -> Result<(bool, bool), ConfigError> {
    match value {
        "tcp" => Ok((false, false)),
        "ws" => Ok((false, true)),
        "tls" | "wss" if tls_set => Ok((true, value == "wss")),
        "tls" | "wss" => Err(ConfigError::new(
            key,
            format!("{value:?} needs south.tls.cert and south.tls.key"),
        )),
        other => Err(ConfigError::new(
            key,
            format!("{other:?} is not a transport; use \"tcp\", \"tls\", \"ws\" or \"wss\""),
        )),
    }
}

/// A WebSocket listener's path: `path`, or [`DEFAULT_WS_PATH`].
fn ws_path(key: &str, path: &str, ws: bool) -> Result<Option<String>, ConfigError> {
    if !ws {
        return if path.is_empty() {
            Ok(None)
        } else {
            Err(ConfigError::new(
                key,
                "applies to \"ws\" and \"wss\" listeners only",
            ))
        };
    }
    if path.is_empty() {
        return Ok(Some(DEFAULT_WS_PATH.into()));
    }
    let fine = path.starts_with('/')
        && path.len() <= 256
        && path
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#');
    if !fine {
        return Err(ConfigError::new(
            key,
            format!("{path:?} is not a path like \"/mqtt\" (a '/', then at most 255 printable characters, no '?' or '#')"),
        ));
    }
    Ok(Some(path.into()))
}
