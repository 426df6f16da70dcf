//! Where and how `ferry device` connects, from its flags and, with
//! `--config`, the gateway's own config file: host and port (the embedded
//! broker's `south.listen`, or the site broker's `south.host`/`port`), TLS
//! (`south.tls`, `south.site_tls`) and the topic prefix. A flag wins over
//! the file; without either, 127.0.0.1:1883 in plain TCP.
//!
//! Always holds: a password is never taken from the command line (where
//! `ps` and the shell's history show it): from a file or stdin, at most
//! [`MAX_PASSWORD`] bytes, one line. Every refusal is one line naming the
//! flag or the file, and means exit 64 (usage).

use std::io::{IsTerminal, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry::client::device::DeviceOptions;
use ferry::config::{MqttVersion, RawConfig};
use ferry::mqtt::Transport;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The longest password read, in bytes.
pub const MAX_PASSWORD: u64 = 4096;

/// The connection flags, as clap parsed them.
#[derive(clap::Args, Debug)]
pub struct ConnectArgs {
    /// The device to be: its MQTT client id (and its username).
    #[arg(long, value_name = "ID")]
    pub id: String,
    /// Take host, port, TLS and topic prefix from this gateway config
    /// (its [south] section); flags still win.
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The gateway's (or site broker's) host [default: 127.0.0.1].
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,
    /// Its port [default: 1883].
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// Read the device's password from the first line of FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "password_stdin")]
    pub password_file: Option<PathBuf>,
    /// Read the device's password from stdin (prompted on a terminal).
    #[arg(long)]
    pub password_stdin: bool,
    /// The username sent with the password [default: the device id, as
    /// the embedded broker requires].
    #[arg(long, value_name = "USER")]
    pub username: Option<String>,
    /// Connect with TLS (implied by --cafile, --cert, --key and a config
    /// whose device listener is TLS).
    #[arg(long)]
    pub tls: bool,
    /// The CA (PEM) that issued the gateway's certificate.
    #[arg(long, value_name = "FILE")]
    pub cafile: Option<PathBuf>,
    /// The device's certificate chain (PEM), where the gateway asks for one.
    #[arg(long, value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// The name the gateway's certificate must carry [default: the host].
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
    /// The MQTT version: 3.1.1 or 5.
    #[arg(long, value_name = "VERSION", default_value = "3.1.1", value_parser = parse_version)]
    pub mqtt: MqttVersion,
}

/// A connection, checked: the client's options and where it goes.
pub struct Target {
    pub opts: DeviceOptions,
    /// `host:port`, for the lines printed.
    pub at: String,
}

/// What the config file says about the device side.
#[derive(Debug, PartialEq)]
struct FromConfig {
    host: String,
    port: u16,
    tls: bool,
    prefix: String,
}

/// Checks the flags (and reads the config, the password, the TLS files).
pub fn target(args: &ConnectArgs) -> Result<Target, String> {
    ferry::ids::DeviceId::new(args.id.as_str()).map_err(|e| format!("--id {:?}: {e}", args.id))?;
    let file = match &args.config {
        Some(path) => Some(from_config(path)?),
        None => None,
    };
    let host = args
        .host
        .clone()
        .or_else(|| file.as_ref().map(|f| f.host.clone()))
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = args.port.or(file.as_ref().map(|f| f.port)).unwrap_or(1883);
    let mut opts = DeviceOptions::new(host.clone(), port, args.id.clone());
    opts.mqtt_version = args.mqtt;
    if let Some(f) = &file {
        opts.prefix = f.prefix.clone();
    }
    opts.password = password(args)?;
    if args.username.is_some() && opts.password.is_none() {
        return Err(
            "--username goes with a password: give --password-file or --password-stdin".into(),
        );
    }
    opts.username = args.username.clone();
    let tls = args.tls
        || args.cafile.is_some()
        || args.cert.is_some()
        || file.as_ref().is_some_and(|f| f.tls);
    if tls {
        opts.transport = Transport::Tls(tls_config(args)?);
    } else if args.server_name.is_some() {
        return Err("--server-name is for TLS: give --tls and --cafile".into());
    }
    Ok(Target {
        opts,
        at: format!("{host}:{port}"),
    })
}

fn parse_version(value: &str) -> Result<MqttVersion, String> {
    MqttVersion::parse("--mqtt", value).map_err(|_| format!("must be 3.1.1 or 5, not {value:?}"))
}

/// `30s`, `500ms`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let split = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration like 30s, 500ms, 2m or 1h"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("{value:?}: the unit must be ms, s, m or h")),
    };
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

/// The [south] section of the gateway's config, as a device sees it.
fn from_config(path: &Path) -> Result<FromConfig, String> {
    let raw = RawConfig::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let south = raw.south;
    let prefix = south.topic_prefix;
    if south.mode == "external" {
        return Ok(FromConfig {
            host: south.host,
            port: south.port,
            tls: !south.site_tls.ca.as_os_str().is_empty(),
            prefix,
        });
    }
    // With several listeners, the first one.
    let (key, listen, tls) = match south.listeners.first() {
        Some(l) => (
            "south.listeners[0].listen",
            l.listen.clone(),
            l.transport == "tls",
        ),
        None => (
            "south.listen",
            south.listen.clone(),
            !south.tls.cert.as_os_str().is_empty(),
        ),
    };
    let listen: SocketAddr = listen.parse().map_err(|_| {
        format!(
            "{}: {key} {listen:?} is not an address like 127.0.0.1:1883",
            path.display(),
        )
    })?;
    Ok(FromConfig {
        host: reachable(listen.ip()).to_string(),
        port: listen.port(),
        tls,
        prefix,
    })
}

/// Where to reach a listener on `ip`: on this box, a wildcard address is
/// reached on loopback.
fn reachable(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    }
}

