//! The upstream broker: a real Mosquitto on 127.0.0.1 in its own temp dir,
//! one per test, killed on drop (its log tail printed if the test failed).

use std::fs::{self, OpenOptions};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::proc::{kill_and_reap, signal, wait_exit};
use super::{blocking, file_tail, free_port, port_accepts};

/// How long `Mosquitto::start` waits for its listener.
const MOSQUITTO_START_TIMEOUT: Duration = Duration::from_secs(10);

fn mosquitto_binary() -> PathBuf {
    let fixed = PathBuf::from("/usr/sbin/mosquitto");
    if fixed.is_file() {
        return fixed;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("mosquitto");
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "mosquitto not found: install it with `apt-get install -y mosquitto` \
         (or run `bash .ci/run`, which does)"
    );
}

/// ferry's user on a site broker ([`Mosquitto::start_site`]).
pub const SITE_USER: &str = "ferry";
pub const SITE_PASSWORD: &str = "ferry-site-secret";
/// The site broker's ACL: docs/EXTERNAL.md's, word for word.
pub const SITE_ACL: &str = "\
user ferry
topic read devices/+/up/#
topic read devices/+/confirm
topic read devices/+/pull
topic read devices/+/read
topic read devices/+/nack
topic read devices/+/status
topic write devices/+/ack
topic write devices/+/inbox
topic read plant/#
topic read spBv1.0/#

pattern write devices/%c/up/#
pattern write devices/%c/confirm
pattern write devices/%c/pull
pattern write devices/%c/read
pattern write devices/%c/nack
pattern write devices/%c/status
pattern read devices/%c/ack
pattern read devices/%c/inbox
pattern write plant/+/%c/#
pattern write spBv1.0/+/+/%c
pattern write spBv1.0/+/+/%c/+
";

/// A TLS listener a broker opens beside its plain one (the harness and
/// the backend keep using the plain port).
#[derive(Clone, Debug)]
pub struct TlsListener {
    /// CA file for client certificates (Mosquitto's `cafile`).
    pub ca: PathBuf,
    /// The broker's certificate and key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Clients must present a certificate the CA issued.
    pub require_certificate: bool,
}

impl TlsListener {
    fn lines(&self, port: u16) -> Vec<String> {
        vec![
            format!("listener {port} 127.0.0.1"),
            format!("cafile {}", self.ca.display()),
            format!("certfile {}", self.cert.display()),
            format!("keyfile {}", self.key.display()),
            format!("require_certificate {}", self.require_certificate),
        ]
    }
}

