//! Device authentication in embedded mode, against a password file of
//! `device:hash` lines (its format: [`crate::config::passwords`]).
//!
//! - A CONNECT is accepted only when its client id equals its username and
//!   the password matches that device's line. Anything else is refused
//!   with a CONNACK (4, bad username or password; 5, not authorized, for a
//!   client id that is not the username), logged with the client id and
//!   the peer's address, and counted (`ferry_devices_refused_total`) by the
//!   broker's connect hook (`admission.rs`).
//! - argon2 is slow on purpose (~20 ms of CPU and 19 MiB per check), so a
//!   reconnect storm of thousands of devices, or a stranger guessing, must
//!   not take the pipeline's CPU or the box's memory: verifications run on
//!   threads of their own at a lower priority ([`Verifier`]), at most
//!   [`VERIFY_QUEUE`] waiting, and a password already verified for a device (same line in
//!   the file) is recognised by a keyed digest instead. A connect that
//!   finds the queue full, or waits longer than the connect timeout, is
//!   refused (CONNACK 3, server unavailable) and tries again; one that gave
//!   up is not verified at all.
//! - An unknown device costs the same verification as a wrong password, so
//!   the time of a refusal does not tell which devices exist.
//! - [`Authenticator::reload`] re-reads the file (on SIGHUP) without
//!   touching connected devices: a new or changed line applies from the
//!   next CONNECT. A file that does not parse leaves the previous one in
//!   force.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use argon2::password_hash::rand_core::{OsRng, RngCore};
use rumqttd::protocol::ConnectReturnCode;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use crate::config::passwords::{self, hash_password, verify_in, FileError, Table};
use crate::ids::DeviceId;

/// Verifications waiting for the verifier threads, at most: ~2 s of work
/// for one core.
const VERIFY_QUEUE: usize = 100;

/// One argon2 check for the verifier thread, and where its answer goes.
struct Check {
    hash: String,
    password: String,
    answer: oneshot::Sender<bool>,
}

/// The threads that run argon2, one per core, each one check at a time,
/// at a lower scheduling priority (nice 10) than the rest of ferry: a
/// reconnect storm is verified on every core the pipeline leaves idle, and
/// a crowd guessing passwords cannot take CPU from the pipeline. Each
/// thread keeps the 19 MiB a check needs in its own allocator arena (checks
/// spread over the blocking pool's threads kept 19 MiB in each: 270 MiB
/// after a storm of 600 devices).
#[derive(Clone)]
struct Verifier {
    queue: mpsc::Sender<Check>,
}

impl Verifier {
    /// `threads` verifier threads (one per core in the gateway).
    fn start(threads: usize) -> Verifier {
        let (queue, checks) = mpsc::channel::<Check>(VERIFY_QUEUE);
        let checks = Arc::new(Mutex::new(checks));
        for i in 0..threads {
            let checks = checks.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("ferry-auth-{i}"))
                .spawn(move || verify_checks(&checks));
            if let Err(e) = spawned {
                // With none running, every check is refused as busy.
                tracing::error!(event = "password_verifier_failed", error = %e, "cannot start a password verifier thread");
            }
        }
        Verifier { queue }
    }
}

/// Warns when the file holds Mosquitto `$6$` hashes (taken, but weak).
fn say_weak(path: &Path, table: &Table) {
    let weak = passwords::weak(table);
    if weak > 0 {
        tracing::warn!(event = "password_hashes_weak", path = %path.display(), devices = weak, "password file has Mosquitto $6$ hashes (one SHA-512 round, cheap to crack if the file leaks); set those passwords again with `ferry passwd` to store argon2id");
    }
}

/// A verifier thread: checks until the authenticator is gone.
fn verify_checks(checks: &Mutex<mpsc::Receiver<Check>>) {
    lower_priority();
    // The thread's argon2 memory, reused by every check it runs.
    let mut blocks = Vec::new();
    loop {
        let check = checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .blocking_recv();
        let Some(check) = check else { return };
        // The connection gave up waiting: not worth 20 ms.
        if check.answer.is_closed() {
            continue;
        }
        let ok = verify_in(&mut blocks, check.password.as_bytes(), &check.hash);
        let _ = check.answer.send(ok);
    }
}

