//! The README's Quick start, run as written: the test takes the
//! ```` ```sh quickstart-gateway ````, `quickstart-backend` and
//! `quickstart-device` blocks and runs each with `sh -e` in its own
//! process (the three terminals), in a temp dir holding a copy of
//! `conf/ferry.toml`. What it changes, and nothing else:
//!
//! - free ports in place of 1883 (devices), 1884 (upstream) and 9183
//!   (admin), in the commands and in the copied config, so it runs beside
//!   other tests;
//! - the `quickstart-build` block (`cargo build --release` and the PATH
//!   line) is not run: the test's own build of `ferry` is first on the
//!   PATH instead (the block is checked to build and name that binary).
//!
//! It proves the path end to end: the gateway runs on the shipped config
//! with an upstream Mosquitto, `ferry device` gets `stored` and exits 0,
//! the backend's `mosquitto_sub` on the upstream prints the message, and
//! the `quickstart-ack` block makes it `delivered` in the store. Then
//! "Talking to it", in the order a reader runs it: `talking-device`
//! (`ferry device --wait delivered`) waits, seq 2, until `talking-ack`
//! acks it, and `talking-rr` (`mosquitto_rr` as the device) gets its
//! `stored` receipt, seq 3, from the same gateway.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::support::free_port;
use crate::support::proc::kill_and_reap;

const SECS_20: Duration = Duration::from_secs(20);

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md")
}

/// The commands of the ```` ```sh {name} ```` block.
pub(crate) fn block(doc: &str, name: &str) -> String {
    fenced(doc, "sh", name)
}

/// The text of the ```` ```{lang} {name} ```` block.
pub(crate) fn fenced(doc: &str, lang: &str, name: &str) -> String {
    let marker = format!("```{lang} {name}\n");
    let start = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("no {marker:?} block"))
        + marker.len();
    let len = doc[start..].find("\n```\n").expect("the block's end");
    doc[start..start + len].to_owned()
}

/// The ports the Quick start uses, and the free ones put in their place.
pub(crate) struct Ports {
    pub(crate) south: u16,
    pub(crate) north: u16,
    admin: u16,
}

impl Ports {
    pub(crate) fn free() -> Ports {
        let mut picked = Vec::new();
        while picked.len() < 3 {
            let p = free_port();
            if !picked.contains(&p) {
                picked.push(p);
            }
        }
        Ports {
            south: picked[0],
            north: picked[1],
            admin: picked[2],
        }
    }

    pub(crate) fn swap(&self, text: &str) -> String {
        text.replace("1883", &self.south.to_string())
            .replace("1884", &self.north.to_string())
            .replace("9183", &self.admin.to_string())
    }
}

/// A terminal's shell; it and everything it started end on drop.
pub(crate) struct Terminal(pub(crate) Child);

impl Drop for Terminal {
    fn drop(&mut self) {
        close(&mut self.0);
    }
}

/// `sh -e -c script` in `dir`, in a process group of its own (so what it
/// starts in the background ends with it), output to `dir/{name}.out`.
pub(crate) fn terminal(dir: &Path, name: &str, script: &str, path: &str) -> Terminal {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).expect("create output");
    Command::new("sh")
        .args(["-e", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("clone"))
        .stderr(out)
        .process_group(0)
        .spawn()
        .map(Terminal)
        .unwrap_or_else(|e| panic!("start the {name} terminal: {e}"))
}

