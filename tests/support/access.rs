//! How a test's devices reach the embedded broker: anonymously (who a
//! device is, is its client id), with a password, or with a client
//! certificate whose CN is its id. A test written once against [`Access`]
//! runs in every auth mode, with raw MQTT packets it writes itself.

use std::collections::HashMap;
use std::sync::Mutex;

use super::certs::{Issued, Pki};
use super::config::FerryOpts;
use super::raw_mqtt::{tls_stream, RawMqtt};

/// The embedded broker's auth modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    Anonymous,
    Password,
    Certificate,
}

impl AuthMode {
    pub const ALL: [AuthMode; 3] = [
        AuthMode::Anonymous,
        AuthMode::Password,
        AuthMode::Certificate,
    ];
}

/// One auth mode with what its devices need: passwords, or a CA and a
/// certificate per device (made on first use).
pub struct Access {
    pub mode: AuthMode,
    pki: Option<Pki>,
    certs: Mutex<HashMap<String, Issued>>,
}

impl Access {
    pub fn new(mode: AuthMode) -> Access {
        Access {
            mode,
            pki: (mode == AuthMode::Certificate).then(|| Pki::new("access")),
            certs: Mutex::new(HashMap::new()),
        }
    }

    /// The password a device has in [`AuthMode::Password`].
    pub fn password(device: &str) -> String {
        format!("pw-{device}")
    }

    /// `opts` set up for this mode, `devices` given their passwords (the
    /// harness then logs its clients in) or the listener TLS with client
    /// certificates.
    pub fn opts(&self, opts: FerryOpts, devices: &[&str]) -> FerryOpts {
        match self.mode {
            AuthMode::Anonymous => opts,
            AuthMode::Password => {
                let logins: Vec<(String, String)> = devices
                    .iter()
                    .map(|d| (d.to_string(), Access::password(d)))
                    .collect();
                let logins: Vec<(&str, &str)> = logins
                    .iter()
                    .map(|(d, p)| (d.as_str(), p.as_str()))
                    .collect();
                opts.with_passwords(&logins)
            }
            AuthMode::Certificate => {
                let pki = self.pki.as_ref().expect("a PKI in certificate mode");
                let server = pki.server("ferry-south");
                let ca = pki.ca.clone();
                opts.with(|c| {
                    c.south.tls.cert = server.cert;
                    c.south.tls.key = server.key;
                    c.south.tls.client_ca = ca;
                })
            }
        }
    }

    /// A CONNECT for `device` as this mode has it (clean session,
    /// keep-alive 30 s, its login in password mode).
    pub fn connect_packet(&self, device: &str) -> rumqttc::Connect {
        let mut connect = rumqttc::Connect::new(device);
        connect.keep_alive = 30;
        connect.clean_session = true;
        if self.mode == AuthMode::Password {
            connect.set_login(device, Access::password(device));
        }
        connect
    }

    /// Opens a socket to 127.0.0.1:`port` as `device` would (TLS with its
    /// own certificate in certificate mode) and writes `connect`; the
    /// CONNACK, or why there is none.
    pub async fn try_connect(
        &self,
        port: u16,
        device: &str,
        connect: rumqttc::Connect,
    ) -> Result<(RawMqtt, rumqttc::ConnAck), String> {
        let stream: Box<dyn super::raw_mqtt::RawStream> = match &self.pki {
            None => {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .map_err(|e| format!("tcp connect: {e}"))?;
                let _ = tcp.set_nodelay(true);
                Box::new(tcp)
            }
            Some(pki) => {
                let issued = {
                    let mut certs = self.certs.lock().unwrap_or_else(|e| e.into_inner());
                    certs
                        .entry(device.to_string())
                        .or_insert_with(|| pki.client(device))
                        .clone()
                };
                Box::new(tls_stream(port, pki.client_config(Some(&issued))).await?)
            }
        };
        RawMqtt::try_connect_packet(stream, connect).await
    }

    /// [`Access::try_connect`] that insists on CONNACK 0.
    pub async fn connect(&self, port: u16, device: &str, connect: rumqttc::Connect) -> RawMqtt {
        let (raw, ack) = self
            .try_connect(port, device, connect)
            .await
            .unwrap_or_else(|e| panic!("{device} ({:?}): {e}", self.mode));
        assert_eq!(
            ack.code,
            rumqttc::ConnectReturnCode::Success,
            "{device} ({:?}) refused",
            self.mode
        );
        raw
    }
}
