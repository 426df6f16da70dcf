//! The unit under a real systemd (issue 34): `systemd/ferry.service` as it
//! ships, installed as from source (the binary in /usr/local/bin, the
//! config in /etc/ferry, a system user `ferry`), in a container booted
//! with `systemd-nspawn -b` on this machine's own Debian (`/usr` bound
//! read-only, a copy of `/etc`, the rest fresh) and its network (the
//! upstream Mosquitto runs here). A script run by a oneshot unit inside
//! does what an operator does and writes what it saw:
//!
//! - `systemctl enable --now ferry`: active (Type=notify: READY=1 came),
//!   with a `STATUS=`;
//! - a device message, acknowledged after its commit;
//! - `systemctl reload ferry`: the gateway logs `config_reloaded`;
//! - the gateway hung (SIGSTOP): the watchdog has systemd restart it
//!   (a drop-in shortens `WatchdogSec` to 5 s so the test does not wait
//!   30 s; the unit is otherwise as shipped, sandbox included);
//! - another message, then `systemctl stop ferry` within its timeout,
//!   result `success`.
//!
//! Then the backend on the upstream has both messages: nothing was lost
//! across the restart and the stop.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{ferry_binary, free_port, Backend, Mosquitto};

const NSPAWN: &str = "/usr/bin/systemd-nspawn";
/// The test's user and group `ferry` inside the container.
const FERRY_ID: u32 = 61_234;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// An OS tree for the container: this machine's /usr (bound read-only by
/// nspawn), a copy of its /etc without a user `ferry` but with the test's,
/// and fresh /var, /run, /tmp.
fn os_tree(root: &Path) {
    for d in [
        "usr", "var/lib", "var/log", "tmp", "run", "dev", "proc", "sys", "root", "opt/test",
    ] {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("sbin", "usr/sbin"),
        ("lib64", "usr/lib64"),
    ] {
        assert!(
            std::fs::read_link(Path::new("/").join(link)).is_ok(),
            "this test boots this machine's own /usr: it needs a merged /usr (/{link} a link)"
        );
        std::os::unix::fs::symlink(to, root.join(link)).expect("symlink");
    }
    let copied = Command::new("cp")
        .args(["-a", "/etc"])
        .arg(root.join("etc"))
        .status()
        .expect("cp");
    assert!(copied.success(), "cp -a /etc");
    for (db, line) in [
        (
            "passwd",
            format!("ferry:x:{FERRY_ID}:{FERRY_ID}:ferry:/var/lib/ferry:/usr/sbin/nologin"),
        ),
        ("group", format!("ferry:x:{FERRY_ID}:")),
        ("shadow", "ferry:!:19000::::::".to_string()),
        ("gshadow", "ferry:!::".to_string()),
    ] {
        let file = root.join("etc").join(db);
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let mut kept: String = text
            .lines()
            .filter(|l| l.split(':').next() != Some("ferry"))
            .map(|l| format!("{l}\n"))
            .collect();
        kept.push_str(&line);
        kept.push('\n');
        std::fs::write(&file, kept).expect("write the account");
    }
    // nspawn looks for os-release before it binds /usr: a file, not the
    // link into /usr the copy of /etc has.
    let release = root.join("etc/os-release");
    let _ = std::fs::remove_file(&release);
    std::fs::copy("/usr/lib/os-release", &release).expect("os-release");
    let id: String = (0..32).map(|_| format!("{:x}", rand_nibble())).collect();
    write(&root.join("etc/machine-id"), &format!("{id}\n"));
}

fn rand_nibble() -> u8 {
    let mut b = [0u8; 1];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .expect("urandom");
    b[0] & 0xf
}

