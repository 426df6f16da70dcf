//! The unit's sandbox against what the gateway really does: ferry runs as
//! an unprivileged user (as `User=ferry` runs it) under strace, through an
//! uplink with device passwords, its receipt, the admin server, a SIGHUP
//! and a SIGTERM, telling a notify socket as under systemd; every system
//! call it made must be one the unit's `SystemCallFilter=` lines allow (expanded by `systemd-analyze
//! syscall-filter`), every socket a family `RestrictAddressFamilies=`
//! allows, and no mapping writable and executable
//! (`MemoryDenyWriteExecute=`). This machine has no systemd as PID 1 to
//! start the unit, so this is how a filter that would kill ferry is caught.
//!
//! Needs root (to run ferry as another user), strace and systemd-analyze;
//! scripts/test.sh installs both.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{self, config::to_toml, Backend, Device, FerryOpts, Mosquitto};

/// The unprivileged user ferry runs as here (nobody).
const USER: u32 = 65534;

/// The syscall names `filter` (a `SystemCallFilter=` value's words: names
/// and @groups) stands for, the groups expanded by systemd-analyze.
fn expand(words: &[&str]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut todo: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    let mut seen = BTreeSet::new();
    // About 60 groups and 500 names: 10,000 steps is far beyond them.
    for _ in 0..10_000 {
        let Some(word) = todo.pop() else {
            return names;
        };
        if !word.starts_with('@') {
            names.insert(word);
            continue;
        }
        if !seen.insert(word.clone()) {
            continue;
        }
        let out = Command::new("systemd-analyze")
            .args(["syscall-filter", &word])
            .output()
            .unwrap_or_else(|e| {
                panic!("systemd-analyze ({e}): apt-get install systemd (scripts/test.sh does)")
            });
        assert!(
            out.status.success(),
            "systemd-analyze syscall-filter {word}"
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // "@group" on the first line, then indented names, @groups and
        // "# comments".
        for line in text.lines().skip(1) {
            let item = line.trim();
            if !item.is_empty() && !item.starts_with('#') {
                todo.push(item.to_string());
            }
        }
    }
    panic!("syscall groups nest deeper than expected: {todo:?}");
}

/// What the shipped unit allows: (syscalls, address families).
fn unit_allows() -> (BTreeSet<String>, Vec<String>) {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/systemd/ferry.service"
    ))
    .unwrap();
    let mut allowed = BTreeSet::new();
    let mut denied = BTreeSet::new();
    let mut families = Vec::new();
    for line in unit.lines() {
        if let Some(value) = line.strip_prefix("SystemCallFilter=") {
            match value.strip_prefix('~') {
                Some(deny) => denied.extend(expand(&deny.split_whitespace().collect::<Vec<_>>())),
                None => allowed.extend(expand(&value.split_whitespace().collect::<Vec<_>>())),
            }
        }
        if let Some(value) = line.strip_prefix("RestrictAddressFamilies=") {
            families.extend(value.split_whitespace().map(str::to_string));
        }
    }
    assert!(
        !allowed.is_empty(),
        "the unit has a SystemCallFilter= allow list"
    );
    assert!(
        !families.is_empty(),
        "the unit has RestrictAddressFamilies="
    );
    (&allowed - &denied, families)
}

