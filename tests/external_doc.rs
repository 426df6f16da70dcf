//! docs/EXTERNAL.md's Mosquitto files, loaded as a Debian box loads them:
//! its `conf.d/ferry.conf` included by Debian's stock
//! `/etc/mosquitto/mosquitto.conf` (the mosquitto package's), with the
//! doc's ACL and a password file made by `mosquitto_passwd`. Only paths
//! and the port are moved into the test's own directory; a key the two
//! files both set (Mosquitto refuses a duplicate `persistence_location`)
//! stops the broker, and the test with it. Then a device logs in as the
//! doc says and publishes on its own topic.

use std::path::Path;
#[cfg(feature = "system-tests")]
use std::process::{Child, Command, Stdio};
#[cfg(feature = "system-tests")]
use std::time::{Duration, Instant};

#[cfg(feature = "system-tests")]
use crate::support::free_port;

fn doc() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/EXTERNAL.md"))
        .expect("read docs/EXTERNAL.md")
}

/// The fenced block that follows the line `` `{file}`: ``.
fn file_block(doc: &str, file: &str) -> String {
    let label = format!("`{file}`:\n\n```\n");
    let start = doc
        .find(&label)
        .unwrap_or_else(|| panic!("docs/EXTERNAL.md has no block for {file}"))
        + label.len();
    let len = doc[start..].find("\n```\n").expect("the block's end");
    doc[start..start + len].to_owned() + "\n"
}

#[cfg(feature = "system-tests")]
struct Broker(Child);

#[cfg(feature = "system-tests")]
impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Debian's stock config is what this host happens to have (a Mosquitto
/// built from source has none): the `system-tests` feature's.
#[cfg(feature = "system-tests")]
#[test]
fn the_external_doc_s_mosquitto_files_load_with_debian_s_stock_config() {
    let stock = Path::new("/etc/mosquitto/mosquitto.conf");
    assert!(
        stock.is_file() && Path::new("/usr/sbin/mosquitto").is_file(),
        "this test needs Debian's mosquitto package (its /etc/mosquitto/mosquitto.conf): \
         `apt-get install -y mosquitto mosquitto-clients` (or run ./scripts/test.sh)"
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let d = dir.path();
    // Mosquitto, started as root, runs as the user `mosquitto`.
    std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    let moved = |text: &str| text.replace("/etc/mosquitto", &d.display().to_string());
    let port = free_port();
    let stock_text = std::fs::read_to_string(stock).expect("read the stock config");
    let conf = moved(&stock_text)
        .replace("/run/mosquitto", &d.display().to_string())
        .replace("/var/lib/mosquitto", &d.display().to_string())
        .replace("/var/log/mosquitto", &d.display().to_string());
    std::fs::create_dir(d.join("conf.d")).expect("conf.d");
    std::fs::write(d.join("mosquitto.conf"), conf).expect("write mosquitto.conf");
    let doc = doc();
    let ferry_conf = moved(&file_block(&doc, "/etc/mosquitto/conf.d/ferry.conf"))
        .replace("listener 1883", &format!("listener {port} 127.0.0.1"));
    std::fs::write(d.join("conf.d/ferry.conf"), ferry_conf).expect("write ferry.conf");
    std::fs::write(
        d.join("ferry.acl"),
        file_block(&doc, "/etc/mosquitto/ferry.acl"),
    )
    .expect("write the ACL");
    let passwd = d.join("ferry.passwd");
    for (i, user) in ["ferry", "press-7"].iter().enumerate() {
        let mut cmd = Command::new("/usr/bin/mosquitto_passwd");
        if i == 0 {
            cmd.arg("-c");
        }
        let out = cmd
            .arg("-b")
            .arg(&passwd)
            .arg(user)
            .arg("pw")
            .output()
            .expect("mosquitto_passwd");
        assert!(out.status.success(), "{out:?}");
    }
    for f in std::fs::read_dir(d).expect("list").flatten() {
        let _ = std::fs::set_permissions(
            f.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        );
    }
    let broker = Broker(
        Command::new("/usr/sbin/mosquitto")
            .arg("-c")
            .arg(d.join("mosquitto.conf"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mosquitto"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut broker = broker;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = broker.0.try_wait() {
            let mut said = std::fs::read_to_string(d.join("mosquitto.log")).unwrap_or_default();
            if let Some(mut err) = broker.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut err, &mut said);
            }
            panic!("Mosquitto refused the doc's files with the stock config ({status}): {said}");
        }
        assert!(
            Instant::now() < deadline,
            "Mosquitto did not listen in 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let publish = |user: &str, topic: &str| {
        Command::new("/usr/bin/mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
            .args(["-i", user, "-u", user, "-P", "pw", "-t", topic, "-m", "{}"])
            .output()
            .expect("mosquitto_pub")
    };
    let out = publish("press-7", "devices/press-7/up/t");
    assert!(
        out.status.success(),
        "a device logs in and publishes: {out:?}"
    );
    let out = publish("press-7", "devices/press-7/up/t");
    assert!(out.status.success(), "{out:?}");
    let bad = Command::new("/usr/bin/mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
        .args([
            "-i",
            "press-7",
            "-u",
            "press-7",
            "-P",
            "wrong",
            "-t",
            "devices/press-7/up/t",
            "-m",
            "{}",
        ])
        .output()
        .expect("mosquitto_pub");
    assert!(
        !bad.status.success(),
        "a wrong password is refused: {bad:?}"
    );
}

/// The test site broker's ACL (tests/support/mosquitto.rs) is the doc's,
/// comments aside.
#[test]
fn the_test_site_broker_s_acl_is_the_doc_s() {
    let doc_acl: Vec<String> = file_block(&doc(), "/etc/mosquitto/ferry.acl")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    let site: Vec<String> = crate::support::mosquitto::SITE_ACL
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    assert_eq!(site, doc_acl);
}
