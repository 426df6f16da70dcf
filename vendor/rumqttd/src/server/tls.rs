use std::fs::File;
use tokio::net::TcpStream;

#[cfg(feature = "use-native-tls")]
use {
    std::io::Read, tokio_native_tls::native_tls,
    tokio_native_tls::native_tls::Error as NativeTlsError,
};

use crate::TlsConfig;
#[cfg(feature = "verify-client-cert")]
use tokio_rustls::rustls::{server::WebPkiClientVerifier, RootCertStore};
#[cfg(feature = "use-rustls")]
use {
    rustls_pemfile::Item,
    std::{io::BufReader, sync::Arc},
    tokio_rustls::rustls::{pki_types::PrivateKeyDer, Error as RustlsError, ServerConfig},
    tracing::error,
};

use super::broker::CertIdentity;
use crate::link::network::N;

#[derive(Debug, thiserror::Error)]
#[error("Acceptor error")]
pub enum Error {
    #[error("I/O {0}")]
    Io(#[from] std::io::Error),
    #[cfg(feature = "use-native-tls")]
    #[error("Native TLS error {0}")]
    NativeTls(#[from] NativeTlsError),
    #[error("No peer certificate")]
    NoPeerCertificate,
    #[cfg(feature = "use-rustls")]
    #[error("Rustls error {0}")]
    Rustls(#[from] RustlsError),
    #[error("Server cert file {0} not found")]
    ServerCertNotFound(String),
    #[error("Invalid server cert file {0}")]
    InvalidServerCert(String),
    #[error("Invalid CA cert file {0}")]
    InvalidCACert(String),
    #[error("Invalid server key file {0}")]
    InvalidServerKey(String),
    #[error("Server private key file {0} not found")]
    ServerKeyNotFound(String),
    #[error("CA file {0} no found")]
    CaFileNotFound(String),
    #[cfg(not(feature = "use-native-tls"))]
    NativeTlsNotEnabled,
    #[cfg(not(feature = "use-rustls"))]
    RustlsNotEnabled,
    #[error("Invalid tenant id = {0}")]
    InvalidTenantId(String),
    #[error("Invalid tenant certificate")]
    InvalidTenant,
    #[error("Tenant id missing in certificate")]
    MissingTenantId,
    #[error("Tenant id missing in certificate")]
    CertificateParse,
    /// ferry: a CRL file that cannot be read.
    #[error("Invalid CRL file {0}")]
    InvalidCrl(String),
}

impl Error {
    /// ferry: whether the client's certificate was refused or missing (as
    /// opposed to a handshake that never really started).
    pub fn is_certificate(&self) -> bool {
        #[cfg(feature = "use-rustls")]
        if let Error::Io(e) = self {
            use tokio_rustls::rustls::Error as E;
            return matches!(
                e.get_ref().and_then(|inner| inner.downcast_ref::<E>()),
                Some(E::InvalidCertificate(_) | E::NoCertificatesPresented)
            );
        }
        matches!(self, Error::NoPeerCertificate)
    }

    /// ferry: whether the client closed the connection before the
    /// handshake got anywhere (a port probe, a health check): no TLS
    /// error, the stream just ended.
    pub fn is_closed_early(&self) -> bool {
        match self {
            Error::Io(e) => {
                e.kind() == std::io::ErrorKind::UnexpectedEof
                    || e.kind() == std::io::ErrorKind::ConnectionReset
            }
            _ => false,
        }
    }
}

#[cfg(feature = "verify-client-cert")]
/// Extract uid from certificate's subject organization field
fn extract_tenant_id(der: &[u8]) -> Result<Option<String>, Error> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|_| Error::CertificateParse)?;
    let tenant_id = match cert.subject().iter_organization().next() {
        Some(org) => match org.as_str() {
            Ok(val) => val.to_string(),
            Err(_) => return Err(Error::InvalidTenant),
        },
        None => {
            #[cfg(feature = "validate-tenant-prefix")]
            return Err(Error::MissingTenantId);
            #[cfg(not(feature = "validate-tenant-prefix"))]
            return Ok(None);
        }
    };

    if tenant_id.chars().any(|c| !c.is_alphanumeric()) {
        return Err(Error::InvalidTenantId(tenant_id));
    }

    Ok(Some(tenant_id))
}

/// ferry: the client id a certificate's subject CN names.
#[cfg(feature = "verify-client-cert")]
fn cert_client_id(der: &[u8]) -> CertIdentity {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return CertIdentity::Invalid("the certificate cannot be parsed".to_owned());
    };
    let mut names = cert.subject().iter_common_name();
    let cn = match (names.next(), names.next()) {
        (Some(cn), None) => cn,
        (None, _) => return CertIdentity::Invalid("the certificate has no CN".to_owned()),
        (Some(_), Some(_)) => {
            return CertIdentity::Invalid("the certificate has more than one CN".to_owned())
        }
    };
    match cn.as_str() {
        Ok(cn) if crate::valid_cert_client_id(cn) => CertIdentity::ClientId(cn.to_owned()),
        Ok(cn) => CertIdentity::Invalid(format!("CN {cn:?} is not a valid client id")),
        Err(_) => CertIdentity::Invalid("the CN is not a string".to_owned()),
    }
}

