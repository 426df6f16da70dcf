//! The names the admin server answers to, checked on every request.
//!
//! Without this, a web page open in a browser on the box could read the
//! admin API, dead letters' payloads included, through DNS rebinding: the
//! page's own name, resolved first to its server and then to 127.0.0.1,
//! makes the browser send the page's requests here as same-origin ones.
//! The browser still writes the page's name in `Host`, so the name each
//! request is for (its `Host`, or the authority of an absolute-form
//! target, which RFC 9112 §3.2.2 puts first) must be one of:
//!
//! - the `admin.listen` address as a URL writes it (`127.0.0.1`, `[::1]`),
//!   and `localhost` when that address is a loopback one; when it is the
//!   unspecified address (`0.0.0.0`, `[::]`), any IP address (a rebinding
//!   needs a name) and `localhost`. A port, if written, must be the one
//!   the server listens on;
//! - a name of `admin.allowed_hosts` (a reverse proxy's); a port written
//!   in the entry must then be the request's.
//!
//! Anything else is answered 421 Misdirected Request: the request was
//! meant for another server, which is a matter of which name, not of who
//! asks (403's). A `Host` that is not a host, two of them, or none on an
//! HTTP/1.1 request is answered 400, as RFC 9112 §3.2 requires. An HTTP/1.0
//! request without `Host` is served: browsers always send one, and simple
//! load-balancer health checks often do not. Every route is checked alike,
//! `/healthz` and `/metrics` too: a scraper or a load balancer asks by the
//! address it was given, which is the listen address (or, behind a proxy,
//! a name to list).
//!
//! Each refusal logs `admin_host_refused` (WARN), at most
//! [`clip::PER_WINDOW`] lines a [`clip::WINDOW`], then one
//! `admin_host_refusals_suppressed` with how many it left out.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, Uri, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use tracing::warn;

use super::error::{echo, ApiError};
use crate::clip::{self, Clip, LogBudget};
use crate::config::{Host, HostName};

/// The names the server answers to.
#[derive(Debug, Clone)]
pub struct Names {
    /// The address listened on (its port as bound).
    listen: SocketAddr,
    allowed: Vec<HostName>,
}

/// Why a request is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// A host this server does not answer to, as the request wrote it.
    Misdirected(String),
    /// No usable `Host`: what is wrong with it.
    BadHost(String),
}

impl Names {
    pub fn new(listen: SocketAddr, allowed: Vec<HostName>) -> Names {
        Names { listen, allowed }
    }

    /// Whether `name` is one of this server's.
    fn answers_to(&self, name: &HostName) -> bool {
        let ip = self.listen.ip();
        let port_ok = name.port.is_none_or(|p| p == self.listen.port());
        let own = match &name.host {
            Host::Ip(addr) => *addr == ip || ip.is_unspecified(),
            Host::Name(n) => n == "localhost" && (ip.is_loopback() || ip.is_unspecified()),
        };
        (own && port_ok)
            || self
                .allowed
                .iter()
                .any(|a| a.host == name.host && (a.port.is_none() || a.port == name.port))
    }

    /// Whether a request of `version` for `uri` with `headers` is served.
    pub fn check(&self, version: Version, uri: &Uri, headers: &HeaderMap) -> Result<(), Refused> {
        let target = match uri.authority() {
            Some(authority) => authority.as_str().to_string(),
            None => {
                let mut hosts = headers.get_all(header::HOST).iter();
                match (hosts.next(), hosts.next()) {
                    (None, _) if version <= Version::HTTP_10 => return Ok(()),
                    (None, _) => {
                        return Err(Refused::BadHost(
                            "an HTTP/1.1 request must say its Host".into(),
                        ))
                    }
                    (Some(_), Some(_)) => {
                        return Err(Refused::BadHost("more than one Host header".into()))
                    }
                    (Some(value), None) => match value.to_str() {
                        Ok(text) => text.to_string(),
                        Err(_) => {
                            return Err(Refused::BadHost("the Host is not ASCII text".into()))
                        }
                    },
                }
            }
        };
        match HostName::parse(&target) {
            Ok(name) if self.answers_to(&name) => Ok(()),
            Ok(_) => Err(Refused::Misdirected(target)),
            Err(why) => Err(Refused::BadHost(format!("bad Host: {why}"))),
        }
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Misdirected(host) => ApiError::misdirected(format!(
                "this admin server does not answer to {:?}: ask it by its admin.listen address \
                 (or localhost on loopback); a reverse proxy's name goes in admin.allowed_hosts",
                echo(&host)
            )),
            Refused::BadHost(why) => ApiError::bad_request(echo(&why)),
        }
        .into_response()
    }
}

/// The check as a layer: [`Names`] and the refusals' log budget.
#[derive(Debug)]
pub struct Guard {
    names: Names,
    lines: Mutex<LogBudget<()>>,
}

