//! The gateway under test: the real `ferry` binary in its own temp dir,
//! started on a [`FerryOpts`] config, and read-only access to its store.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry::config::RawConfig;

use super::config::{to_toml, FerryOpts};
use super::mosquitto::{Mosquitto, SITE_PASSWORD, SITE_USER};
use super::proc::{kill_and_reap, signal, wait_exit};
use super::Mode;
use super::{blocking, file_tail, free_port, port_accepts};

/// How long `Ferry::start` waits for the south listener, unless the
/// test set [`Ferry::start_timeout`].
const FERRY_START_TIMEOUT: Duration = Duration::from_secs(20);

/// Path of the binary under test.
pub fn ferry_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ferry"))
}

/// A `ferry` command with no `FERRY_*` overrides leaking in from outside.
pub fn ferry_command() -> Command {
    command_of(&ferry_binary())
}

/// [`ferry_command`] running `binary` (a copy of ferry under another name).
fn command_of(binary: &Path) -> Command {
    let mut cmd = Command::new(binary);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("FERRY_") {
            cmd.env_remove(key);
        }
    }
    cmd.env("RUST_BACKTRACE", "1").env("NO_COLOR", "1");
    cmd
}

/// Runs `ferry {command} --config FILE` (`check-config` or `run`) on a file
/// holding `contents`, in a temp dir; returns (exit code, stderr). For
/// configs that are refused: `run` on a valid one would not return.
pub fn run_on_config(command: &str, contents: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = super::write_file(dir.path(), "ferry.toml", contents);
    let out = ferry_command()
        .arg(command)
        .arg("--config")
        .arg(&path)
        .current_dir(dir.path())
        .output()
        .unwrap_or_else(|e| panic!("run ferry {command}: {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ferry check-config` on `contents`: (exit code, stderr).
pub fn check_config(contents: &str) -> (Option<i32>, String) {
    run_on_config("check-config", contents)
}

/// How `child` exited within `timeout`; `None` if it still ran (it is then
/// killed).
fn exit_status_within(mut child: Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    blocking(|| {
        if wait_exit(&mut child, timeout) {
            child.try_wait().ok().flatten()
        } else {
            kill_and_reap(&mut child);
            None
        }
    })
}

/// The real gateway binary in its own temp dir; SIGKILLed on drop.
pub struct Ferry {
    /// Where devices connect: ferry's own broker, or the site broker.
    pub south_port: u16,
    /// The admin HTTP server's port (`None`: turned off).
    pub admin_port: Option<u16>,
    pub mode: Mode,
    /// External mode: the site broker devices connect to (it outlives
    /// ferry's restarts, as a site's broker does).
    pub site: Option<Mosquitto>,
    pub data_dir: PathBuf,
    pub gateway: String,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    /// The config it runs on, as written to `config_path`.
    pub config: RawConfig,
    /// How long a restart may take until devices are served (the fault
    /// runs allow more: behind a site broker's deep backlog, ferry's
    /// subscription is granted only after the backlog is handed over).
    pub start_timeout: Duration,
    /// How long the last start or restart took until devices were served.
    pub last_start: Duration,
    env: Vec<(String, String)>,
    /// What `ferry run` runs: the binary under test, or a copy of it.
    binary: PathBuf,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Ferry {
    /// [`Ferry::start`] in south mode `mode`.
    pub fn start_in(mode: Mode, opts: FerryOpts) -> Ferry {
        Ferry::start(opts.in_mode(mode))
    }

    /// Writes the config and starts `ferry run`; returns once devices can
    /// be served (the south listener accepts TCP, or ferry subscribed on
    /// the site broker).
    pub fn start(opts: FerryOpts) -> Ferry {
        let dir = tempfile::Builder::new()
            .prefix("ferry-gw-")
            .tempdir()
            .expect("temp dir for ferry");
        let mut config = opts.config;
        let (south_port, site) = match opts.mode {
            Mode::Embedded => {
                let port = embedded_ports(&mut config);
                if !opts.logins.is_empty() {
                    config.south.auth = "password".into();
                    config.south.password_file = "passwd".into();
                }
                (port, None)
            }
            Mode::External => {
                let site = Mosquitto::start_site_with(opts.site_tls.as_ref(), &opts.logins);
                for (device, password) in &opts.logins {
                    super::session::register_login(site.port, device, password);
                }
                config.south.mode = "external".into();
                config.south.host = "127.0.0.1".into();
                config.south.port = site.tls_port.unwrap_or(site.port);
                config.south.username = SITE_USER.into();
                config.south.password = SITE_PASSWORD.into();
                (site.port, Some(site))
            }
        };
        // Port 0: a free one, the same across restarts.
        let admin_port = match config.admin.listen.strip_suffix(":0") {
            Some(host) => {
                // Not the south port: both were free when picked, and
                // neither is bound until ferry starts.
                let port = std::iter::repeat_with(free_port)
                    .find(|p| *p != south_port)
                    .expect("a free port");
                config.admin.listen = format!("{host}:{port}");
                Some(port)
            }
            None => config
                .admin
                .listen
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse().ok()),
        };
        // An absolute data_dir (a test's own disk) stays as it is.
        config.gateway.data_dir = dir.path().join(&config.gateway.data_dir);
        if !config.south.password_file.as_os_str().is_empty() {
            config.south.password_file = dir.path().join(&config.south.password_file);
            let mut text = String::new();
            for (device, password) in &opts.logins {
                let device = ferry::ids::DeviceId::new(device.as_str()).expect("device id");
                let hash = ferry::config::passwords::hash_password(password).expect("hash");
                text = ferry::config::passwords::set_line(&text, &device, &hash);
                super::session::register_login(south_port, device.as_str(), password);
            }
            // A file the test wrote itself, with no logins given, stays.
            if !opts.logins.is_empty() || !config.south.password_file.exists() {
                fs::write(&config.south.password_file, text).expect("write the password file");
            }
        }
        let config_path = dir.path().join("ferry.toml");
        fs::write(&config_path, to_toml(&config)).expect("write ferry.toml");
        let mut ferry = Ferry {
            south_port,
            admin_port,
            mode: opts.mode,
            site,
            data_dir: config.gateway.data_dir.clone(),
            gateway: config.gateway.id.clone(),
            log_path: dir.path().join("ferry.log"),
            config_path,
            config,
            env: opts.env,
            binary: opts.binary.unwrap_or_else(ferry_binary),
            dir,
            child: None,
            start_timeout: FERRY_START_TIMEOUT,
            last_start: Duration::ZERO,
        };
        // A port free when picked can be taken by another test's process
        // before ferry binds it: then ferry exits at once, and is started
        // again on another port.
        for _ in 0..4 {
            let ups_before = ferry.spawn_child();
            match ferry.try_wait_ready(ups_before) {
                Ok(()) => return ferry,
                Err(lost) => {
                    eprintln!("harness: a port was taken, trying others: {lost}");
                    let (south, admin) = (ferry.south_taken(), ferry.admin_taken());
                    if south {
                        let port = free_port();
                        ferry.south_port = port;
                        ferry.config.south.listen = format!("127.0.0.1:{port}");
                    }
                    if admin {
                        let south_port = ferry.south_port;
                        let port = std::iter::repeat_with(free_port)
                            .find(|p| *p != south_port)
                            .expect("a free port");
                        let listen = &mut ferry.config.admin.listen;
                        let host = listen.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
                        *listen = format!("{host}:{port}");
                        ferry.admin_port = Some(port);
                    }
                    fs::write(&ferry.config_path, to_toml(&ferry.config))
                        .expect("write ferry.toml");
                }
            }
        }
        panic!("ferry's ports were taken four times in a row");
    }
}

/// Free ports for the south: `south.listen`, or each of `south.listeners`
/// given as port 0 (the test reads them back from the config); the first
/// listener's port, which readiness is checked on.
fn embedded_ports(config: &mut RawConfig) -> u16 {
    if config.south.listeners.is_empty() {
        let port = free_port();
        config.south.listen = format!("127.0.0.1:{port}");
        return port;
    }
    // Left at its default: south.listeners replaces it.
    config.south.listen = ferry::config::RawSouth::default().listen;
    for l in &mut config.south.listeners {
        if let Some(host) = l.listen.strip_suffix(":0") {
            l.listen = format!("{host}:{}", free_port());
        }
    }
    let first = &config.south.listeners[0].listen;
    first
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("south.listeners[0] has a port")
}

impl Ferry {
    /// Whether ferry's log says its south port was taken.
    fn south_taken(&self) -> bool {
        let port = self.south_port;
        self.mode == Mode::Embedded
            && self.log().contains(&format!(
                "south.listen 127.0.0.1:{port}: cannot listen: Address already in use"
            ))
    }

    /// Whether ferry's log says its admin port was taken.
    fn admin_taken(&self) -> bool {
        self.admin_port.is_some_and(|port| {
            let log = self.log();
            log.contains("admin.listen: cannot listen on")
                && log.contains(&format!(":{port}: Address already in use"))
        })
    }

    /// Whether devices can be served: the embedded listener accepts TCP,
    /// or (external mode) ferry subscribed on the site broker once more
    /// than `ups_before` times.
    ///
    /// Embedded, `ups_before` is the log's length at the spawn: the port
    /// must accept and ferry must have logged its start (`gateway_started`,
    /// INFO, which any log level that keeps `ferry::gateway`'s INFO shows)
    /// since: ferry binds the port before, so another process that took
    /// the port between `free_port` and ferry's bind is not taken for
    /// ferry.
    fn south_ready(&self, ups_before: usize) -> bool {
        match self.mode {
            Mode::Embedded => {
                port_accepts(self.south_port)
                    && self.log()[ups_before.min(self.log().len())..].contains("gateway_started")
            }
            Mode::External => south_ups(&self.log()) > ups_before,
        }
    }

    fn spawn(&mut self) {
        let ups_before = self.spawn_child();
        self.wait_ready(ups_before);
    }

    /// Starts it again (killing it first), sends it `sig` `after` it was
    /// spawned, while it starts, and waits for it to serve as
    /// [`Ferry::start`] does (panicking if the signal ended it).
    pub fn restart_signalled(&mut self, sig: libc::c_int, after: Duration) {
        self.kill();
        let ups_before = self.spawn_child();
        self.wait_own_code();
        std::thread::sleep(after);
        signal(self.child.as_ref().expect("child"), sig);
        self.wait_ready(ups_before);
    }

    /// Starts it again (killing it first), sends it `sig` `after` it was
    /// spawned, and waits up to `timeout` for it to exit: how it exited,
    /// `None` if it still ran (it is then killed).
    pub fn restart_until_exit(
        &mut self,
        sig: libc::c_int,
        after: Duration,
        timeout: Duration,
    ) -> Option<std::process::ExitStatus> {
        self.kill();
        self.spawn_child();
        self.wait_own_code();
        let child = self.child.take().expect("child");
        std::thread::sleep(after);
        signal(&child, sig);
        exit_status_within(child, timeout)
    }

    /// Waits until the spawned process runs its own first instruction: its
    /// constructor blocks SIGHUP (`/proc/PID/status`, `SigBlk`) or a handler
    /// catches it (`SigCgt`). Before that the kernel and the dynamic loader
    /// run (about a millisecond), where no program can handle a signal.
    /// Panics if it is seen with SIGHUP neither held nor caught after its
    /// store is open (`store_checked` logged): then SIGHUP was not held from
    /// the start. (Seeing it held with the store already open proves
    /// nothing either way: on a loaded machine this poller may first run
    /// after both.)
    fn wait_own_code(&self) {
        let log_before = self.log().len();
        let pid = self.pid().expect("spawned");
        let hup = 1u64 << (libc::SIGHUP - 1);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            // The log first: a store opened by then, with SIGHUP not held
            // after it, is the failure.
            let log = self.log();
            let store_open = log[log_before.min(log.len())..].contains("store_checked");
            let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let mask = |field: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(field))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                    .unwrap_or(0)
            };
            if (mask("SigBlk:") | mask("SigCgt:")) & hup != 0 {
                return;
            }
            assert!(
                !store_open,
                "ferry (pid {pid}) opened its store before it held SIGHUP"
            );
            std::thread::yield_now();
        }
        panic!("ferry (pid {pid}) never held or caught SIGHUP");
    }

    /// Spawns `ferry run`; what [`Ferry::south_ready`] compares with: how
    /// often the log said the south side was up before (external), or the
    /// log's length (embedded).
    fn spawn_child(&mut self) -> usize {
        let ups_before = match self.mode {
            Mode::Embedded => self.log().len(),
            Mode::External => south_ups(&self.log()),
        };
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open ferry.log");
        let _ = writeln!(log, "=== harness: starting ferry run ===");
        let child = command_of(&self.binary)
            .arg("run")
            .arg("--config")
            .arg(&self.config_path)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn ferry");
        self.child = Some(child);
        ups_before
    }

    /// Waits until devices can be served (see [`Ferry::south_ready`]).
    fn wait_ready(&mut self, ups_before: usize) {
        if let Err(lost) = self.try_wait_ready(ups_before) {
            panic!("{lost}");
        }
    }

    /// [`Ferry::wait_ready`]; `Err` if ferry exited because its south or
    /// admin port was taken meanwhile (by another test's process).
    fn try_wait_ready(&mut self, ups_before: usize) -> Result<(), String> {
        let port = self.south_port;
        let started = Instant::now();
        let limit = self.start_timeout;
        blocking(|| loop {
            if self.south_ready(ups_before) {
                self.last_start = started.elapsed();
                return Ok(());
            }
            let child = self.child.as_mut().expect("child");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                let lost = format!(
                    "ferry exited with {status} before its south port {port} accepted TCP\n\
                     --- ferry log tail ---\n{}",
                    self.log_tail()
                );
                if self.south_taken() || self.admin_taken() {
                    return Err(lost);
                }
                panic!("{lost}");
            }
            if started.elapsed() > limit {
                panic!(
                    "ferry's south side on port {port} was not ready within {limit:?}\n\
                     --- ferry log tail ---\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        })
    }

    /// SIGKILL and reap: no shutdown path runs.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            blocking(|| kill_and_reap(&mut child));
        }
    }

    /// SIGTERM, then waits up to `timeout` for a clean exit; true if it did.
    /// SIGTERM, then waits up to `timeout` for an exit: its status, or
    /// `None` if it was still running (it is then killed).
    pub fn terminate_status(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.take()?;
        signal(&child, libc::SIGTERM);
        exit_status_within(child, timeout)
    }

    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        signal(&child, libc::SIGTERM);
        blocking(|| {
            if wait_exit(&mut child, timeout) {
                true
            } else {
                kill_and_reap(&mut child);
                false
            }
        })
    }

    /// Waits up to `timeout` for ferry to exit on its own: how it exited,
    /// or `None` if it still runs (it is left running).
    pub fn exit_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        if !blocking(|| wait_exit(child, timeout)) {
            return None;
        }
        let status = child.try_wait().ok().flatten();
        self.child = None;
        status
    }

    /// Starts it again: same config, data dir and ports (killing it first).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts it again (killing it first) on its config as `change` leaves
    /// it; same data dir and ports.
    pub fn restart_with(&mut self, change: impl FnOnce(&mut RawConfig)) {
        change(&mut self.config);
        fs::write(&self.config_path, to_toml(&self.config)).expect("write ferry.toml");
        self.restart();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sets `device`'s password with `ferry passwd` on the gateway's
    /// password file (the password on stdin, as an operator pipes it), and
    /// lets the harness's clients log in with it. The running gateway
    /// sees it after [`Ferry::hangup`].
    pub fn passwd(&self, device: &str, password: &str) {
        let mut child = ferry_command()
            .arg("passwd")
            .arg(&self.config.south.password_file)
            .arg(device)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ferry passwd");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(format!("{password}\n").as_bytes())
            .expect("write the password");
        let out = blocking(|| child.wait_with_output()).expect("ferry passwd");
        assert!(
            out.status.success(),
            "ferry passwd {device}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        super::session::register_login(self.south_port, device, password);
    }

    /// Sends the gateway SIGHUP (what `systemctl reload ferry` does).
    pub fn hangup(&self) {
        signal(self.child.as_ref().expect("ferry is running"), libc::SIGHUP);
    }

    /// The store, opened read-only.
    pub fn db(&self) -> rusqlite::Connection {
        let path = self.data_dir.join("ferry.db");
        let conn = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .unwrap_or_else(|e| panic!("open {} read-only: {e}", path.display()));
        conn.busy_timeout(Duration::from_secs(5))
            .expect("set busy timeout");
        conn
    }

    /// One integer from a query on the store, e.g. a `COUNT(*)`.
    pub fn query_i64(&self, sql: &str, params: impl rusqlite::Params) -> i64 {
        self.db()
            .query_row(sql, params, |r| r.get(0))
            .unwrap_or_else(|e| panic!("query `{sql}`: {e}"))
    }

    pub fn log_tail(&self) -> String {
        file_tail(&self.log_path, 60)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Ferry {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
        if std::thread::panicking() {
            eprintln!(
                "--- ferry ({}, south port {}) log tail ---\n{}",
                self.gateway,
                self.south_port,
                self.log_tail()
            );
        }
    }
}

/// How often ferry's log says its external south session subscribed.
fn south_ups(log: &str) -> usize {
    log.matches("south link up").count()
}