/// Waits until `port` on 127.0.0.1 accepts TCP, or panics with the log.
fn wait_listening(port: u16, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "ferry under strace did not listen on {port}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// strace running ferry; both are killed if the test ends early.
struct Traced {
    strace: std::process::Child,
    /// ferry's data directory, where it writes its pid (`ferry.pid`).
    data: std::path::PathBuf,
}

impl Traced {
    /// ferry's pid, from its pid file, if that names a child of strace
    /// (strace also forks short-lived children of its own as it starts).
    fn ferry(&self) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.data.join("ferry.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let parent = status.lines().find_map(|l| l.strip_prefix("PPid:"))?;
        (parent.trim() == self.strace.id().to_string()).then_some(pid)
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.ferry().expect("ferry's pid file names strace's child");
        // SAFETY: a signal to the child this test started, by its pid.
        unsafe { libc::kill(pid, sig) };
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if matches!(self.strace.try_wait(), Ok(None)) {
            if let Some(pid) = self.ferry() {
                // SAFETY: as in `signal`.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = self.strace.kill();
            let _ = self.strace.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_makes_only_system_calls_and_sockets_the_units_sandbox_allows() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the sandbox test runs ferry as another user: run it as root"
    );
    let (allowed, families) = unit_allows();
    let gw = "gw-sandbox";
    let mq = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::os::unix::fs::chown(&data, Some(USER), Some(USER)).unwrap();

    let south = support::free_port();
    let admin = std::iter::repeat_with(support::free_port)
        .find(|p| *p != south)
        .unwrap();
    let mut config = FerryOpts::new(gw, mq.port).config;
    config.gateway.data_dir = data.clone();
    config.south.listen = format!("127.0.0.1:{south}");
    config.admin.listen = format!("127.0.0.1:{admin}");
    // Devices log in: the password verifier's thread (setpriority, argon2).
    let device_id = ferry::ids::DeviceId::new("sbx-1").unwrap();
    let hash = ferry::config::passwords::hash_password("pw-sbx").unwrap();
    let passwd = dir.path().join("passwd");
    std::fs::write(
        &passwd,
        ferry::config::passwords::set_line("", &device_id, &hash),
    )
    .unwrap();
    config.south.auth = "password".into();
    config.south.password_file = passwd;
    support::session::register_login(south, "sbx-1", "pw-sbx");
    let config_path = dir.path().join("ferry.toml");
    std::fs::write(&config_path, to_toml(&config)).unwrap();

    // As under systemd: READY=1, STATUS= and watchdog pings on a unix socket.
    let notify_path = dir.path().join("notify");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    std::fs::set_permissions(&notify_path, std::fs::Permissions::from_mode(0o777)).unwrap();
    notify.set_nonblocking(true).unwrap();

    // The binary is copied beside the config, where the user can reach
    // it: a checkout under a private directory (`mktemp -d` is 0700) would
    // leave the user unable to run it in place.
    let binary = dir.path().join("ferry");
    std::fs::copy(support::ferry_binary(), &binary).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();

    let trace = data.join("trace");
    let log = dir.path().join("ferry.log");
    let strace = Command::new("setpriv")
        .arg(format!("--reuid={USER}"))
        .arg(format!("--regid={USER}"))
        .arg("--clear-groups")
        .args(["strace", "-f", "-qq", "-o"])
        .arg(&trace)
        .arg(&binary)
        .args(["run", "--config"])
        .arg(&config_path)
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "1000000")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("setpriv/strace ({e}): apt-get install strace"));
    let mut traced = Traced {
        strace,
        data: data.clone(),
    };
    wait_listening(south, &log);
    assert!(
        traced.ferry().is_some(),
        "ferry.pid names ferry under strace"
    );

    let _backend = Backend::connect_auto_ack(mq.port, gw).await;
    let mut device = Device::connect(south, "sbx-1").await;
    device
        .publish_envelope("temp", "sbx-000001", json!({"c": 21.5}))
        .await;
    let got = device
        .receipts_until(Duration::from_secs(20), |all| {
            all.iter().any(|r| r["status"] == "delivered")
        })
        .await;
    assert!(
        got.iter().any(|r| r["status"] == "delivered"),
        "the uplink went north and back under strace: {got:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    for path in ["/metrics", "/", "/api/status"] {
        let (status, _) = support::admin::get(&format!("http://127.0.0.1:{admin}{path}"));
        assert_eq!(status, 200, "GET {path}");
    }
    // SIGHUP: the password file read again.
    traced.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("password_file_reloaded")
    {
        assert!(
            Instant::now() < deadline,
            "no reload after SIGHUP: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut said = String::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = notify.recv(&mut buf) {
        said.push_str(&String::from_utf8_lossy(&buf[..n]));
        said.push('\n');
    }
    assert!(
        said.contains("READY=1") && said.contains("WATCHDOG=1"),
        "ferry told the notify socket: {said}"
    );
    drop(device);
    traced.signal(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = traced.strace.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "ferry under strace did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "ferry exits 0 on SIGTERM: {status}");

    let trace = std::fs::read_to_string(&trace).unwrap();
    let mut used = BTreeSet::new();
    let mut bad = Vec::new();
    for line in trace.lines() {
        // "PID name(args) = result", or "PID <... name resumed>".
        let call = line
            .split_once(' ')
            .map(|(_, c)| c.trim_start())
            .unwrap_or("");
        let Some((name, args)) = call.split_once('(') else {
            continue;
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            continue;
        }
        used.insert(name.to_string());
        if name == "socket" {
            let family = args.split(',').next().unwrap_or("");
            if !families.iter().any(|f| f == family) {
                bad.push(format!("a socket outside RestrictAddressFamilies=: {line}"));
            }
        }
        let writable_exec = args.contains("PROT_EXEC")
            && (args.contains("PROT_WRITE") || name.contains("mprotect"));
        if writable_exec && (name.starts_with("mmap") || name.contains("mprotect")) {
            bad.push(format!("MemoryDenyWriteExecute= refuses: {line}"));
        }
    }
    assert!(used.len() > 30, "strace saw ferry's calls: {used:?}");
    for name in used.difference(&allowed) {
        bad.push(format!("SystemCallFilter= refuses {name}"));
    }
    assert!(
        bad.is_empty(),
        "the unit's sandbox would stop ferry:\n{}",
        bad.join("\n")
    );
}