impl Guard {
    pub fn new(names: Names) -> Arc<Guard> {
        Arc::new(Guard {
            names,
            lines: Mutex::new(LogBudget::default()),
        })
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, LogBudget<()>> {
        // A poisoned budget is still a budget.
        self.lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Logs the windows over with lines left out; every [`clip::WINDOW`].
    pub async fn sweeping(&self) {
        let mut tick = tokio::time::interval(clip::WINDOW);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for (_, suppressed) in self.lines().sweep(Instant::now()) {
                warn!(
                    event = "admin_host_refusals_suppressed",
                    suppressed,
                    window_s = clip::WINDOW.as_secs(),
                    "more admin requests for a host it does not answer to than are logged one by one"
                );
            }
        }
    }
}

/// The middleware: a request for a name the server answers to goes on,
/// any other is refused (see the module doc).
pub async fn guard(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let checked = guard
        .names
        .check(request.version(), request.uri(), request.headers());
    let Err(refused) = checked else {
        return next.run(request).await;
    };
    if guard.lines().admit(&(), Instant::now()) {
        let peer = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(String::new, |ConnectInfo(peer)| peer.to_string());
        let status = match &refused {
            Refused::Misdirected(_) => 421,
            Refused::BadHost(_) => 400,
        };
        // The name as sent, whatever it is.
        let host = match request.uri().authority() {
            Some(authority) => authority.to_string(),
            None => request
                .headers()
                .get(header::HOST)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default(),
        };
        warn!(
            event = "admin_host_refused",
            status,
            host = %Clip(&host),
            peer = %peer,
            path = %Clip(request.uri().path()),
            "admin request refused: not for a name this server answers to (a web page's DNS rebinding, or a proxy's name missing from admin.allowed_hosts)"
        );
    }
    refused.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn names(listen: &str, allowed: &[&str]) -> Names {
        Names::new(
            listen.parse().unwrap(),
            allowed
                .iter()
                .map(|a| HostName::parse(a).unwrap())
                .collect(),
        )
    }

    fn with_host(names: &Names, host: &str) -> Result<(), Refused> {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(host).unwrap());
        names.check(Version::HTTP_11, &Uri::from_static("/api/dlq"), &headers)
    }

    #[test]
    fn a_loopback_server_answers_to_its_address_and_localhost_with_its_port_or_none() {
        let n = names("127.0.0.1:9183", &[]);
        for ok in [
            "127.0.0.1",
            "127.0.0.1:9183",
            "localhost",
            "LOCALHOST:9183",
            "localhost.",
        ] {
            assert_eq!(with_host(&n, ok), Ok(()), "{ok}");
        }
        for foreign in [
            "evil.example",
            "evil.example:9183",
            "127.0.0.1:80",
            "localhost:9",
            "[::1]:9183",
            "10.0.0.5",
        ] {
            assert_eq!(
                with_host(&n, foreign),
                Err(Refused::Misdirected(foreign.into())),
                "{foreign}"
            );
        }
        let v6 = names("[::1]:9183", &[]);
        assert_eq!(with_host(&v6, "[0::1]:9183"), Ok(()));
        assert_eq!(with_host(&v6, "localhost"), Ok(()));
        assert!(with_host(&v6, "127.0.0.1").is_err());
    }

    #[test]
    fn a_server_on_every_address_answers_to_any_address_but_to_no_other_name() {
        let n = names("0.0.0.0:9183", &[]);
        for ok in [
            "10.0.0.5:9183",
            "192.168.1.20",
            "[fe80::1]",
            "localhost:9183",
        ] {
            assert_eq!(with_host(&n, ok), Ok(()), "{ok}");
        }
        assert!(with_host(&n, "10.0.0.5:9184").is_err());
        assert!(with_host(&n, "edge-box.local").is_err());
        let specific = names("10.0.0.5:9183", &[]);
        assert_eq!(with_host(&specific, "10.0.0.5"), Ok(()));
        assert!(
            with_host(&specific, "localhost").is_err(),
            "not on loopback"
        );
    }

    #[test]
    fn allowed_hosts_are_answered_on_their_port_if_they_name_one() {
        let n = names(
            "127.0.0.1:9183",
            &["ferry.example.com", "proxy.example.com:8443"],
        );
        assert_eq!(with_host(&n, "Ferry.Example.com"), Ok(()));
        assert_eq!(with_host(&n, "ferry.example.com:443"), Ok(()));
        assert_eq!(with_host(&n, "proxy.example.com:8443"), Ok(()));
        assert!(with_host(&n, "proxy.example.com").is_err());
        assert!(with_host(&n, "proxy.example.com:443").is_err());
        assert!(with_host(&n, "sub.ferry.example.com").is_err());
    }

    #[test]
    fn a_missing_double_or_bad_host_is_a_bad_request_but_http_1_0_may_omit_it() {
        let n = names("127.0.0.1:9183", &[]);
        let uri = Uri::from_static("/healthz");
        let none = HeaderMap::new();
        assert_eq!(n.check(Version::HTTP_10, &uri, &none), Ok(()));
        assert!(matches!(
            n.check(Version::HTTP_11, &uri, &none),
            Err(Refused::BadHost(_))
        ));
        let mut two = HeaderMap::new();
        two.append(header::HOST, HeaderValue::from_static("127.0.0.1"));
        two.append(header::HOST, HeaderValue::from_static("127.0.0.1"));
        assert!(matches!(
            n.check(Version::HTTP_10, &uri, &two),
            Err(Refused::BadHost(_))
        ));
        assert!(matches!(with_host(&n, "a b"), Err(Refused::BadHost(_))));
        assert!(matches!(with_host(&n, ""), Err(Refused::BadHost(_))));
    }

    #[test]
    fn an_absolute_target_is_judged_by_its_authority_not_by_its_host_header() {
        let n = names("127.0.0.1:9183", &[]);
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9183"));
        let evil = Uri::from_static("http://evil.example/api/dlq");
        assert!(matches!(
            n.check(Version::HTTP_11, &evil, &headers),
            Err(Refused::Misdirected(_))
        ));
        let ours = Uri::from_static("http://127.0.0.1:9183/api/dlq");
        assert_eq!(n.check(Version::HTTP_11, &ours, &HeaderMap::new()), Ok(()));
    }
}