/// ferry: the rustls acceptors of every TLS listener, so their
/// certificate, key, client CA and CRL can be read again from their files
/// while running ([`reload_tls`]): a handshake takes the acceptor current
/// when it starts; established connections keep what they began with.
#[cfg(feature = "use-rustls")]
static LIVE: std::sync::Mutex<Vec<std::sync::Weak<Reloadable>>> = std::sync::Mutex::new(Vec::new());

/// ferry: one listener's TLS, as its files said when last read.
#[cfg(feature = "use-rustls")]
pub struct Reloadable {
    config: TlsConfig,
    current: std::sync::RwLock<tokio_rustls::TlsAcceptor>,
}

/// ferry: reads every TLS listener's files again (the same paths as at
/// start: a rotated certificate, key, CA or CRL put in place); each
/// listener's outcome by its certificate's path. One whose files cannot be
/// read keeps the acceptor it had.
#[cfg(feature = "use-rustls")]
pub fn reload_tls() -> Vec<(String, Result<(), String>)> {
    let live: Vec<Arc<Reloadable>> = {
        let mut all = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(|w| w.upgrade()).collect()
    };
    live.iter()
        .filter_map(|r| {
            let TlsConfig::Rustls {
                capath,
                certpath,
                keypath,
                crlpath,
                cn_is_client_id,
            } = &r.config
            else {
                return None;
            };
            let outcome =
                match TLSAcceptor::rustls(capath, certpath, keypath, crlpath, *cn_is_client_id) {
                    Ok(TLSAcceptor::Rustls { acceptor, .. }) => {
                        let fresh = acceptor
                            .current
                            .read()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone();
                        *r.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
                        Ok(())
                    }
                    #[allow(unreachable_patterns)]
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.to_string()),
                };
            Some((certpath.clone(), outcome))
        })
        .collect()
}

#[allow(dead_code)]
pub enum TLSAcceptor {
    #[cfg(feature = "use-rustls")]
    Rustls {
        /// ferry: read again by [`reload_tls`].
        acceptor: Arc<Reloadable>,
        /// ferry: see [`crate::TlsConfig::Rustls`].
        cn_is_client_id: bool,
        /// ferry: whether client certificates are required.
        client_certs: bool,
    },
    #[cfg(feature = "use-native-tls")]
    NativeTLS {
        acceptor: tokio_native_tls::TlsAcceptor,
    },
}

