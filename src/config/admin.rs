//! `[admin]`, checked: where the admin HTTP server listens, and the other
//! names it answers to (a reverse proxy's, `admin.allowed_hosts`).
//!
//! A name is written as an HTTP `Host` header carries it: a DNS name or an
//! IP literal (IPv6 in brackets), with a `:port` or without.
//! [`HostName::parse`] reads an entry and a `Host` header alike, so the two
//! compare in one form: lowercased, a DNS name's trailing dot dropped, an
//! address as an address (`[0:0::1]` is `[::1]`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::check::{ConfigError, Problems};
use super::raw::RawAdmin;

/// Most entries in `admin.allowed_hosts`: a proxy's few names, not a list
/// of the internet.
pub const MAX_ALLOWED_HOSTS: usize = 64;

/// `[admin]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConfig {
    /// `admin.listen`.
    pub listen: SocketAddr,
    /// `admin.allowed_hosts`: names beyond the listen address's own.
    pub allowed_hosts: Vec<HostName>,
}

/// A host as a URL or a `Host` header names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name, lowercased, without a trailing dot.
    Name(String),
    Ip(IpAddr),
}

/// A host and, if written, a port (`ferry.example.com`, `10.0.0.5:9183`,
/// `[::1]:9183`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostName {
    pub host: Host,
    pub port: Option<u16>,
}

impl HostName {
    /// `text` as `host` or `host:port`, or why it is not one.
    pub fn parse(text: &str) -> Result<HostName, String> {
        if text.is_empty() {
            return Err("empty: expected a host name or address, with a :port or without".into());
        }
        if text.contains('/') {
            return Err(format!(
                "{text:?}: a host name with an optional :port, not a URL (e.g. \"ferry.example.com\")"
            ));
        }
        if text.contains('*') {
            return Err(format!(
                "{text:?}: no wildcards; list each name the proxy forwards"
            ));
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let Some((inner, after)) = rest.split_once(']') else {
                return Err(format!("{text:?}: an IPv6 address's \"[\" is not closed"));
            };
            let ip: Ipv6Addr = inner
                .parse()
                .map_err(|_| format!("{text:?}: {inner:?} is not an IPv6 address"))?;
            let port = match after {
                "" => None,
                _ => match after.strip_prefix(':') {
                    Some(port) => Some(parse_port(text, port)?),
                    None => return Err(format!("{text:?}: expected \":port\" after \"]\"")),
                },
            };
            (Host::Ip(IpAddr::V6(ip)), port)
        } else {
            let (name, port) = match text.split_once(':') {
                None => (text, None),
                Some((_, port)) if port.contains(':') => {
                    return Err(format!(
                        "{text:?}: an IPv6 address goes in brackets, e.g. \"[::1]:9183\""
                    ))
                }
                Some((name, port)) => (name, Some(parse_port(text, port)?)),
            };
            let host = match name.parse::<Ipv4Addr>() {
                Ok(ip) => Host::Ip(IpAddr::V4(ip)),
                Err(_) => Host::Name(dns_name(text, name)?),
            };
            (host, port)
        };
        Ok(HostName { host, port })
    }
}

fn parse_port(text: &str, port: &str) -> Result<u16, String> {
    match port.parse::<u16>() {
        Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(format!("{text:?}: the port must be 1..=65535")),
    }
}

/// `name` lowercased without its trailing dot, if it is a DNS name:
/// labels of letters, digits, `-` and `_` (a container's service name),
/// 1 to 63 bytes each, 253 in all.
fn dns_name(text: &str, name: &str) -> Result<String, String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "{text:?} is not a host name (letters, digits, \"-\", dots) or an IP address"
        ));
    }
    Ok(name)
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => write!(f, "{}", self.host),
        }
    }
}

/// `[admin]`: `None` when `admin.listen` is empty (no admin server). Every
/// bad entry of `admin.allowed_hosts` is noted on a line of its own.
pub(super) fn check(raw: &RawAdmin, p: &mut Problems) -> Option<Option<AdminConfig>> {
    let listen = match raw.listen.trim() {
        "" => Some(None),
        listen => p.take(listen.parse::<SocketAddr>().map(Some).map_err(|e| {
            ConfigError::new(
                "admin.listen",
                format!(
                    "{e}; expected host:port, e.g. \"127.0.0.1:9183\", or \"\" for no admin server"
                ),
            )
        })),
    };
    let allowed_hosts = allowed_hosts(&raw.allowed_hosts, p);
    let (listen, allowed_hosts) = (listen?, allowed_hosts?);
    Some(listen.map(|listen| AdminConfig {
        listen,
        allowed_hosts,
    }))
}

