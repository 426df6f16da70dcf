//! Device authentication in embedded mode: a password file of
//! `device:hash` lines, the hash an argon2id PHC string.
//!
//! - A CONNECT is accepted only when its client id equals its username and
//!   the password matches that device's line. Anything else is refused
//!   with a CONNACK (4, bad username or password; 5, not authorized, for a
//!   client id that is not the username), logged with the client id and
//!   the peer's address, and counted ([`REFUSED`]).
//! - argon2 is slow on purpose (tens of milliseconds of CPU), so a
//!   reconnect storm of thousands of devices, or a stranger guessing, must
//!   not take the box's cores: verifications run on the blocking pool, at
//!   most [`VERIFY_SLOTS`] at once, and a password already verified for a
//!   device (same line in the file) is recognised by a keyed digest
//!   instead. A connect waiting longer than the connect timeout for a slot
//!   is refused (CONNACK 3, server unavailable) and tries again.
//! - An unknown device costs the same verification as a wrong password, so
//!   the time of a refusal does not tell which devices exist.
//! - [`Authenticator::reload`] re-reads the file (on SIGHUP) without
//!   touching connected devices: a new or changed line applies from the
//!   next CONNECT. A file that does not parse leaves the previous one in
//!   force.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use argon2::password_hash::rand_core::{OsRng, RngCore};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use rumqttd::protocol::ConnectReturnCode;
use rumqttd::{ConnectHook, ConnectInfo};
use tokio::sync::Semaphore;
use tracing::{info, warn};

use crate::ids::DeviceId;

/// CONNECTs refused by authentication, counted.
pub static REFUSED: AtomicU64 = AtomicU64::new(0);

/// argon2 verifications running at once, at most: one core stays free for
/// the pipeline on a two-core box.
const VERIFY_SLOTS: usize = 1;

/// A password file line that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: line {line}: {reason}")]
    Line {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

type Digest = [u8; 64];

/// Device → its PHC string, as read from a password file.
pub type Table = HashMap<DeviceId, String>;

/// Parses a password file: `device:hash` per line; blank lines and lines
/// starting with `#` are skipped. A device named twice is an error, so an
/// edit never leaves two passwords where one was meant.
pub fn parse(path: &Path, text: &str) -> Result<Table, FileError> {
    let mut table = Table::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |reason: String| FileError::Line {
            path: path.to_owned(),
            line: i + 1,
            reason,
        };
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((device, hash)) = line.split_once(':') else {
            return Err(bad("expected device:hash".into()));
        };
        let device = DeviceId::new(device).map_err(|e| bad(format!("device id: {e}")))?;
        let parsed = PasswordHash::new(hash).map_err(|e| {
            bad(format!(
                "not a PHC hash string ({e}); make it with `ferry passwd`"
            ))
        })?;
        if parsed.algorithm.as_str() != "argon2id" {
            return Err(bad(format!(
                "hash algorithm {} is not argon2id; make it with `ferry passwd`",
                parsed.algorithm
            )));
        }
        if table.insert(device.clone(), hash.to_owned()).is_some() {
            return Err(bad(format!("device {device} is named twice")));
        }
    }
    Ok(table)
}

/// Reads and parses a password file.
pub fn load(path: &Path) -> Result<Table, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &text)
}

/// An argon2id PHC string for `password`, with a fresh random salt and the
/// argon2 crate's default (OWASP) parameters.
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut OsRng);
    Ok(Argon2::default()
        .hash_password(password.as_bytes(), &salt)?
        .to_string())
}

/// `text` with `device`'s line set to `hash`: replaced where it was (other
/// lines and comments kept as they are), appended otherwise.
pub fn set_line(text: &str, device: &DeviceId, hash: &str) -> String {
    let new_line = format!("{device}:{hash}");
    let mut out = String::with_capacity(text.len() + new_line.len() + 1);
    let mut replaced = false;
    for line in text.lines() {
        let is_device = line
            .trim()
            .split_once(':')
            .is_some_and(|(d, _)| d == device.as_str() && !line.trim().starts_with('#'));
        if is_device {
            if !replaced {
                out.push_str(&new_line);
                out.push('\n');
                replaced = true;
            }
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !replaced {
        out.push_str(&new_line);
        out.push('\n');
    }
    out
}

/// Why a CONNECT was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NoCredentials,
    /// The client id is not the username: a device connects as itself.
    NotItself,
    UnknownDevice,
    WrongPassword,
    /// No verification slot within the connect timeout.
    Busy,
}

impl Refusal {
    fn code(self) -> ConnectReturnCode {
        match self {
            Refusal::NotItself => ConnectReturnCode::NotAuthorized,
            Refusal::Busy => ConnectReturnCode::ServiceUnavailable,
            _ => ConnectReturnCode::BadUserNamePassword,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::NoCredentials => "no username or password",
            Refusal::NotItself => "client id is not the username",
            Refusal::UnknownDevice => "unknown device",
            Refusal::WrongPassword => "wrong password",
            Refusal::Busy => "too many connects being verified",
        })
    }
}

/// Checks CONNECTs against a password file; shared by every connection.
pub struct Authenticator {
    path: PathBuf,
    table: RwLock<Arc<Table>>,
    /// Device → (its hash line, keyed digest of the password that matched
    /// it): a reconnect with the same password skips argon2.
    verified: Mutex<HashMap<DeviceId, (String, Digest)>>,
    /// Key of those digests, random per process.
    key: [u8; 32],
    slots: Semaphore,
    /// Verified instead of an unknown device, so both take as long.
    decoy: String,
    wait: Duration,
}