impl TLSAcceptor {
    pub fn new(config: &TlsConfig) -> Result<Self, Error> {
        match config {
            #[cfg(feature = "use-rustls")]
            TlsConfig::Rustls {
                capath,
                certpath,
                keypath,
                crlpath,
                cn_is_client_id,
            } => {
                let made = Self::rustls(capath, certpath, keypath, crlpath, *cn_is_client_id)?;
                #[allow(irrefutable_let_patterns)]
                if let TLSAcceptor::Rustls { acceptor, .. } = &made {
                    LIVE.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Arc::downgrade(acceptor));
                }
                Ok(made)
            }
            #[cfg(feature = "use-native-tls")]
            TlsConfig::NativeTls {
                pkcs12path,
                pkcs12pass,
            } => Self::native_tls(pkcs12path, pkcs12pass),
            #[cfg(not(feature = "use-rustls"))]
            TlsConfig::Rustls { .. } => Err(Error::RustlsNotEnabled),
            #[cfg(not(feature = "use-native-tls"))]
            TlsConfig::NativeTls { .. } => Err(Error::NativeTlsNotEnabled),
        }
    }

    /// The handshake: the tenant id, who the client certificate says the
    /// client is (ferry), and the stream.
    pub async fn accept(
        &self,
        stream: TcpStream,
    ) -> Result<(Option<String>, CertIdentity, Box<dyn N>), Error> {
        match self {
            #[cfg(feature = "use-rustls")]
            TLSAcceptor::Rustls {
                acceptor,
                cn_is_client_id,
                client_certs,
            } => {
                let current = acceptor
                    .current
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                let stream = current.accept(stream).await?;

                #[cfg(feature = "verify-client-cert")]
                let (tenant_id, identity) = {
                    let (_, session) = stream.get_ref();
                    // ferry: the verifier requires a certificate exactly
                    // when there is a CA; without one there is none to read.
                    let first = session.peer_certificates().and_then(|c| c.first());
                    match (first, *client_certs, *cn_is_client_id) {
                        (None, false, _) => (None, CertIdentity::None),
                        (None, true, _) => return Err(Error::NoPeerCertificate),
                        (Some(cert), _, true) => (None, cert_client_id(cert)),
                        (Some(cert), _, false) => (extract_tenant_id(cert)?, CertIdentity::None),
                    }
                };
                #[cfg(not(feature = "verify-client-cert"))]
                let (tenant_id, identity) = {
                    let _ = (cn_is_client_id, client_certs);
                    (None, CertIdentity::None)
                };

                let network = Box::new(stream);
                Ok((tenant_id, identity, network))
            }
            #[cfg(feature = "use-native-tls")]
            TLSAcceptor::NativeTLS { acceptor } => {
                let stream = acceptor.accept(stream).await?;
                // native-tls doesn't support client certificate verification
                // let session = stream.get_ref();
                // let peer_certificate = session
                //     .peer_certificate()?
                //     .ok_or(Error::NoPeerCertificate)?
                //     .to_der()?;
                // let tenant_id = extract_tenant_id(&peer_certificate)?;
                let network = Box::new(stream);
                Ok((None, CertIdentity::None, network))
            }
        }
    }

    #[cfg(feature = "use-native-tls")]
    fn native_tls(pkcs12_path: &String, pkcs12_pass: &str) -> Result<Self, Error> {
        // Get certificates
        let cert_file = File::open(pkcs12_path);
        let mut cert_file =
            cert_file.map_err(|_| Error::ServerCertNotFound(pkcs12_path.clone()))?;

        // Read cert into memory
        let mut buf = Vec::new();
        cert_file
            .read_to_end(&mut buf)
            .map_err(|_| Error::InvalidServerCert(pkcs12_path.clone()))?;

        // Get the identity
        let identity = native_tls::Identity::from_pkcs12(&buf, pkcs12_pass)
            .map_err(|_| Error::InvalidServerCert(pkcs12_path.clone()))?;

        // Builder
        let builder = native_tls::TlsAcceptor::builder(identity).build()?;

        // Create acceptor
        let acceptor = tokio_native_tls::TlsAcceptor::from(builder);
        Ok(TLSAcceptor::NativeTLS { acceptor })
    }

    #[cfg(feature = "use-rustls")]
    fn rustls(
        ca_path: &Option<String>,
        cert_path: &String,
        key_path: &String,
        crl_path: &Option<String>,
        cn_is_client_id: bool,
    ) -> Result<TLSAcceptor, Error> {
        // ferry: without a CA, TLS without client certificates, also with
        // `verify-client-cert` (upstream refused to start).
        #[cfg(not(feature = "verify-client-cert"))]
        if ca_path.is_some() {
            tracing::warn!(event = "tls_client_ca_ignored", "verify-client-cert feature is disabled, CA cert will be ignored and no client authentication is done.");
        }

        let (certs, key) = {
            // Get certificates
            let cert_file = File::open(cert_path);
            let cert_file = cert_file.map_err(|_| Error::ServerCertNotFound(cert_path.clone()))?;
            let certs = rustls_pemfile::certs(&mut BufReader::new(cert_file))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| Error::InvalidServerCert(cert_path.to_string()))?;

            // Get private key
            let key = first_private_key_in_pemfile(key_path)?;

            (certs, key)
        };

        // ferry: ring, the provider ferry's own TLS configs use (rustls
        // 0.23 would otherwise pick a process default).
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;

        // client authentication with a CA. CA isn't required otherwise
        #[cfg(feature = "verify-client-cert")]
        let (builder, client_certs) = match ca_path {
            Some(ca_path) => {
                let ca_file = File::open(ca_path);
                let ca_file = ca_file.map_err(|_| Error::CaFileNotFound(ca_path.clone()))?;
                let ca_file = &mut BufReader::new(ca_file);
                // ferry: every certificate in the file is a trust anchor
                // (upstream took the first only).
                let ca_certs = rustls_pemfile::certs(ca_file)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| Error::InvalidCACert(ca_path.to_string()))?;
                let mut store = RootCertStore::empty();
                for ca_cert in ca_certs {
                    store
                        .add(ca_cert)
                        .map_err(|_| Error::InvalidCACert(ca_path.to_string()))?;
                }
                // ferry: revoked client certificates are refused.
                let crls = match crl_path {
                    Some(crl_path) => {
                        let crl_file = File::open(crl_path)
                            .map_err(|_| Error::InvalidCrl(crl_path.clone()))?;
                        rustls_pemfile::crls(&mut BufReader::new(crl_file))
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|_| Error::InvalidCrl(crl_path.clone()))?
                    }
                    None => Vec::new(),
                };
                // ferry: an empty CA file or a bad CRL is an error, not a
                // panic.
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider)
                        .with_crls(crls)
                        .build()
                        .map_err(|_| Error::InvalidCACert(ca_path.to_string()))?;
                (builder.with_client_cert_verifier(verifier), true)
            }
            None => (builder.with_no_client_auth(), false),
        };

        #[cfg(not(feature = "verify-client-cert"))]
        let (builder, client_certs) = {
            let _ = crl_path;
            (builder.with_no_client_auth(), false)
        };

        let server_config = builder.with_single_cert(certs, key)?;

        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
        Ok(TLSAcceptor::Rustls {
            acceptor: Arc::new(Reloadable {
                config: TlsConfig::Rustls {
                    capath: ca_path.clone(),
                    certpath: cert_path.clone(),
                    keypath: key_path.clone(),
                    crlpath: crl_path.clone(),
                    cn_is_client_id,
                },
                current: std::sync::RwLock::new(acceptor),
            }),
            cn_is_client_id,
            client_certs,
        })
    }
}

#[cfg(feature = "use-rustls")]
/// Get the first private key in a PEM file
fn first_private_key_in_pemfile(key_path: &String) -> Result<PrivateKeyDer<'static>, Error> {
    // Get private key
    let key_file = File::open(key_path);
    let key_file = key_file.map_err(|_| Error::ServerKeyNotFound(key_path.clone()))?;

    let rd = &mut BufReader::new(key_file);

    // keep reading Items one by one to find a Key, return error if none found.
    loop {
        let item = rustls_pemfile::read_one(rd).map_err(|err| {
            error!(
                event = "tls_key_unreadable",
                "Error reading key file: {:?}", err
            );
            Error::InvalidServerKey(key_path.clone())
        })?;

        match item {
            Some(Item::Sec1Key(key)) => {
                return Ok(key.into());
            }
            Some(Item::Pkcs1Key(key)) => {
                return Ok(key.into());
            }
            Some(Item::Pkcs8Key(key)) => {
                return Ok(key.into());
            }
            None => {
                error!(
                    event = "tls_key_missing",
                    "No private key found in {:?}", key_path
                );
                return Err(Error::InvalidServerKey(key_path.clone()));
            }
            _ => {}
        }
    }
}
