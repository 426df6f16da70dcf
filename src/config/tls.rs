//! TLS settings: the PEM files each link names, read and checked once when
//! the config is loaded, so a missing file, a file with no certificate, a
//! key that does not match its certificate or an unusable CA is one line
//! naming the key (a config error), never a failure at the first connection.
//!
//! - [`ListenerTls`]: the embedded broker's device listener (`south.tls`).
//!   rumqttd reads the files itself when the listener starts; they are
//!   checked here with the same rules first.
//! - [`ClientTls`]: ferry as a TLS client (`north.tls`, `south.site_tls`),
//!   a finished rustls client config that rumqttc uses as it is.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::check::ConfigError;
use super::raw::{RawClientTls, RawListenerTls};

/// TLS on the embedded broker's device listener.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerTls {
    /// The listener's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// With a CA, every device must present a certificate it issued, and
    /// the certificate's CN is the device's id.
    pub client_ca: Option<PathBuf>,
    /// Revoked device certificates (PEM CRLs from the client CA).
    pub crl: Option<PathBuf>,
}

/// ferry as a TLS client: the rustls config, built once.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    /// What it was built from, for `Debug` and equality.
    files: Vec<PathBuf>,
}

impl ClientTls {
    /// A client that trusts the CAs in `ca` (PEM) and, with `identity`,
    /// presents that certificate chain and key (PEM files). Errors name
    /// `ca`, `cert` or `key` under `section` (e.g. `north.tls`).
    pub fn load(
        section: &str,
        ca: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> Result<ClientTls, ConfigError> {
        let ca_key = format!("{section}.ca");
        let roots = client_roots(&ca_key, ca)?;
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| ConfigError::new(&ca_key, format!("{}: {e}", ca.display())))?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ConfigError::new(section, e.to_string()))?
            .with_webpki_verifier(verifier);
        let mut files = vec![ca.to_path_buf()];
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let (cert_key, key_key) = (format!("{section}.cert"), format!("{section}.key"));
                let chain = certs(&cert_key, cert)?;
                let private = private_key(&key_key, key)?;
                files.extend([cert.to_path_buf(), key.to_path_buf()]);
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|e| mismatch(&key_key, key, &cert_key, &e))?
            }
        };
        Ok(ClientTls {
            config: Arc::new(config),
            files,
        })
    }

    /// The rustls config rumqttc connects with.
    pub fn rustls(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("files", &self.files)
            .finish()
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        self.files == other.files
    }
}

/// `south.tls`: `None` when no key is set (plain TCP).
pub(super) fn listener(raw: &RawListenerTls) -> Result<Option<ListenerTls>, ConfigError> {
    let cert = set(&raw.cert);
    let key = set(&raw.key);
    let client_ca = set(&raw.client_ca);
    let crl = set(&raw.crl);
    let (cert, key) = match (cert, key) {
        (None, None) => {
            if client_ca.is_some() {
                return Err(ConfigError::new(
                    "south.tls.client_ca",
                    "client certificates need TLS: set south.tls.cert and south.tls.key too",
                ));
            }
            if crl.is_some() {
                return Err(ConfigError::new(
                    "south.tls.crl",
                    "needs south.tls.client_ca (and TLS)",
                ));
            }
            return Ok(None);
        }
        (Some(_), None) => {
            return Err(ConfigError::new(
                "south.tls.key",
                "south.tls.cert is set: set the key of that certificate too",
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                "south.tls.cert",
                "south.tls.key is set: set the certificate of that key too",
            ))
        }
        (Some(cert), Some(key)) => (cert, key),
    };
    if crl.is_some() && client_ca.is_none() {
        return Err(ConfigError::new(
            "south.tls.crl",
            "revocation lists are for client certificates: set south.tls.client_ca too",
        ));
    }
    // rumqttd takes the paths as strings.
    for (name, path) in [
        ("south.tls.cert", Some(cert)),
        ("south.tls.key", Some(key)),
        ("south.tls.client_ca", client_ca),
        ("south.tls.crl", crl),
    ] {
        if path.is_some_and(|p| p.to_str().is_none()) {
            return Err(ConfigError::new(name, "the path must be valid UTF-8"));
        }
    }
    // The rules rumqttd applies when the listener starts, checked now.
    let chain = certs("south.tls.cert", cert)?;
    let private = private_key("south.tls.key", key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::new("south.tls", e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let roots = roots("south.tls.client_ca", ca)?;
            let crls = match crl {
                Some(crl) => crls("south.tls.crl", crl)?,
                None => Vec::new(),
            };
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .with_crls(crls)
                .build()
                .map_err(|e| {
                    let (k, p) = crl.map_or(("south.tls.client_ca", ca), |c| ("south.tls.crl", c));
                    ConfigError::new(k, format!("{}: {e}", p.display()))
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    builder
        .with_single_cert(chain, private)
        .map_err(|e| mismatch("south.tls.key", key, "south.tls.cert", &e))?;
    Ok(Some(ListenerTls {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        client_ca: client_ca.map(Path::to_path_buf),
        crl: crl.map(Path::to_path_buf),
    }))
}

/// `north.tls` or `south.site_tls`: `None` when no key is set (plain TCP).
pub(super) fn client(section: &str, raw: &RawClientTls) -> Result<Option<ClientTls>, ConfigError> {
    let identity = match (set(&raw.cert), set(&raw.key)) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some((cert, key)),
        (Some(_), None) => {
            return Err(ConfigError::new(
                &format!("{section}.key"),
                format!("{section}.cert is set: set the key of that certificate too"),
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                &format!("{section}.cert"),
                format!("{section}.key is set: set the certificate of that key too"),
            ))
        }
    };
    match set(&raw.ca) {
        Some(ca) => ClientTls::load(section, ca, identity).map(Some),
        None if identity.is_some() => Err(ConfigError::new(
            &format!("{section}.ca"),
            "a client certificate needs TLS: set the CA that signed the broker's certificate \
             (a system bundle such as /etc/ssl/certs/ca-certificates.crt for a public CA)",
        )),
        None => Ok(None),
    }
}

/// The first key set among `keys` (name, value): for refusing keys that
/// do not apply.
pub(super) fn first_set<'a>(keys: &[(&'a str, &Path)]) -> Option<&'a str> {
    keys.iter()
        .find(|(_, path)| !path.as_os_str().is_empty())
        .map(|(name, _)| *name)
}