impl Authenticator {
    /// Loads `path`; a connect waits at most `wait` for a verification slot.
    pub fn load(path: &Path, wait: Duration) -> Result<Arc<Authenticator>, FileError> {
        let table = load(path)?;
        let mut key = [0u8; 32];
        OsRng.fill_bytes(&mut key);
        let mut decoy = [0u8; 16];
        OsRng.fill_bytes(&mut decoy);
        let decoy = hash_password(&format!("{decoy:?}")).map_err(|e| FileError::Line {
            path: path.to_owned(),
            line: 0,
            reason: format!("cannot make a hash: {e}"),
        })?;
        Ok(Arc::new(Authenticator {
            path: path.to_owned(),
            table: RwLock::new(Arc::new(table)),
            verified: Mutex::new(HashMap::new()),
            key,
            slots: Semaphore::new(VERIFY_SLOTS),
            decoy,
            wait,
        }))
    }

    /// Re-reads the file: the devices it names from now on. On an error the
    /// previous table stays. Connected devices are not touched.
    pub fn reload(&self) -> Result<usize, FileError> {
        let table = load(&self.path)?;
        let devices = table.len();
        // Forget verified passwords whose line changed or went.
        self.verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|device, (hash, _)| table.get(device) == Some(hash));
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        Ok(devices)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Decides one CONNECT.
    pub async fn check(
        &self,
        client_id: &str,
        username: Option<&str>,
        password: Option<&str>,
    ) -> Result<(), Refusal> {
        let (Some(username), Some(password)) = (username, password) else {
            return Err(Refusal::NoCredentials);
        };
        if client_id != username {
            return Err(Refusal::NotItself);
        }
        let device = DeviceId::new(username).ok();
        let hash = device.as_ref().and_then(|d| {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            table.get(d).cloned()
        });
        let digest = self.digest(password);
        if let (Some(device), Some(hash)) = (&device, &hash) {
            let verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
            if verified.get(device) == Some(&(hash.clone(), digest)) {
                return Ok(());
            }
        }
        let known = hash.is_some();
        let hash = hash.unwrap_or_else(|| self.decoy.clone());
        let ok = self.verify(hash.clone(), password.to_owned()).await?;
        match (known, ok) {
            (true, true) => {
                if let Some(device) = device {
                    self.verified
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(device, (hash, digest));
                }
                Ok(())
            }
            (true, false) => Err(Refusal::WrongPassword),
            (false, _) => Err(Refusal::UnknownDevice),
        }
    }

    /// argon2 on the blocking pool, in one of the slots.
    async fn verify(&self, hash: String, password: String) -> Result<bool, Refusal> {
        let permit = tokio::time::timeout(self.wait, self.slots.acquire())
            .await
            .map_err(|_| Refusal::Busy)?
            .map_err(|_| Refusal::Busy)?;
        let ok = tokio::task::spawn_blocking(move || {
            PasswordHash::new(&hash).is_ok_and(|parsed| {
                Argon2::default()
                    .verify_password(password.as_bytes(), &parsed)
                    .is_ok()
            })
        })
        .await
        .unwrap_or(false);
        drop(permit);
        Ok(ok)
    }

    /// A keyed digest of a password, to recognise one verified before
    /// without keeping the password; the key is random per process.
    fn digest(&self, password: &str) -> Digest {
        use blake2::Digest as _;
        let mut h = blake2::Blake2b512::new();
        h.update(self.key);
        h.update(password.as_bytes());
        h.finalize().into()
    }

    /// The broker's connect hook: decides, logs and counts each refusal.
    pub fn hook(self: &Arc<Self>) -> ConnectHook {
        let auth = self.clone();
        Arc::new(move |info: ConnectInfo| {
            let auth = auth.clone();
            Box::pin(async move {
                let result = auth
                    .check(
                        &info.client_id,
                        info.username.as_deref(),
                        info.password.as_deref(),
                    )
                    .await;
                if let Err(refusal) = result {
                    REFUSED.fetch_add(1, Ordering::Relaxed);
                    refused(&info.client_id, info.peer, refusal);
                }
                result.map_err(Refusal::code)
            })
        })
    }
}

fn refused(client_id: &str, peer: SocketAddr, reason: Refusal) {
    warn!(client_id, %peer, %reason, "device refused");
}

/// Answers every SIGHUP until the runtime ends: re-reads the password file
/// when there is one. Without a handler SIGHUP would end the process, and
/// `systemctl reload` sends it.
pub fn reload_on_hangup(auth: Option<Arc<Authenticator>>) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            warn!("cannot listen for SIGHUP: the password file is read at start only");
            return;
        };
        while hangups.recv().await.is_some() {
            let Some(auth) = &auth else {
                info!("SIGHUP: nothing to reload (south.auth is not \"password\")");
                continue;
            };
            match auth.reload() {
                Ok(devices) => info!(
                    file = %auth.path().display(),
                    devices,
                    "password file reloaded"
                ),
                Err(e) => tracing::error!(
                    error = %e,
                    "password file not reloaded; the previous one stays in force"
                ),
            }
        }
    });
}

#[cfg(test)]
mod tests;