/// A Mosquitto broker on 127.0.0.1 in its own temp dir; killed on drop.
pub struct Mosquitto {
    pub port: u16,
    /// The TLS listener's port, when it has one.
    pub tls_port: Option<u16>,
    binary: PathBuf,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Mosquitto {
    /// Starts a broker on a free port.
    pub fn start() -> Mosquitto {
        Mosquitto::start_on(free_port())
    }

    /// Starts a broker on a free port with extra config lines.
    pub fn start_with(extra: &[&str]) -> Mosquitto {
        Mosquitto::start_configured(free_port(), extra)
    }

    /// Starts a broker on a free port with persistence on (in its own
    /// directory) and extra config lines, e.g. a bridge's `connection`.
    pub fn start_persistent_with(extra: &[&str]) -> Mosquitto {
        Mosquitto::start_in(free_port(), true, None, |_| {
            extra.iter().map(|l| l.to_string()).collect()
        })
    }

    /// Starts a broker on `port`.
    pub fn start_on(port: u16) -> Mosquitto {
        Mosquitto::start_configured(port, &[])
    }

    fn start_configured(port: u16, extra: &[&str]) -> Mosquitto {
        Mosquitto::start_in(port, false, None, |_| {
            extra.iter().map(|l| l.to_string()).collect()
        })
    }

    /// Starts a broker on a free port with a TLS listener on another.
    pub fn start_tls(tls: &TlsListener) -> Mosquitto {
        Mosquitto::start_in(free_port(), false, Some(tls), |_| Vec::new())
    }

    /// A site broker for external mode, as docs/EXTERNAL.md sets one up:
    /// persistence on, no queue limit, 200 in flight, ferry a user (`SITE_USER`) in a
    /// password file with read on every device topic and write on receipts
    /// and inboxes, and devices (anonymous here) held to their own topics
    /// by `pattern` lines on their client id.
    pub fn start_site() -> Mosquitto {
        Mosquitto::start_site_with(None, &[])
    }

    /// [`Mosquitto::start_site`], with a TLS listener if `tls` is given,
    /// and with `devices` as EXTERNAL.md has it in full: every device a
    /// user in the password file (device id, password), no anonymous
    /// clients, and the username as the client id, so a device cannot
    /// claim another's id.
    pub fn start_site_with(tls: Option<&TlsListener>, devices: &[(String, String)]) -> Mosquitto {
        Mosquitto::start_in(free_port(), true, tls, |dir| {
            let passwd = dir.join("passwd");
            let users = std::iter::once((SITE_USER, SITE_PASSWORD))
                .chain(devices.iter().map(|(d, p)| (d.as_str(), p.as_str())));
            for (i, (user, password)) in users.enumerate() {
                let mut cmd = std::process::Command::new("mosquitto_passwd");
                if i == 0 {
                    cmd.arg("-c");
                }
                let made = cmd
                    .arg("-b")
                    .arg(&passwd)
                    .arg(user)
                    .arg(password)
                    .status()
                    .unwrap_or_else(|e| {
                        panic!("mosquitto_passwd ({e}): install Mosquitto with `apt-get install -y mosquitto`")
                    });
                assert!(made.success(), "mosquitto_passwd failed: {made}");
            }
            let acl = dir.join("acl");
            fs::write(&acl, SITE_ACL).expect("write acl");
            let mut lines = vec![
                format!("password_file {}", passwd.display()),
                format!("acl_file {}", acl.display()),
                // EXTERNAL.md's window (the last setting wins). Unlimited,
                // the broker writes ferry's whole backlog ahead of the
                // SUBACK after a restart, and ferry is not ready until it
                // has taken all of it.
                "max_inflight_messages 200".into(),
            ];
            if !devices.is_empty() {
                lines.push("allow_anonymous false".into());
                lines.push("use_username_as_clientid true".into());
            }
            lines
        })
    }

    /// Starts a broker on `port`; `extra` adds config lines, given the
    /// broker's own directory.
    fn start_in(
        port: u16,
        persistent: bool,
        tls: Option<&TlsListener>,
        extra: impl FnOnce(&std::path::Path) -> Vec<String>,
    ) -> Mosquitto {
        let binary = mosquitto_binary();
        let dir = tempfile::Builder::new()
            .prefix("ferry-mosquitto-")
            .tempdir()
            .expect("temp dir for mosquitto");
        let log = dir.path().join("mosquitto.log");
        let mut extra = extra(dir.path());
        // Listener options follow their `listener` line: the TLS one last.
        let tls_port = tls.map(|tls| {
            let tls_port = free_port();
            extra.extend(tls.lines(tls_port));
            tls_port
        });
        let persistence = if persistent {
            format!(
                "persistence true\npersistence_location {}/\n",
                dir.path().display()
            )
        } else {
            "persistence false\n".to_string()
        };
        let config = format!(
            "listener {port} 127.0.0.1\n\
             {anonymous}\
             max_queued_messages 0\n\
             max_inflight_messages 0\n\
             set_tcp_nodelay true\n\
             {persistence}\
             user root\n\
             log_dest file {log}\n\
             log_type error\n\
             log_type warning\n\
             log_type notice\n\
             log_type information\n\
             connection_messages true\n{extra}",
            log = log.display(),
            extra = extra.iter().map(|l| format!("{l}\n")).collect::<String>(),
            anonymous = if extra.iter().any(|l| l.starts_with("allow_anonymous")) {
                ""
            } else {
                "allow_anonymous true\n"
            },
        );
        fs::write(dir.path().join("mosquitto.conf"), config).expect("write mosquitto.conf");
        let mut m = Mosquitto {
            port,
            tls_port,
            binary,
            dir,
            child: None,
        };
        m.spawn();
        m
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("mosquitto.log")
    }

    pub fn log_tail(&self) -> String {
        file_tail(&self.log_path(), 40)
    }

    fn spawn(&mut self) {
        let conf = self.dir.path().join("mosquitto.conf");
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("mosquitto.stderr"))
            .expect("open mosquitto.stderr");
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn mosquitto");
        self.child = Some(child);
        let port = self.port;
        let tls_port = self.tls_port;
        let started = Instant::now();
        blocking(|| loop {
            if port_accepts(port) && tls_port.is_none_or(port_accepts) {
                return;
            }
            let child = self.child.as_mut().expect("child");
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "mosquitto on port {port} exited with {status} before listening\n\
                     --- stderr ---\n{}\n--- log ---\n{}",
                    file_tail(&self.dir.path().join("mosquitto.stderr"), 20),
                    self.log_tail()
                );
            }
            if started.elapsed() > MOSQUITTO_START_TIMEOUT {
                panic!(
                    "mosquitto on port {port} not listening after {MOSQUITTO_START_TIMEOUT:?}\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        });
    }

    /// SIGTERM, then waits for it to exit (SIGKILL after 5 s).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&child, libc::SIGTERM);
            blocking(|| {
                if !wait_exit(&mut child, Duration::from_secs(5)) {
                    kill_and_reap(&mut child);
                }
            });
        }
    }

    /// SIGKILL, as a crash or a pulled plug: its clients get no clean
    /// close, and it forgets what it held.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            blocking(|| kill_and_reap(&mut child));
        }
    }

    /// Starts it again on the same port (stopping it first if it runs).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// The broker's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
        if std::thread::panicking() {
            eprintln!(
                "--- mosquitto (port {}) log tail ---\n{}",
                self.port,
                self.log_tail()
            );
        }
    }
}