/// nice 10 for the calling thread (Linux: a thread's own priority).
fn lower_priority() {
    // SAFETY: setpriority on this thread's own id; no memory is involved.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
    if rc != 0 {
        tracing::debug!("password verifier runs at normal priority (setpriority failed)");
    }
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
    pub(super) fn code(self) -> ConnectReturnCode {
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

type Digest = [u8; 64];

/// What an unknown device's password is checked against, so that a
/// refusal takes as long as a known device's check: a line of the kind
/// most lines in `table` are (argon2id with the same parameters, `$6$`,
/// `$7$` with the same rounds: a hash less its salt and digest), or
/// `argon2` when the table is empty. Checking a real line is harmless:
/// an unknown device is refused whatever the check says.
fn decoy_of(table: &passwords::Table, argon2: &str) -> String {
    let kind = |hash: &str| -> String {
        let parts: Vec<&str> = hash.split('$').collect();
        parts[..parts.len().saturating_sub(2)].join("$")
    };
    let mut counts: HashMap<String, (usize, &String)> = HashMap::new();
    for hash in table.values() {
        counts.entry(kind(hash)).or_insert((0, hash)).0 += 1;
    }
    counts
        .into_values()
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map_or_else(|| argon2.to_string(), |(_, hash)| hash.clone())
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
    verifier: Verifier,
    /// Verified instead of an unknown device, so both take as long: a
    /// line of the file's most common kind ([`decoy_of`]), or a random
    /// argon2id hash for an empty file.
    decoy: RwLock<String>,
    /// That random argon2id hash.
    argon2_decoy: String,
    wait: Duration,
}

impl Authenticator {
    /// Loads `path`; a connect waits at most `wait` for a verification slot.
    pub fn load(path: &Path, wait: Duration) -> Result<Arc<Authenticator>, FileError> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Authenticator::load_with(path, wait, threads)
    }

    /// [`Authenticator::load`] with `threads` verifier threads.
    fn load_with(
        path: &Path,
        wait: Duration,
        threads: usize,
    ) -> Result<Arc<Authenticator>, FileError> {
        let table = passwords::load(path)?;
        say_weak(path, &table);
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
            decoy: RwLock::new(decoy_of(&table, &decoy)),
            argon2_decoy: decoy,
            table: RwLock::new(Arc::new(table)),
            verified: Mutex::new(HashMap::new()),
            key,
            verifier: Verifier::start(threads),
            wait,
        }))
    }

    /// Re-reads the file: the devices it names from now on. On an error the
    /// previous table stays. Connected devices are not touched.
    pub fn reload(&self) -> Result<usize, FileError> {
        let table = passwords::load(&self.path)?;
        say_weak(&self.path, &table);
        let devices = table.len();
        // Forget verified passwords whose line changed or went.
        self.verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|device, (hash, _)| table.get(device) == Some(hash));
        *self.decoy.write().unwrap_or_else(|e| e.into_inner()) =
            decoy_of(&table, &self.argon2_decoy);
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
        let hash =
            hash.unwrap_or_else(|| self.decoy.read().unwrap_or_else(|e| e.into_inner()).clone());
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

    /// argon2 on the verifier thread: refused as busy when its queue is
    /// full or the answer takes longer than the connect timeout.
    async fn verify(&self, hash: String, password: String) -> Result<bool, Refusal> {
        let (answer, answered) = oneshot::channel();
        let check = Check {
            hash,
            password,
            answer,
        };
        self.verifier
            .queue
            .try_send(check)
            .map_err(|_| Refusal::Busy)?;
        match tokio::time::timeout(self.wait, answered).await {
            Ok(Ok(ok)) => Ok(ok),
            _ => Err(Refusal::Busy),
        }
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
}

/// Answers every SIGHUP until the runtime ends: re-reads the password file
/// when there is one. `systemctl reload` sends it. `seen`: SIGHUPs counted
/// ([`crate::signals::hangups`]) before the file was read; one that came
/// after, before this listens, is applied at once.
pub fn reload_on_hangup(auth: Option<Arc<Authenticator>>, seen: u64) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            warn!(
                event = "reload_unavailable",
                "cannot listen for SIGHUP: the password file is read at start only"
            );
            return;
        };
        // Listening now; what came since the file was read is applied once.
        let mut early = crate::signals::hangups() > seen;
        loop {
            if !std::mem::take(&mut early) && hangups.recv().await.is_none() {
                return;
            }
            let Some(auth) = &auth else {
                info!(
                    event = "reload_skipped",
                    "SIGHUP: nothing to reload (south.auth is not \"password\")"
                );
                continue;
            };
            match auth.reload() {
                Ok(devices) => info!(
                    event = "password_file_reloaded",
                    file = %auth.path().display(),
                    devices,
                    "password file reloaded"
                ),
                Err(e) => tracing::error!(
                    event = "password_file_reload_failed",
                    error = %e,
                    "password file not reloaded; the previous one stays in force"
                ),
            }
        }
    });
}

#[cfg(test)]
mod tests;