/// What the script inside writes: `key=value` lines.
fn script(south: u16) -> String {
    let pub_ = |id: &str| {
        format!(
            "mosquitto_pub -h 127.0.0.1 -p {south} -q 1 -i press-sd -t devices/press-sd/up/t -m '{{\"msg_id\":\"{id}\",\"payload\":1}}'"
        )
    };
    format!(
        r#"#!/bin/sh
out=/opt/test/out
say() {{ echo "$1" >> $out; }}
systemctl enable --now ferry; say "enable=$?"
say "active=$(systemctl is-active ferry)"
say "status=$(systemctl show -p StatusText --value ferry)"
{pub1}; say "pub1=$?"
systemctl reload ferry; say "reload=$?"
for i in $(seq 1 40); do journalctl -u ferry --no-pager | grep -q config_reloaded && break; sleep 0.25; done
say "reloaded=$(journalctl -u ferry --no-pager | grep -c config_reloaded)"
kill -STOP "$(systemctl show -p MainPID --value ferry)"
for i in $(seq 1 120); do [ "$(systemctl show -p NRestarts --value ferry)" -ge 1 ] && break; sleep 0.25; done
say "restarts=$(systemctl show -p NRestarts --value ferry)"
say "watchdog=$(journalctl -u ferry --no-pager | grep -ci 'watchdog timeout')"
for i in $(seq 1 120); do [ "$(systemctl is-active ferry)" = active ] && break; sleep 0.25; done
say "active_again=$(systemctl is-active ferry)"
{pub2}; say "pub2=$?"
start=$(date +%s%N); systemctl stop ferry; say "stop=$?"
say "stop_ms=$(( ($(date +%s%N) - start) / 1000000 ))"
say "result=$(systemctl show -p Result --value ferry)"
journalctl -u ferry --no-pager > /opt/test/journal 2>&1
say "done=1"
"#,
        pub1 = pub_("sd-1"),
        pub2 = pub_("sd-2"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unit_runs_under_a_real_systemd_reloads_is_restarted_by_its_watchdog_and_stops() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "booting a container needs root"
    );
    assert!(
        Path::new(NSPAWN).is_file(),
        "this test boots systemd in a container: install systemd-container \
         (`apt-get install -y systemd-container`, or run ./scripts/test.sh, which does)"
    );
    let mq = Mosquitto::start();
    let mut backend = Backend::connect_auto_ack(mq.port, "edge-sd").await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let root = dir.path().join("root");
    os_tree(&root);
    let local = dir.path().join("usr-local");
    std::fs::create_dir_all(local.join("bin")).expect("mkdir");
    std::fs::copy(ferry_binary(), local.join("bin/ferry")).expect("install ferry");

    // The shipped config, with this test's gateway and ports.
    let south = free_port();
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/ferry.toml"))
            .expect("conf/ferry.toml");
    let config = shipped
        .replace("id = \"edge-01\"", "id = \"edge-sd\"")
        .replace("data_dir = \"./data\"", "data_dir = \"/var/lib/ferry\"")
        .replace(
            "listen = \"127.0.0.1:1883\"",
            &format!("listen = \"127.0.0.1:{south}\""),
        )
        .replace("port = 1884", &format!("port = {}", mq.port))
        .replace("listen = \"127.0.0.1:9183\"", "listen = \"\"");
    let conf = root.join("etc/ferry/ferry.toml");
    write(&conf, &config);
    std::os::unix::fs::chown(&conf, Some(0), Some(FERRY_ID)).expect("chown");
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o640)).expect("chmod");

    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/ferry.service"),
    )
    .expect("systemd/ferry.service");
    write(&root.join("etc/systemd/system/ferry.service"), &unit);
    write(
        &root.join("etc/systemd/system/ferry.service.d/test.conf"),
        "[Service]\nWatchdogSec=5s\n",
    );
    write(
        &root.join("etc/systemd/system/ferry-test.target"),
        "[Unit]\nDescription=ferry's test\nRequires=basic.target ferry-test.service\nAfter=basic.target\nAllowIsolate=yes\n",
    );
    write(
        &root.join("etc/systemd/system/ferry-test.service"),
        "[Unit]\nAfter=basic.target\n[Service]\nType=oneshot\nExecStart=/opt/test/run.sh\nExecStartPost=/bin/systemctl poweroff --no-block\n",
    );
    let run = root.join("opt/test/run.sh");
    write(&run, &script(south));
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let out = tokio::task::block_in_place(|| {
        Command::new("timeout")
            .arg("180")
            .arg(NSPAWN)
            .arg("-D")
            .arg(&root)
            .args([
                "--register=no",
                "--keep-unit",
                "-q",
                "-b",
                "--console=read-only",
            ])
            .arg("--bind-ro=/usr")
            .arg(format!("--bind={}:/usr/local", local.display()))
            .args(["--", "systemd.unit=ferry-test.target"])
            .output()
            .expect("run systemd-nspawn")
    });
    let said = std::fs::read_to_string(root.join("opt/test/out")).unwrap_or_default();
    let journal = std::fs::read_to_string(root.join("opt/test/journal")).unwrap_or_default();
    let boot =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let context = format!("--- seen ---\n{said}\n--- journal ---\n{journal}\n--- boot ---\n{boot}");
    let value = |key: &str| -> String {
        said.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in what the script saw:\n{context}"))
            .to_string()
    };
    assert_eq!(value("done"), "1", "{context}");
    assert_eq!(
        (value("enable"), value("active")),
        ("0".into(), "active".into()),
        "{context}"
    );
    assert!(!value("status").is_empty(), "a STATUS= line: {context}");
    assert_eq!(value("pub1"), "0", "{context}");
    assert_eq!(
        (value("reload"), value("reloaded")),
        ("0".into(), "1".into()),
        "{context}"
    );
    assert_eq!(
        value("restarts"),
        "1",
        "the watchdog restarted it: {context}"
    );
    assert!(
        value("watchdog").parse::<u32>().unwrap_or(0) >= 1,
        "{context}"
    );
    assert_eq!(value("active_again"), "active", "{context}");
    assert_eq!(value("pub2"), "0", "{context}");
    assert_eq!(
        (value("stop"), value("result")),
        ("0".into(), "success".into()),
        "{context}"
    );
    let stop_ms: u64 = value("stop_ms").parse().expect("a number");
    assert!(
        stop_ms < 30_000,
        "stopped within TimeoutStopSec: {stop_ms} ms"
    );

    // Nothing lost: both messages reached the backend.
    let got = backend
        .messages_until(Duration::from_secs(20), |all| {
            ["sd-1", "sd-2"]
                .iter()
                .all(|id| all.iter().any(|m| m.msg_id() == *id))
        })
        .await;
    for id in ["sd-1", "sd-2"] {
        assert!(
            got.iter().any(|m| m.msg_id() == id),
            "{id} north: {got:?}\n{context}"
        );
    }
}
