//! Runs a case of `paho_cases.py` (Debian's `/usr/bin/python3` with its
//! python3-paho-mqtt) or a stock Mosquitto client against a gateway, and
//! hands back what it printed. A case prints one JSON line of
//! observations at its end, and may stop halfway at a `{"sync": label}`
//! line until the test lets it go on ([`Case::wait_sync`],
//! [`Case::resume`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

#[cfg(feature = "system-tests")]
use serde_json::Value;
use tokio::sync::mpsc;

/// The interpreter: Debian's, whose dist-packages hold python3-paho-mqtt
/// (a pyenv or venv `python3` on PATH would not see it).
#[cfg(feature = "system-tests")]
const PYTHON: &str = "/usr/bin/python3";
#[cfg(feature = "system-tests")]
const PAHO: &str = "/usr/lib/python3/dist-packages/paho/mqtt/client.py";
/// Longest any one case runs; each is a few seconds at most.
#[cfg(feature = "system-tests")]
const CASE_TIMEOUT: Duration = Duration::from_secs(40);

#[cfg(feature = "system-tests")]
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/paho_cases.py")
}

/// Panics, saying how to get it, if paho-mqtt for `/usr/bin/python3` is
/// not installed.
#[cfg(feature = "system-tests")]
pub fn require_paho() {
    assert!(
        Path::new(PYTHON).is_file() && Path::new(PAHO).is_file(),
        "the conformance suite needs Debian's python3 with paho-mqtt ({PAHO} is missing): \
         install it with `apt-get install -y python3-paho-mqtt` (or run ./scripts/test.sh, \
         which does)"
    );
}

/// A stock Mosquitto client (`mosquitto_pub`, `_sub`, `_rr`): where the
/// broker's own package put it, or on PATH.
pub fn mosquitto_tool(name: &str) -> PathBuf {
    let fixed = Path::new("/usr/bin").join(name);
    if fixed.is_file() {
        return fixed;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found: install Debian's mosquitto-clients \
                 (`apt-get install -y mosquitto-clients`)"
            )
        })
}

/// One running case: a Paho case, or a stock client ([`Running`]).
pub struct Case {
    // Read by the Paho cases' own methods (the `system-tests` feature's).
    #[cfg_attr(not(feature = "system-tests"), allow(dead_code))]
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    #[cfg_attr(not(feature = "system-tests"), allow(dead_code))]
    stderr: std::thread::JoinHandle<String>,
}

impl Case {
    /// Starts `paho_cases.py CASE --port PORT --device DEVICE --version V`
    /// with `--param K=V` for each of `params`.
    #[cfg(feature = "system-tests")]
    pub fn start(
        case: &str,
        port: u16,
        device: &str,
        version: &str,
        params: &[(&str, &str)],
    ) -> Case {
        require_paho();
        let mut cmd = Command::new(PYTHON);
        cmd.arg(script()).arg(case).args([
            "--port",
            &port.to_string(),
            "--device",
            device,
            "--version",
            version,
        ]);
        for (k, v) in params {
            cmd.arg("--param").arg(format!("{k}={v}"));
        }
        // Debian's python, without what a pyenv or venv on PATH sets, and
        // leaving no __pycache__ in the source tree.
        cmd.env_remove("PYTHONPATH")
            .env_remove("PYTHONHOME")
            .env("PYTHONDONTWRITEBYTECODE", "1");
        Case::spawn(format!("{case} (MQTT {version}, {device})"), cmd)
    }

    fn spawn(name: String, mut cmd: Command) -> Case {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let (lines, stderr) = crate::support::proc::read_output(&mut child);
        Case {
            name,
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
        }
    }

    #[cfg(feature = "system-tests")]
    async fn next_line(&mut self) -> Option<String> {
        tokio::time::timeout(CASE_TIMEOUT, self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("{} printed nothing within {CASE_TIMEOUT:?}", self.name))
    }

    /// Waits for the case to reach `{"sync": label}`.
    #[cfg(feature = "system-tests")]
    pub async fn wait_sync(&mut self, label: &str) {
        let line = self.next_line().await;
        let got: Value = line
            .as_deref()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        if got["sync"] != label {
            let err = self.stderr_text();
            panic!(
                "{}: expected sync {label:?}, got {line:?}\n{err}",
                self.name
            );
        }
    }

    /// Lets a case stopped at a sync go on.
    #[cfg(feature = "system-tests")]
    pub fn resume(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin.write_all(b"go\n").expect("write to the case");
        stdin.flush().expect("flush");
    }

    /// The case's last line, parsed; panics with its stderr if it failed.
    #[cfg(feature = "system-tests")]
    pub async fn finish(mut self) -> Value {
        self.stdin = None;
        let mut last = None;
        while let Some(line) = self.next_line().await {
            last = Some(line);
        }
        let status = tokio::task::block_in_place(|| self.child.wait()).expect("wait");
        let err = self.stderr_text();
        assert!(
            status.success(),
            "{} exited with {status}\n{err}",
            self.name
        );
        let line = last.unwrap_or_else(|| panic!("{} printed nothing\n{err}", self.name));
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line}\n{err}", self.name))
    }

    #[cfg(feature = "system-tests")]
    fn stderr_text(&mut self) -> String {
        let handle = std::mem::replace(&mut self.stderr, std::thread::spawn(String::new));
        let _ = self.child.kill();
        handle.join().unwrap_or_default()
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a whole case (no syncs) and returns its observations.
#[cfg(feature = "system-tests")]
pub async fn run(
    case: &str,
    port: u16,
    device: &str,
    version: &str,
    params: &[(&str, &str)],
) -> Value {
    Case::start(case, port, device, version, params)
        .finish()
        .await
}

/// Runs a stock client with `args` to its end (at most `timeout`, then it
/// is killed): (exit code, stdout, stderr).
pub async fn tool(name: &str, args: &[&str], timeout: Duration) -> (Option<i32>, String, String) {
    let mut child = Command::new(mosquitto_tool(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let out = tokio::task::block_in_place(|| child.wait_with_output()).expect("output");
            return (
                status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if tokio::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = tokio::task::block_in_place(|| child.wait_with_output()).expect("output");
            return (
                None,
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A stock client left running with its stdin open (`mosquitto_pub -l`):
/// lines written to it are sent, and what it prints is read as it comes.
pub struct Running {
    case: Case,
}

impl Running {
    pub fn start(name: &str, args: &[&str]) -> Running {
        // Its stdout is a pipe, which C's stdio buffers whole: `stdbuf`
        // (coreutils) has it flush every line, as on a terminal.
        let mut cmd = Command::new("stdbuf");
        cmd.arg("-oL").arg(mosquitto_tool(name)).args(args);
        Running {
            case: Case::spawn(format!("{name} {}", args.join(" ")), cmd),
        }
    }

    pub fn send_line(&mut self, line: &str) {
        let stdin = self.case.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write a line");
        stdin.flush().expect("flush");
    }

    /// Lines printed until one satisfies `done` (it included), or `timeout`.
    pub async fn lines_until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&str) -> bool,
    ) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut seen = Vec::new();
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.case.lines.recv()).await {
            let stop = done(&line);
            seen.push(line);
            if stop {
                break;
            }
        }
        seen
    }

    /// Closes its stdin and waits for it to exit: its exit code.
    pub async fn close(mut self) -> Option<i32> {
        self.case.stdin = None;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.case.child.try_wait().expect("try_wait") {
                return status.code();
            }
            if tokio::time::Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