/// The password from `--password-file` or `--password-stdin`, if either.
fn password(args: &ConnectArgs) -> Result<Option<String>, String> {
    if let Some(path) = &args.password_file {
        let file = std::fs::File::open(path)
            .map_err(|e| format!("--password-file {}: {e}", path.display()))?;
        let what = format!("--password-file {}", path.display());
        return first_line(file, &what).map(Some);
    }
    if !args.password_stdin {
        return Ok(None);
    }
    if std::io::stdin().is_terminal() {
        let typed = rpassword::prompt_password(format!("password for {}: ", args.id))
            .map_err(|e| format!("cannot read the password: {e}"))?;
        return one_line(typed.into_bytes(), "the password typed").map(Some);
    }
    first_line(std::io::stdin().lock(), "--password-stdin").map(Some)
}

/// The first line of `from`, read up to [`MAX_PASSWORD`] bytes.
fn first_line(from: impl Read, what: &str) -> Result<String, String> {
    let mut bytes = Vec::new();
    from.take(MAX_PASSWORD + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{what}: {e}"))?;
    if bytes.len() as u64 > MAX_PASSWORD {
        return Err(format!(
            "{what}: more than {MAX_PASSWORD} bytes; it holds one password on one line"
        ));
    }
    one_line(bytes, what)
}

/// `bytes` as one non-empty line (a trailing newline is not part of it).
fn one_line(mut bytes: Vec<u8>, what: &str) -> Result<String, String> {
    for end in [b'\n', b'\r'] {
        if bytes.last() == Some(&end) {
            bytes.pop();
        }
    }
    if bytes.contains(&b'\n') {
        return Err(format!("{what}: more than one line; it holds one password"));
    }
    let line = String::from_utf8(bytes).map_err(|_| format!("{what}: not UTF-8"))?;
    if line.is_empty() {
        return Err(format!("{what}: empty password"));
    }
    Ok(line)
}

/// The TLS client: trusts `--cafile`, presents `--cert`/`--key` if given,
/// and checks the gateway's certificate names `--server-name` (or the host).
fn tls_config(args: &ConnectArgs) -> Result<Arc<ClientConfig>, String> {
    let Some(ca) = &args.cafile else {
        return Err(
            "TLS needs --cafile: the CA (PEM) that issued the gateway's certificate".into(),
        );
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in pem_certs("--cafile", ca)? {
        roots
            .add(cert)
            .map_err(|e| format!("--cafile {}: {e}", ca.display()))?;
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("--cafile {}: {e}", ca.display()))?;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &args.server_name {
        None => builder.with_webpki_verifier(webpki),
        Some(name) => {
            let name = ServerName::try_from(name.clone()).map_err(|_| {
                format!("--server-name {name:?} is not a DNS name or an IP address")
            })?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Named { webpki, name }))
        }
    };
    let config = match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => {
            let chain = pem_certs("--cert", cert)?;
            let private = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("--key {}: no private key read ({e})", key.display()))?;
            builder.with_client_auth_cert(chain, private).map_err(|e| {
                format!(
                    "--key {} does not fit --cert {}: {e}",
                    key.display(),
                    cert.display()
                )
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn pem_certs(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{flag} {}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// The web PKI check, against `name` instead of the host connected to
/// (`--server-name`: a gateway reached by an address its certificate
/// does not name).
#[derive(Debug)]
struct Named {
    webpki: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for Named {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.webpki
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit_and_refuse_zero_and_junk() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("10 s").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5d").is_err());
    }

    #[test]
    fn a_password_is_one_bounded_line() {
        assert_eq!(first_line(&b"s3cret\n"[..], "f"), Ok("s3cret".into()));
        assert_eq!(first_line(&b"s3cret\r\n"[..], "f"), Ok("s3cret".into()));
        assert_eq!(first_line(&b"s3cret"[..], "f"), Ok("s3cret".into()));
        assert!(first_line(&b"\n"[..], "f").unwrap_err().contains("empty"));
        assert!(first_line(&b"a\nb\n"[..], "f")
            .unwrap_err()
            .contains("more than one line"));
        let big = vec![b'x'; MAX_PASSWORD as usize + 1];
        assert!(first_line(&big[..], "f").unwrap_err().contains("4096"));
        let most = vec![b'x'; MAX_PASSWORD as usize];
        assert_eq!(first_line(&most[..], "f").map(|p| p.len()), Ok(4096));
    }

    #[test]
    fn with_several_listeners_the_device_command_uses_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ferry.toml");
        std::fs::write(
            &path,
            "[gateway]\nid = \"g\"\n[south]\nlisteners = [\
             { listen = \"0.0.0.0:8883\", transport = \"tls\" },\
             { listen = \"127.0.0.1:1883\" }]\n",
        )
        .unwrap();
        let got = from_config(&path).unwrap();
        assert_eq!(
            (got.host.as_str(), got.port, got.tls),
            ("127.0.0.1", 8883, true)
        );
        std::fs::write(
            &path,
            "[gateway]\nid = \"g\"\n[south]\nlisten = \"10.0.0.5:1884\"\n",
        )
        .unwrap();
        let got = from_config(&path).unwrap();
        assert_eq!(
            (got.host.as_str(), got.port, got.tls),
            ("10.0.0.5", 1884, false)
        );
    }

    #[test]
    fn a_wildcard_listener_is_reached_on_loopback() {
        assert_eq!(
            reachable("0.0.0.0".parse().unwrap()).to_string(),
            "127.0.0.1"
        );
        assert_eq!(reachable("::".parse().unwrap()).to_string(), "::1");
        assert_eq!(
            reachable("10.0.0.5".parse().unwrap()).to_string(),
            "10.0.0.5"
        );
    }
}