fn set(path: &Path) -> Option<&Path> {
    (!path.as_os_str().is_empty()).then_some(path)
}

/// ring: the one crypto provider built (rustls's default, aws-lc-rs, is not).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path)
        .map_err(|e| ConfigError::new(key, format!("cannot read {}: {e}", path.display())))
}

/// Every PEM certificate in the file; at least one.
fn certs(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let bytes = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::new(key, format!("{}: not PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(ConfigError::new(
            key,
            format!(
                "{}: no certificate in it (expected PEM \"BEGIN CERTIFICATE\")",
                path.display()
            ),
        ));
    }
    Ok(certs)
}

/// The file's PEM private key (PKCS#8, PKCS#1 or SEC1).
fn private_key(key: &str, path: &Path) -> Result<PrivateKeyDer<'static>, ConfigError> {
    let bytes = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        ConfigError::new(
            key,
            format!(
                "{}: no private key in it (expected PEM \"BEGIN PRIVATE KEY\"): {e}",
                path.display()
            ),
        )
    })
}

/// Every certificate in the file as a trust anchor (as rumqttd takes the
/// listener's client CA: any unusable one is an error).
fn roots(key: &str, path: &Path) -> Result<RootCertStore, ConfigError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(key, path)? {
        roots.add(cert).map_err(|e| {
            ConfigError::new(key, format!("{}: not a usable CA: {e}", path.display()))
        })?;
    }
    Ok(roots)
}

/// The usable certificates in the file as trust anchors, at least one: a
/// system bundle (`/etc/ssl/certs/ca-certificates.crt`) may hold a
/// certificate rustls cannot use, which must not stop the others.
fn client_roots(key: &str, path: &Path) -> Result<RootCertStore, ConfigError> {
    let mut roots = RootCertStore::empty();
    let (_, unusable) = roots.add_parsable_certificates(certs(key, path)?);
    if roots.is_empty() {
        return Err(ConfigError::new(
            key,
            format!(
                "{}: none of its {unusable} certificates is a usable CA",
                path.display()
            ),
        ));
    }
    Ok(roots)
}

/// Every PEM CRL in the file; at least one.
fn crls(key: &str, path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, ConfigError> {
    let bytes = read(key, path)?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError::new(key, format!("{}: not PEM: {e}", path.display())))?;
    if crls.is_empty() {
        return Err(ConfigError::new(
            key,
            format!(
                "{}: no CRL in it (expected PEM \"BEGIN X509 CRL\")",
                path.display()
            ),
        ));
    }
    Ok(crls)
}

/// A key rustls would not pair with its certificate.
fn mismatch(key_key: &str, key: &Path, cert_key: &str, e: &rustls::Error) -> ConfigError {
    ConfigError::new(
        key_key,
        format!(
            "{}: not a usable key for the certificate in {cert_key}: {e}",
            key.display()
        ),
    )
}
