//! Device authentication in embedded mode (`south.auth = "password"`): a
//! CONNECT is accepted only with the device's own id as client id and
//! username and its password; every refusal gets a refused CONNACK, a log
//! line with the client id and the peer's address; SIGHUP re-reads the
//! password file without dropping connected devices. And the
//! safe-by-default rule: no anonymous devices off loopback unless asked.

use std::time::Duration;

use rumqttc::ConnectReturnCode;
use serde_json::json;

use crate::support::{
    boot_id, ferry_command, free_port, Device, Ferry, FerryOpts, Mosquitto, RawMqtt,
};

const SECS_10: Duration = Duration::from_secs(10);

async fn connack(port: u16, client_id: &str, login: Option<(&str, &str)>) -> ConnectReturnCode {
    match RawMqtt::try_connect_login(port, client_id, 30, login).await {
        Ok((_, ack)) => ack.code,
        Err(e) => panic!("{client_id}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_device_with_its_own_id_and_password_is_accepted() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(
        FerryOpts::new("gw-auth", mq.port)
            .with_passwords(&[("press-7", "s3cret-7"), ("press-8", "s3cret-8")]),
    );
    let port = ferry.south_port;

    let refused = [
        (
            "press-7",
            Some(("press-7", "wrong")),
            ConnectReturnCode::BadUserNamePassword,
        ),
        (
            "ghost",
            Some(("ghost", "s3cret-7")),
            ConnectReturnCode::BadUserNamePassword,
        ),
        // press-8's own login, under press-7's client id.
        (
            "press-7",
            Some(("press-8", "s3cret-8")),
            ConnectReturnCode::NotAuthorized,
        ),
        ("press-7", None, ConnectReturnCode::BadUserNamePassword),
    ];
    for (client_id, login, want) in refused {
        assert_eq!(
            connack(port, client_id, login).await,
            want,
            "{client_id} {login:?}"
        );
    }
    assert_eq!(
        connack(port, "press-7", Some(("press-7", "s3cret-7"))).await,
        ConnectReturnCode::Success
    );

    // Each refusal is logged with the client id and the peer's address.
    let log = ferry.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("device refused"))
        .collect();
    assert_eq!(lines.len(), refused.len(), "{lines:#?}");
    for (line, reason) in lines.iter().zip([
        "wrong password",
        "unknown device",
        "client id is not the username",
        "no username or password",
    ]) {
        assert!(line.contains(reason), "{line}");
        assert!(line.contains("peer=127.0.0.1:"), "{line}");
        assert!(
            line.contains("client_id=press-7") || line.contains("client_id=ghost"),
            "{line}"
        );
    }

    // The accepted device works end to end.
    let mut device = Device::connect(port, "press-7").await;
    let id = format!("{}-auth", boot_id());
    device.publish_envelope("t", &id, json!(1)).await;
    let (receipt, _) = device.next_receipt_for(&id, SECS_10).await;
    assert_eq!(receipt.expect("a receipt")["status"], "stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_admits_a_new_device_and_keeps_the_connected_ones() {
    let mq = Mosquitto::start();
    let ferry =
        Ferry::start(FerryOpts::new("gw-auth-hup", mq.port).with_passwords(&[("line-1", "one")]));
    let port = ferry.south_port;
    let mut old = Device::connect(port, "line-1").await;

    assert_eq!(
        connack(port, "line-2", Some(("line-2", "two"))).await,
        ConnectReturnCode::BadUserNamePassword,
        "not in the file yet"
    );
    ferry.passwd("line-2", "two");
    ferry.hangup();
    let deadline = tokio::time::Instant::now() + SECS_10;
    loop {
        let code = connack(port, "line-2", Some(("line-2", "two"))).await;
        if code == ConnectReturnCode::Success {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "line-2 still refused ({code:?}) after SIGHUP:\n{}",
            ferry.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ferry.log().contains("password file reloaded"));

    // line-2 as a device, and line-1 on its first connection still.
    let mut new = Device::connect(port, "line-2").await;
    let boot = boot_id();
    for (device, tag) in [(&mut old, "old"), (&mut new, "new")] {
        let id = format!("{boot}-{tag}");
        device.publish_envelope("t", &id, json!(tag)).await;
        let (receipt, _) = device.next_receipt_for(&id, SECS_10).await;
        assert_eq!(receipt.expect("a receipt")["status"], "stored", "{tag}");
    }
    assert_eq!(old.subacks(), 1, "line-1 was never disconnected");

    // A broken file on SIGHUP keeps the previous one in force.
    std::fs::write(&ferry.config.south.password_file, "line-1 without a hash\n").unwrap();
    ferry.hangup();
    let deadline = tokio::time::Instant::now() + SECS_10;
    while !ferry.log().contains("password file not reloaded") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}",
            ferry.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        connack(port, "line-2", Some(("line-2", "two"))).await,
        ConnectReturnCode::Success
    );
}

/// `ferry check-config` on `opts`' config: exit code and stderr.
fn check_config(opts: &FerryOpts) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ferry.toml");
    std::fs::write(&path, opts.to_toml()).unwrap();
    let out = ferry_command()
        .arg("check-config")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_devices_off_loopback_need_allow_anonymous_and_get_a_loud_warning() {
    let port = free_port();
    let exposed = FerryOpts::new("gw-anon", 1).with(|c| c.south.listen = format!("0.0.0.0:{port}"));
    let (code, err) = check_config(&exposed);
    assert_eq!(code, Some(64), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("config key `south.auth`"), "{err}");
    assert!(err.contains("south.allow_anonymous"), "{err}");

    let missing = FerryOpts::new("gw-anon", 1).with(|c| {
        c.south.auth = "password".into();
        c.south.password_file = "/nonexistent/ferry-passwd".into();
    });
    let (code, err) = check_config(&missing);
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("config key `south.password_file`"), "{err}");

    // Asked for explicitly: it runs, and says so loudly.
    let mq = Mosquitto::start();
    let opts = FerryOpts::new("gw-anon", mq.port).with(|c| c.south.allow_anonymous = true);
    let mut ferry = Ferry::start(opts.clone());
    assert!(!ferry.log().contains("ANY CLIENT"), "loopback: no warning");
    ferry.terminate(SECS_10);

    let mut opts = opts;
    opts.config.south.listen = format!("0.0.0.0:{port}");
    let dir = tempfile::tempdir().unwrap();
    opts.config.gateway.data_dir = dir.path().join("data");
    let path = dir.path().join("ferry.toml");
    std::fs::write(&path, opts.to_toml()).unwrap();
    let mut child = ferry_command()
        .args(["run", "--config"])
        .arg(&path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("ANY CLIENT"))
    });
    let line = tokio::time::timeout(SECS_10, line).await;
    let _ = child.kill();
    let _ = child.wait();
    let line = line
        .expect("the warning within 10 s")
        .unwrap()
        .expect("a warning line");
    assert!(line.contains("WARN"), "{line}");
}
