//! The container image (issue 34 item 3): `packaging/Containerfile` built
//! with podman from the .deb `scripts/deb.sh` makes of the binary under
//! test, and run as docs/OPERATIONS.md ("Without systemd") says, with the
//! runtime as the supervisor:
//!
//! - the config's directory mounted at /etc/ferry (the config listens on
//!   0.0.0.0, so devices log in with passwords, from a file `ferry passwd`
//!   made beside it), the store on a named volume, north at a Mosquitto
//!   on the host;
//! - it runs as the user `ferry`; a device gets its `stored` receipt and
//!   the backend the uplink; a wrong password is refused; `/readyz`
//!   answers 200;
//! - `podman kill -s HUP`: a changed live key is applied
//!   (`config_reloaded`) and a device added with `ferry passwd` on the
//!   host meanwhile logs in;
//! - `podman stop -t 30`: exit 0 well before the SIGKILL, `gateway_stopped`;
//! - a new container on the same volume has the store: a message sent
//!   before is answered `delivered` with its seq (the backend acked it),
//!   the next one follows it, and `ferry status` in the container reads
//!   it.
//!
//! No registry is reached. The base is Debian bookworm made here from
//! Debian's package mirror by `mmdebstrap --variant=minbase`, imported as
//! [`BASE`] and named to the Containerfile by its `BASE` build argument;
//! it stays in podman's storage for the next run (made again where it is
//! absent: about 30 s). The image is built with `--network none`: the
//! base has the package's dependencies, so dpkg installs it offline.
//!
//! Two things of this machine's kind are worked around, for this test
//! only: crun refuses its hybrid cgroup hierarchy (v1 controllers and a
//! v2 mount with one), so podman runs runc; and root lacks
//! CAP_SYS_RESOURCE, so podman's default raising of the container's file
//! and process limits to 1048576 fails: the container gets this test's
//! own limits (`--ulimit`). `--network host`: the container reaches the
//! host's Mosquitto, and the test the container's ports, on 127.0.0.1.
//!
//! Needs root (rootful podman), podman, runc and mmdebstrap, Debian's
//! mirror (once, for the base), and what scripts/deb.sh needs;
//! scripts/test.sh installs them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::admin::get;
use crate::support::{ferry_binary, ferry_command, free_port, Backend, Mosquitto};

/// The local base image: Debian bookworm from the mirror, no registry.
const BASE: &str = "localhost/ferry-test-base:bookworm";
const INSTALL: &str = "apt-get install -y podman runc mmdebstrap (./scripts/test.sh installs them)";
const GATEWAY: &str = "edge-ct";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `program ARGS` under `timeout`, without starving the test's tokio
/// worker; its output, or a failure naming what to install.
fn run(program: &str, args: &[&str], limit: Duration, hint: &str) -> Output {
    let shown = format!("{program} {}", args.join(" "));
    let out = tokio::task::block_in_place(|| {
        Command::new("timeout")
            .arg("-k")
            .arg("10")
            .arg(limit.as_secs().to_string())
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
    })
    .unwrap_or_else(|e| panic!("{shown}: {e}"));
    match out.status.code() {
        Some(124) | Some(137) => panic!("{shown}: still running after {limit:?}, stopped"),
        Some(127) => panic!("{shown}: {program} not found: {hint}"),
        _ => out,
    }
}

