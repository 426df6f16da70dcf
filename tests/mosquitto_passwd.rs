//! A Mosquitto password file taken as it is (issue 34): `mosquitto_passwd`
//! makes one `$6$` (`-H sha512`) and one `$7$` (its default,
//! sha512-pbkdf2) line, `ferry passwd` adds an argon2id one beside them
//! and keeps theirs, and the real gateway lets each device in with its
//! password, and only with it (`mosquitto_rr` gets its `stored` receipt,
//! or is refused), and warns once that a `$6$` hash is weak.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{ferry_command, Ferry, FerryOpts, Mosquitto};

fn mosquitto_passwd(args: &[&str]) {
    let tool = Path::new("/usr/bin/mosquitto_passwd");
    assert!(
        tool.is_file(),
        "this test needs mosquitto_passwd: install it with `apt-get install -y mosquitto` \
         (or run ./scripts/test.sh, which does)"
    );
    let out = Command::new(tool)
        .args(args)
        .output()
        .expect("run mosquitto_passwd");
    assert!(out.status.success(), "mosquitto_passwd {args:?}: {out:?}");
}

/// `mosquitto_rr` as `device` with `password`: its exit code and output.
fn request(port: u16, device: &str, password: &str, msg_id: &str) -> (Option<i32>, String) {
    let out = Command::new("/usr/bin/mosquitto_rr")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-i", device])
        .args(["-u", device, "-P", password, "-q", "1", "-W", "10"])
        .args(["-t", &format!("devices/{device}/up/t")])
        .args(["-e", &format!("devices/{device}/ack")])
        .args(["-m", &format!(r#"{{"msg_id":"{msg_id}","payload":1}}"#)])
        .output()
        .expect("run mosquitto_rr");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mosquitto_password_file_is_taken_as_it_is() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("passwd");
    let f = file.to_str().expect("a UTF-8 path");
    mosquitto_passwd(&["-H", "sha512", "-c", "-b", f, "press-1", "s3cret-1"]);
    mosquitto_passwd(&["-b", f, "press-2", "s3cret-2"]);
    let mut passwd = ferry_command()
        .arg("passwd")
        .arg(&file)
        .arg("press-3")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ferry passwd");
    passwd
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"s3cret-3\n")
        .expect("write the password");
    let out = passwd.wait_with_output().expect("ferry passwd");
    assert!(
        out.status.success(),
        "ferry passwd beside Mosquitto's lines: {out:?}"
    );
    let text = std::fs::read_to_string(&file).expect("read the file");
    let kinds: Vec<&str> = text
        .lines()
        .map(|l| {
            l.split(':')
                .nth(1)
                .unwrap_or("")
                .split('$')
                .nth(1)
                .unwrap_or("")
        })
        .collect();
    assert_eq!(kinds, ["6", "7", "argon2id"], "{text}");

    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-mosq-passwd", mq.port).with(|c| {
        c.south.auth = "password".into();
        c.south.password_file = file.clone();
    }));
    let port = ferry.south_port;
    for (i, device) in ["press-1", "press-2", "press-3"].iter().enumerate() {
        let password = format!("s3cret-{}", i + 1);
        let (code, said) = tokio::task::block_in_place(|| {
            request(port, device, &password, &format!("mp-{device}"))
        });
        assert_eq!(code, Some(0), "{device} with its password: {said}");
        assert!(said.contains("\"status\":\"stored\""), "{device}: {said}");
        let (code, said) =
            tokio::task::block_in_place(|| request(port, device, "wrong", &format!("mq-{device}")));
        assert_ne!(code, Some(0), "{device} with a wrong password: {said}");
        assert!(!said.contains("stored"), "{device}: {said}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = ferry.log();
    let weak: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("password_hashes_weak"))
        .collect();
    assert_eq!(weak.len(), 1, "{log}");
    assert!(weak[0].contains("devices=1"), "{}", weak[0]);
}