/// `admin.allowed_hosts`, each bad entry noted on a line of its own.
fn allowed_hosts(raw: &[String], p: &mut Problems) -> Option<Vec<HostName>> {
    if raw.len() > MAX_ALLOWED_HOSTS {
        p.note(ConfigError::new(
            "admin.allowed_hosts",
            format!("at most {MAX_ALLOWED_HOSTS} names (got {})", raw.len()),
        ));
        return None;
    }
    let mut checked = Vec::with_capacity(raw.len());
    let mut bad = false;
    for (i, text) in raw.iter().enumerate() {
        match HostName::parse(text) {
            Ok(name) => checked.push(name),
            Err(e) => {
                p.note(ConfigError::new(&format!("admin.allowed_hosts[{i}]"), e));
                bad = true;
            }
        }
    }
    (!bad).then_some(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(host: &str, port: Option<u16>) -> HostName {
        HostName {
            host: Host::Name(host.into()),
            port,
        }
    }

    #[test]
    fn names_and_addresses_are_read_with_a_port_or_without() {
        assert_eq!(
            HostName::parse("Ferry.Example.com."),
            Ok(name("ferry.example.com", None))
        );
        assert_eq!(
            HostName::parse("ferry.example.com:8443"),
            Ok(name("ferry.example.com", Some(8443)))
        );
        assert_eq!(HostName::parse("edge_gw"), Ok(name("edge_gw", None)));
        let v4 = HostName::parse("10.0.0.5:9183").unwrap();
        assert_eq!(v4.host, Host::Ip("10.0.0.5".parse().unwrap()));
        assert_eq!(v4.port, Some(9183));
        let v6 = HostName::parse("[0:0::1]:9183").unwrap();
        assert_eq!(v6.host, Host::Ip("::1".parse().unwrap()));
        assert_eq!(v6.to_string(), "[::1]:9183");
        assert_eq!(HostName::parse("[fe80::2]").unwrap().port, None);
    }

    fn checked(listen: &str, hosts: &[&str]) -> Result<Option<AdminConfig>, Vec<String>> {
        let raw = RawAdmin {
            listen: listen.into(),
            allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        };
        let mut p = Problems::default();
        let admin = check(&raw, &mut p);
        p.finish(admin)
            .map_err(|e| e.iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn the_section_is_checked_entry_by_entry() {
        let cfg = checked("127.0.0.1:9183", &["ferry.example.com", "[::1]:8443"])
            .unwrap()
            .unwrap();
        assert_eq!(cfg.listen.port(), 9183);
        assert_eq!(cfg.allowed_hosts.len(), 2);
        assert_eq!(checked("", &["ferry.example.com"]), Ok(None));
        let lines = checked("127.0.0.1:9183", &["ok.example", "a b", "*"]).unwrap_err();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("`admin.allowed_hosts[1]`"), "{lines:?}");
        assert!(lines[1].contains("`admin.allowed_hosts[2]`"), "{lines:?}");
        let many = vec!["a.example"; MAX_ALLOWED_HOSTS + 1];
        let lines = checked("127.0.0.1:9183", &many).unwrap_err();
        assert!(lines[0].contains("at most 64"), "{lines:?}");
        let lines = checked("nowhere", &["*"]).unwrap_err();
        assert!(lines[0].contains("`admin.listen`"), "{lines:?}");
        assert!(lines[1].contains("`admin.allowed_hosts[0]`"), "{lines:?}");
    }

    #[test]
    fn what_is_not_a_host_is_refused_with_the_reason() {
        for (text, says) in [
            ("", "empty"),
            ("*", "no wildcards"),
            ("*.example.com", "no wildcards"),
            ("::1", "in brackets"),
            ("[::1", "not closed"),
            ("[::1]9183", "\":port\""),
            ("[nope]", "not an IPv6"),
            ("host:0", "1..=65535"),
            ("host:", "1..=65535"),
            ("host:+80", "1..=65535"),
            ("host:70000", "1..=65535"),
            ("evil example", "not a host name"),
            ("-lead.example", "not a host name"),
            ("a..b", "not a host name"),
            ("http://ferry.example.com", "not a URL"),
            ("ferry.example.com/", "not a URL"),
        ] {
            let e = HostName::parse(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        assert!(HostName::parse(&"a".repeat(64)).is_err());
        assert!(HostName::parse(&format!("{}.x", "a.".repeat(130))).is_err());
    }
}