/// Fails the test, with its output, unless `out` exited 0; else its stdout.
fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `podman --runtime runc ARGS` (crun refuses this machine's cgroups).
fn podman(args: &[&str], limit: Duration) -> Output {
    let mut all = vec!["--runtime", "runc"];
    all.extend_from_slice(args);
    run("podman", &all, limit, INSTALL)
}

fn podman_ok(args: &[&str], limit: Duration) -> String {
    ok(&format!("podman {}", args.join(" ")), podman(args, limit))
}

const QUICK: Duration = Duration::from_secs(60);

/// `--ulimit` values for `podman run`, within what the runtime may keep
/// without CAP_SYS_RESOURCE: open files as this process has them (podman
/// and conmon run with the same); processes (threads, counted per user:
/// the container's `ferry` has only the gateway's) 4096 at most, under
/// the 32768 conmon runs with here.
fn ulimits() -> Vec<String> {
    let own = |resource| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given and nothing else.
        assert_eq!(unsafe { libc::getrlimit(resource, &mut r) }, 0, "getrlimit");
        (r.rlim_cur, r.rlim_max)
    };
    let show = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            "-1".to_string()
        } else {
            v.to_string()
        }
    };
    let (files, files_max) = own(libc::RLIMIT_NOFILE);
    let (procs, procs_max) = own(libc::RLIMIT_NPROC);
    vec![
        "--ulimit".into(),
        format!("nofile={}:{}", show(files), show(files_max)),
        "--ulimit".into(),
        format!(
            "nproc={}:{}",
            show(procs.min(4096)),
            show(procs_max.min(4096))
        ),
    ]
}

/// Root, and the tools, each failing with how to get it.
fn preconditions() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the container test runs rootful podman: run it as root \
         (sudo -E cargo test --features system-tests --test tests container)"
    );
    // Where Debian puts them (runc in /usr/sbin, which a user's PATH may
    // lack; podman finds it there itself).
    for tool in ["/usr/bin/podman", "/usr/sbin/runc", "/usr/bin/mmdebstrap"] {
        assert!(
            Path::new(tool).is_file(),
            "the container test needs {tool}: {INSTALL}"
        );
    }
}