/// Ends a terminal and everything it started: SIGTERM to its process
/// group, SIGKILL to what is left of it after a moment. A shell that has
/// ended and been reaped is left alone: its group id may be reused.
fn close(child: &mut Child) {
    if !matches!(child.try_wait(), Ok(None)) {
        return;
    }
    let group = -(child.id() as i32);
    // SAFETY: kill(2) on the process group of a child this test started
    // and has not reaped, so the group is still its own.
    unsafe {
        libc::kill(group, libc::SIGTERM);
    }
    for _ in 0..30 {
        // SAFETY: as above; signal 0 only asks whether the group exists.
        if unsafe { libc::kill(group, 0) } != 0 {
            break;
        }
        // Unreaped, the shell keeps the group's id its own.
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above.
    unsafe {
        libc::kill(group, libc::SIGKILL);
    }
    kill_and_reap(child);
}

/// Runs a terminal's block to its end (at most 20 s), which must succeed:
/// what it printed.
pub(crate) async fn to_the_end(dir: &Path, name: &str, script: &str, path: &str) -> String {
    let mut shell = terminal(dir, name, script, path);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = shell.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            started.elapsed() < SECS_20,
            "the {name} block still ran after {SECS_20:?}: {}",
            output(dir, name)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let said = output(dir, name);
    assert!(
        status.success(),
        "the {name} block failed ({status}): {said}"
    );
    said
}

pub(crate) fn output(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default()
}

pub(crate) fn accepts(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Polls `check` until it holds; panics after `timeout` naming `what`
/// with the terminals' output.
async fn wait_for(dir: &Path, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + SECS_20;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "not within {SECS_20:?}: {what}\n--- gateway ---\n{}\n--- backend ---\n{}\n--- device ---\n{}",
            output(dir, "gateway"),
            output(dir, "backend"),
            output(dir, "device")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn require(tool: &str, package: &str) {
    let found = Path::new(tool).is_file()
        || std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .any(|d| d.join(tool).is_file());
    assert!(
        found,
        "the Quick start needs {tool}: install it with `apt-get install -y {package}` \
         (or run ./scripts/test.sh, which does)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_runs_as_written_and_a_device_message_reaches_the_backend() {
    require("/usr/sbin/mosquitto", "mosquitto");
    require("mosquitto_sub", "mosquitto-clients");
    let doc = readme();
    let build = block(&doc, "quickstart-build");
    assert!(
        build.lines().next() == Some("cargo build --release")
            && build.contains("$PWD/target/release"),
        "the build block builds target/release/ferry: {build}"
    );
    let ports = Ports::free();
    let dir = tempfile::Builder::new()
        .prefix("ferry-quickstart-")
        .tempdir()
        .expect("temp dir");
    let conf =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/ferry.toml"))
            .expect("read conf/ferry.toml");
    std::fs::create_dir(dir.path().join("conf")).expect("mkdir conf");
    std::fs::write(dir.path().join("conf/ferry.toml"), ports.swap(&conf)).expect("write config");
    let bin_dir: PathBuf = crate::support::ferry_binary()
        .parent()
        .expect("the binary's dir")
        .to_path_buf();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH")
    .into_string()
    .expect("a UTF-8 PATH");
    let path = path.as_str();
    let dir = dir.path();

    let gateway = terminal(
        dir,
        "gateway",
        &ports.swap(&block(&doc, "quickstart-gateway")),
        path,
    );
    wait_for(dir, "the gateway and the upstream broker listen", || {
        accepts(ports.south) && accepts(ports.north)
    })
    .await;
    wait_for(dir, "the gateway connected north", || {
        crate::support::north_connects(&output(dir, "gateway")) > 0
    })
    .await;
    let backend = terminal(
        dir,
        "backend",
        &ports.swap(&block(&doc, "quickstart-backend")),
        path,
    );
    // Mosquitto logs the backend's connection (its clients get `auto-` ids).
    wait_for(dir, "the backend's mosquitto_sub connected", || {
        output(dir, "gateway").contains(" as auto-")
    })
    .await;

    let said = to_the_end(
        dir,
        "device",
        &ports.swap(&block(&doc, "quickstart-device")),
        path,
    )
    .await;
    let stored = said
        .lines()
        .find(|l| l.starts_with("stored msg_id="))
        .unwrap_or_else(|| panic!("no stored receipt: {said}"));
    let msg_id = stored["stored msg_id=".len()..]
        .split(' ')
        .next()
        .expect("a msg_id")
        .to_string();
    assert!(stored.ends_with(" seq=1"), "{said}");

    let topic = "ferry/edge-01/up/press-7/alarm ";
    wait_for(dir, "the backend printed the message", || {
        output(dir, "backend")
            .lines()
            .any(|l| l.starts_with(topic) && l.contains(&format!("\"msg_id\":\"{msg_id}\"")))
    })
    .await;
    let line = output(dir, "backend")
        .lines()
        .find(|l| l.starts_with(topic))
        .expect("the line")
        .to_owned();
    let body: serde_json::Value = serde_json::from_str(&line[topic.len()..]).expect("JSON north");
    assert_eq!(body["payload"], serde_json::json!({"temp": 81.5}), "{line}");
    assert_eq!(body["device"], "press-7");

    assert_eq!(msg_id, "qs-0001", "the msg_id the block gives: {said}");
    to_the_end(
        dir,
        "ack",
        &ports.swap(&block(&doc, "quickstart-ack")),
        path,
    )
    .await;
    let db = dir.join("data/ferry.db");
    wait_for(dir, "the acked message is delivered in the store", || {
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|c| {
                c.query_row(
                    "SELECT state FROM uplink WHERE device = 'press-7' AND msg_id = 'qs-0001'",
                    [],
                    |r| r.get::<_, String>(0),
                )
            })
            .is_ok_and(|s| s == "delivered")
    })
    .await;

    // Talking to it: the device waits for `delivered` until the backend
    // acks, in another terminal.
    let mut device = terminal(
        dir,
        "talking-device",
        &ports.swap(&block(&doc, "talking-device")),
        path,
    );
    let started = Instant::now();
    while !output(dir, "talking-device").contains("stored msg_id=boot42-000017 seq=2") {
        assert!(
            started.elapsed() < SECS_20,
            "the talking device's message is not stored as seq 2: {}",
            output(dir, "talking-device")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    to_the_end(
        dir,
        "talking-ack",
        &ports.swap(&block(&doc, "talking-ack")),
        path,
    )
    .await;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = device.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            started.elapsed() < SECS_20,
            "ferry device still waits after the ack: {}",
            output(dir, "talking-device")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let said = output(dir, "talking-device");
    assert!(status.success(), "{said}");
    assert!(
        said.contains("delivered msg_id=boot42-000017 seq=2"),
        "{said}"
    );

    let said = to_the_end(dir, "rr", &ports.swap(&block(&doc, "talking-rr")), path).await;
    let receipt: serde_json::Value = serde_json::from_str(said.trim()).expect("one receipt");
    assert_eq!(receipt["msg_id"], "boot42-000018", "{said}");
    assert_eq!(receipt["status"], "stored", "{said}");
    assert_eq!(
        receipt["seq"], 3,
        "after the Quick start's and Talking's alarms: {said}"
    );
    tokio::task::block_in_place(|| drop((backend, gateway)));
}
