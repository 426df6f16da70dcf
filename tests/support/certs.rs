//! Test certificates, made at test time with rcgen: a CA, server
//! certificates for 127.0.0.1 and localhost, client certificates whose CN
//! is a device id (or anything a test needs), and revocation lists. All
//! written as PEM files in the PKI's own temp dir, as an operator would
//! hand them to ferry and Mosquitto.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, CertificateRevocationListParams,
    DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair,
    KeyUsagePurpose, RevokedCertParams, SerialNumber,
};

/// A certificate and its key as PEM files.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub serial: u64,
}

/// A test CA and the files it issued; the files go with it.
pub struct Pki {
    pub dir: tempfile::TempDir,
    /// The CA's certificate (PEM), what a peer trusts.
    pub ca: PathBuf,
    ca_cert: Certificate,
    ca_key: KeyPair,
    next_serial: AtomicU64,
}

impl Pki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("ferry-pki-")
            .tempdir()
            .expect("temp dir for certificates");
        let ca_key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = params.self_signed(&ca_key).expect("self-signed CA");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_cert.pem()).expect("write ca.pem");
        Pki {
            dir,
            ca,
            ca_cert,
            ca_key,
            next_serial: AtomicU64::new(1),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost.
    pub fn server(&self, name: &str) -> Issued {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .expect("server names");
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(name, params)
    }

    /// A server certificate for `names` only (DNS names or IP addresses).
    pub fn server_for(&self, name: &str, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("server names");
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(name, params)
    }

    /// A client certificate with subject CN `cn` (a device id, for ferry).
    pub fn client(&self, cn: &str) -> Issued {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(&format!("client-{}", sanitize(cn)), params)
    }

    /// A client certificate with no CN at all (only an O).
    pub fn client_without_cn(&self, org: &str) -> Issued {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, org);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(&format!("client-no-cn-{}", sanitize(org)), params)
    }

    fn issue(&self, name: &str, mut params: CertificateParams) -> Issued {
        let serial = self.next_serial.fetch_add(1, Ordering::Relaxed);
        params.serial_number = Some(SerialNumber::from(serial));
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &self.ca_cert, &self.ca_key)
            .expect("sign certificate");
        let cert_path = self.dir.path().join(format!("{name}-{serial}.pem"));
        let key_path = self.dir.path().join(format!("{name}-{serial}.key"));
        std::fs::write(&cert_path, cert.pem()).expect("write certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        Issued {
            cert: cert_path,
            key: key_path,
            serial,
        }
    }

    /// A CRL (PEM file) revoking `revoked`.
    pub fn crl(&self, revoked: &[&Issued]) -> PathBuf {
        let params = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|i| RevokedCertParams {
                    serial_number: SerialNumber::from(i.serial),
                    revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params
            .signed_by(&self.ca_cert, &self.ca_key)
            .expect("sign CRL");
        let path = self.dir.path().join("crl.pem");
        std::fs::write(&path, crl.pem().expect("CRL as PEM")).expect("write crl.pem");
        path
    }

    /// A rustls client config that trusts this CA and, with `identity`,
    /// presents it: ferry's own loader, as north uses it.
    pub fn client_config(&self, identity: Option<&Issued>) -> Arc<rustls::ClientConfig> {
        client_config(&self.ca, identity)
    }
}

/// A rustls client config trusting the CA in `ca`, presenting `identity`.
pub fn client_config(ca: &Path, identity: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    ferry::config::ClientTls::load(
        "test",
        ca,
        identity.map(|i| (i.cert.as_path(), i.key.as_path())),
    )
    .unwrap_or_else(|e| panic!("test TLS client config: {e}"))
    .rustls()
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}