/// [`BASE`], made from Debian's mirror when podman's storage lacks it.
fn base_image() {
    if podman(&["image", "exists", BASE], QUICK).status.success() {
        eprintln!("container: base {BASE} already in podman's storage");
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("a temp dir");
    let tar = dir.path().join("bookworm.tar");
    let tar = tar.to_str().expect("a UTF-8 path");
    ok(
        "mmdebstrap (it needs Debian's package mirror, as apt-get does)",
        run(
            "mmdebstrap",
            &["--variant=minbase", "--quiet", "bookworm", tar],
            Duration::from_secs(900),
            INSTALL,
        ),
    );
    podman_ok(
        &[
            "import",
            "--change",
            "CMD [\"/bin/bash\"]",
            "--message",
            "Debian bookworm minbase by mmdebstrap, for tests/container.rs",
            tar,
            BASE,
        ],
        Duration::from_secs(300),
    );
    eprintln!(
        "container: made {BASE} with mmdebstrap in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The package of the binary under test, uncompressed (quick), alone in
/// `out`: the image's build context.
fn build_package(out: &Path) -> PathBuf {
    let binary = ferry_binary();
    let out_s = out.to_str().expect("a UTF-8 path");
    let built = ok(
        "scripts/deb.sh",
        run(
            repo().join("scripts/deb.sh").to_str().expect("UTF-8"),
            &[
                "--binary",
                binary.to_str().expect("UTF-8"),
                "--out",
                out_s,
                "--compress",
                "none",
            ],
            Duration::from_secs(300),
            "deb.sh needs dpkg-deb, dpkg-shlibdeps and strip: apt-get install dpkg-dev binutils",
        ),
    );
    PathBuf::from(built.trim())
}

/// What the test made in podman's storage, removed however it ends (the
/// base stays, for the next run).
struct Made {
    image: String,
    volume: String,
    containers: Vec<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        let quiet = |args: &[&str]| {
            let _ = Command::new("timeout")
                .args(["60", "podman", "--runtime", "runc"])
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        for c in &self.containers {
            quiet(&["rm", "-f", "-t", "0", c]);
        }
        quiet(&["volume", "rm", "-f", &self.volume]);
        quiet(&["rmi", "-f", &self.image]);
    }
}

/// Replaces the one line `old` of `text` with `new`.
fn set(text: &str, old: &str, new: &str) -> String {
    assert_eq!(
        text.lines().filter(|l| *l == old).count(),
        1,
        "the packaged config has the line {old:?} once"
    );
    text.lines()
        .map(|l| if l == old { new } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// `ferry passwd FILE DEVICE` on the host, the password on stdin.
fn passwd(file: &Path, device: &str, password: &str) {
    let out = tokio::task::block_in_place(|| {
        let mut child = ferry_command()
            .arg("passwd")
            .arg(file)
            .arg(device)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ferry passwd");
        use std::io::Write;
        writeln!(child.stdin.take().expect("stdin"), "{password}").expect("write the password");
        child.wait_with_output().expect("ferry passwd")
    });
    ok(&format!("ferry passwd {device}"), out);
}

/// `mosquitto_rr` as `device`: publishes one envelope on its up topic and
/// prints the first receipt on its ack topic. (exit 0, output).
fn device_sends(south: u16, device: &str, password: &str, msg_id: &str) -> (bool, String) {
    let out = run(
        "mosquitto_rr",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &south.to_string(),
            "-i",
            device,
            "-u",
            device,
            "-P",
            password,
            "-q",
            "1",
            "-W",
            "10",
            "-t",
            &format!("devices/{device}/up/t"),
            "-e",
            &format!("devices/{device}/ack"),
            "-m",
            &format!(r#"{{"msg_id":"{msg_id}","payload":{{"n":1}}}}"#),
        ],
        Duration::from_secs(30),
        "mosquitto_rr is in Debian's mosquitto-clients",
    );
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The first receipt `device` gets for `msg_id`: (status, seq).
fn receipt(
    south: u16,
    device: &str,
    password: &str,
    msg_id: &str,
    logs: &dyn Fn() -> String,
) -> (String, u64) {
    let (sent, said) = device_sends(south, device, password, msg_id);
    let receipt: serde_json::Value = serde_json::from_str(said.trim()).unwrap_or_else(|e| {
        panic!(
            "{device}'s {msg_id}: no receipt ({e}; exit ok: {sent}): {said}\n--- container ---\n{}",
            logs()
        )
    });
    assert_eq!(receipt["msg_id"].as_str(), Some(msg_id), "{receipt}");
    (
        receipt["status"].as_str().unwrap_or_default().to_string(),
        receipt["seq"].as_u64().expect("a seq"),
    )
}

fn logs(name: &str) -> String {
    let out = podman(&["logs", name], QUICK);
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Waits until the container's log has a line with all of `words`; fails
/// with the log after `limit` or when the container has stopped.
fn wait_logged(name: &str, words: &[&str], limit: Duration) -> String {
    let until = Instant::now() + limit;
    loop {
        let log = logs(name);
        if let Some(line) = log.lines().find(|l| words.iter().all(|w| l.contains(w))) {
            return line.to_string();
        }
        let running = podman_ok(&["inspect", "-f", "{{.State.Running}}", name], QUICK);
        assert!(
            running.trim() == "true" && Instant::now() < until,
            "container {name}: no log line with {words:?} (running: {}):\n{log}",
            running.trim()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Starts a container of `image` named `name`; waits for `gateway_started`.
fn start(made: &mut Made, name: &str, etc: &Path) {
    made.containers.push(name.to_string());
    let volume = format!("{}:/var/lib/ferry", made.volume);
    let etc = format!("{}:/etc/ferry:ro", etc.display());
    let mut args: Vec<String> = ["run", "-d", "--name", name, "--network", "host"]
        .map(String::from)
        .to_vec();
    args.extend(ulimits());
    args.extend(["-v".into(), volume, "-v".into(), etc, made.image.clone()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    podman_ok(&args, QUICK);
    tokio::task::block_in_place(|| {
        wait_logged(
            name,
            &["event=\"gateway_started\""],
            Duration::from_secs(30),
        )
    });
}

/// `podman stop -t 30`: how long it took; the container must have exited
/// 0 by itself, saying `gateway_stopped`.
fn stop(name: &str) -> Duration {
    let started = Instant::now();
    podman_ok(&["stop", "-t", "30", name], Duration::from_secs(60));
    let took = started.elapsed();
    let code = podman_ok(&["inspect", "-f", "{{.State.ExitCode}}", name], QUICK);
    let log = logs(name);
    assert_eq!(code.trim(), "0", "{name} exited {}:\n{log}", code.trim());
    assert!(
        log.contains("event=\"gateway_stopped\""),
        "{name}: no gateway_stopped:\n{log}"
    );
    // 30 s would be podman's SIGKILL; ferry's own grace is 10 s.
    assert!(
        took < Duration::from_secs(15),
        "{name} took {took:?} to stop:\n{log}"
    );
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_from_the_deb_runs_as_ferry_serves_devices_reloads_stops_and_keeps_its_store() {
    let t0 = Instant::now();
    preconditions();
    base_image();
    let t_base = t0.elapsed();

    let work = tempfile::tempdir().expect("a temp dir");
    let context = work.path().join("context");
    let deb = build_package(&context);
    assert!(deb.starts_with(&context), "{}", deb.display());
    let t_deb = t0.elapsed();

    let tag = format!("{:08x}", rand::random::<u32>());
    let mut made = Made {
        image: format!("localhost/ferry-test:{tag}"),
        volume: format!("ferry-test-data-{tag}"),
        containers: Vec::new(),
    };
    let base_arg = format!("BASE={BASE}");
    let containerfile = repo().join("packaging/Containerfile");
    podman_ok(
        &[
            "build",
            "--pull=never",
            "--network",
            "none",
            "--layers=false",
            "--build-arg",
            &base_arg,
            "-f",
            containerfile.to_str().expect("UTF-8"),
            "-t",
            &made.image,
            context.to_str().expect("UTF-8"),
        ],
        Duration::from_secs(300),
    );
    let t_image = t0.elapsed();

    // The image's user and its config (the package's conffile), which the
    // operator's copy starts from.
    let mut probe = vec![
        "run".to_string(),
        "--rm".into(),
        "--network".into(),
        "none".into(),
    ];
    probe.extend(ulimits());
    probe.extend(
        [
            "--entrypoint",
            "sh",
            &made.image,
            "-c",
            "id -un; id -g; cat /etc/ferry/ferry.toml",
        ]
        .map(String::from),
    );
    let probe: Vec<&str> = probe.iter().map(String::as_str).collect();
    let said = podman_ok(&probe, QUICK);
    let mut lines = said.splitn(3, '\n');
    let user = lines.next().unwrap_or_default();
    let gid: u32 = lines.next().unwrap_or_default().parse().expect("a gid");
    let packaged = lines.next().unwrap_or_default();
    assert_eq!(user, "ferry", "the image runs as ferry");
    assert!(
        packaged
            .lines()
            .any(|l| l == "data_dir = \"/var/lib/ferry\""),
        "the packaged config keeps its store in /var/lib/ferry"
    );

    // The operator's /etc/ferry: root:ferry 0750, files root:ferry 0640.
    let mq = Mosquitto::start();
    let mut backend = Backend::connect_auto_ack(mq.port, GATEWAY).await;
    let (south, admin) = (free_port(), free_port());
    let etc = work.path().join("etc");
    std::fs::create_dir(&etc).expect("mkdir etc");
    let config = [
        ("id = \"edge-01\"", format!("id = \"{GATEWAY}\"")),
        (
            "listen = \"127.0.0.1:1883\"",
            format!("listen = \"0.0.0.0:{south}\""),
        ),
        ("auth = \"none\"", "auth = \"password\"".into()),
        (
            "password_file = \"\"",
            "password_file = \"/etc/ferry/passwd\"".into(),
        ),
        ("port = 1884", format!("port = {}", mq.port)),
        (
            "listen = \"127.0.0.1:9183\"",
            format!("listen = \"127.0.0.1:{admin}\""),
        ),
    ]
    .iter()
    .fold(packaged.to_string(), |c, (old, new)| set(&c, old, new));
    let conf = etc.join("ferry.toml");
    std::fs::write(&conf, &config).expect("write the config");
    let pw_file = etc.join("passwd");
    passwd(&pw_file, "press-1", "pw-1");
    for (path, mode) in [(&etc, 0o750), (&conf, 0o640), (&pw_file, 0o640)] {
        std::os::unix::fs::chown(path, Some(0), Some(gid)).expect("chown");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    let first = format!("ferry-test-{tag}-1");
    start(&mut made, &first, &etc);
    let t_started = t0.elapsed();
    let log1 = || logs(&first);
    let top = podman_ok(&["top", &first, "user", "comm"], QUICK);
    assert!(
        top.lines()
            .skip(1)
            .all(|l| l.split_whitespace().next() == Some("ferry"))
            && top.lines().count() == 2,
        "the gateway runs as ferry, alone: {top}"
    );
    let (status, body) = get(&format!("http://127.0.0.1:{admin}/readyz"));
    assert_eq!(status, 200, "/readyz: {body}");

    assert_eq!(
        receipt(south, "press-1", "pw-1", "m1", &log1),
        ("stored".into(), 1)
    );
    let up = backend
        .next_message(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("the backend got no uplink:\n{}", log1()));
    assert_eq!(
        (up.device(), up.msg_id()),
        ("press-1", "m1"),
        "{}",
        up.topic
    );
    let (sent, said) = device_sends(south, "press-1", "wrong", "m-wrong");
    assert!(
        !sent && !said.contains("stored"),
        "a wrong password is refused: {said}"
    );

    // Reload: a live key changed, a device added, both on the host.
    passwd(&pw_file, "press-2", "pw-2");
    std::fs::write(
        &conf,
        set(&config, "ack_timeout_ms = 10000", "ack_timeout_ms = 15000"),
    )
    .expect("edit the config");
    podman_ok(&["kill", "-s", "HUP", &first], QUICK);
    let reloaded = tokio::task::block_in_place(|| {
        wait_logged(
            &first,
            &["event=\"config_reloaded\""],
            Duration::from_secs(10),
        )
    });
    assert!(
        reloaded.contains("north.ack_timeout_ms"),
        "the changed key is applied: {reloaded}"
    );
    tokio::task::block_in_place(|| {
        wait_logged(
            &first,
            &["event=\"password_file_reloaded\"", "devices=2"],
            Duration::from_secs(10),
        )
    });
    assert_eq!(
        receipt(south, "press-2", "pw-2", "n1", &log1),
        ("stored".into(), 1)
    );

    let stop1 = tokio::task::block_in_place(|| stop(&first));

    // A new container on the same volume: the store is the one before.
    let second = format!("ferry-test-{tag}-2");
    start(&mut made, &second, &etc);
    let log2 = || logs(&second);
    assert_eq!(
        receipt(south, "press-1", "pw-1", "m1", &log2),
        ("delivered".into(), 1),
        "m1 is known, as the backend acked it: its seq, delivered"
    );
    assert_eq!(
        receipt(south, "press-1", "pw-1", "m2", &log2),
        ("stored".into(), 2)
    );
    let status = podman_ok(
        &[
            "exec",
            &second,
            "ferry",
            "status",
            "-c",
            "/etc/ferry/ferry.toml",
        ],
        QUICK,
    );
    assert!(
        status.contains(&format!("gateway: {GATEWAY} running (pid 1)")),
        "ferry status in the container: {status}"
    );
    let store = podman_ok(
        &[
            "exec",
            &second,
            "stat",
            "-c",
            "%U:%G %a",
            "/var/lib/ferry",
            "/var/lib/ferry/ferry.db",
        ],
        QUICK,
    );
    assert!(
        store.lines().next() == Some("ferry:ferry 750")
            && store
                .lines()
                .nth(1)
                .is_some_and(|l| l.starts_with("ferry:ferry ")),
        "the volume is ferry's: {store}"
    );
    let stop2 = tokio::task::block_in_place(|| stop(&second));

    eprintln!(
        "container: base {:.1} s, deb {:.1} s, image {:.1} s, first start {:.1} s, \
         stops {:.1} s and {:.1} s, all {:.1} s",
        t_base.as_secs_f64(),
        (t_deb - t_base).as_secs_f64(),
        (t_image - t_deb).as_secs_f64(),
        (t_started - t_image).as_secs_f64(),
        stop1.as_secs_f64(),
        stop2.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    drop(made);
}
