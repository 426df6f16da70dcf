//! `systemctl reload` (SIGHUP) reads and checks the whole config again
//! (issue 34): what can change live is applied at once (here `log.level`
//! and an alert threshold, seen taking effect), what cannot is named in a
//! WARN and left as it was, and a file with a problem is refused as a
//! whole, one line per problem, the gateway running on.

use std::time::Duration;

use crate::support::{Backend, Device, Ferry, FerryOpts, Mosquitto};

const SECS_20: Duration = Duration::from_secs(20);

/// Waits until the log has `n` lines with `needle` (bounded).
pub(crate) async fn logged(ferry: &Ferry, needle: &str, n: usize) -> String {
    let deadline = std::time::Instant::now() + SECS_20;
    loop {
        let log = ferry.log();
        if log.matches(needle).count() >= n {
            return log;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {n} × {needle:?} in the log:\n{}",
            ferry.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The south listener's certificate and key, at fixed paths; [`put`]
/// replaces them in place, as a rotation does.
///
/// [`put`]: ServerFiles::put
pub(crate) struct ServerFiles {
    _dir: tempfile::TempDir,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl ServerFiles {
    pub(crate) fn new() -> ServerFiles {
        let dir = tempfile::tempdir().expect("a dir for the server's files");
        let (cert, key) = (dir.path().join("server.pem"), dir.path().join("server.key"));
        ServerFiles {
            _dir: dir,
            cert,
            key,
        }
    }

    /// A server certificate for `ferry-south` from `pki`, put in place.
    pub(crate) fn put(&self, pki: &crate::support::Pki) {
        let issued = pki.server("ferry-south");
        std::fs::copy(&issued.cert, &self.cert).expect("put the certificate");
        std::fs::copy(&issued.key, &self.key).expect("put the key");
    }
}

fn edit(ferry: &Ferry, from: &str, to: &str) {
    let text = std::fs::read_to_string(&ferry.config_path).expect("read ferry.toml");
    assert!(text.contains(from), "{from:?} in:\n{text}");
    std::fs::write(&ferry.config_path, text.replacen(from, to, 1)).expect("write ferry.toml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_what_can_change_live_names_the_rest_and_refuses_a_bad_file() {
    let mq = Mosquitto::start();
    let gw = "gw-reload";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    // A backend that never acks: the uplink below waits, and ages.
    let _backend = Backend::connect(mq.port, gw).await;
    let mut device = Device::connect(ferry.south_port, "press-r").await;
    device
        .publish_envelope("t", "reload-1", serde_json::json!({"v": 1}))
        .await;
    assert_eq!(
        device.next_receipt(SECS_20).await.expect("a receipt")["status"],
        "stored"
    );

    // Live: the log level and the backlog-age threshold. Not live: the
    // gateway's id (its store, its topics and its sessions are named so).
    edit(&ferry, "level = \"info\"", "level = \"debug\"");
    edit(&ferry, "id = \"gw-reload\"", "id = \"gw-reload-2\"");
    edit(
        &ferry,
        "backlog_age_s = ",
        "backlog_age_s = 1\n# was: backlog_age_s = ",
    );
    let before = ferry.log().len();
    ferry.hangup();
    let log = logged(&ferry, "config_reloaded", 1).await;
    let after = &log[before..];
    let line = |event: &str| {
        after
            .lines()
            .find(|l| l.contains(event))
            .unwrap_or_else(|| panic!("no {event}:\n{after}"))
            .to_string()
    };
    let applied = line("event=\"config_reloaded\"");
    assert!(
        applied.contains("alerts.backlog_age_s") && applied.contains("log.level"),
        "{applied}"
    );
    let restart = line("config_reload_needs_restart");
    assert!(
        restart.contains("WARN") && restart.contains("gateway.id"),
        "{restart}"
    );
    assert!(!applied.contains("gateway.id"), "{applied}");
    // The new level is in force: DEBUG lines follow.
    let deadline = std::time::Instant::now() + SECS_20;
    while !ferry.log()[before..].contains(" DEBUG ") {
        assert!(
            std::time::Instant::now() < deadline,
            "no DEBUG line after the reload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The new threshold too: the waiting uplink raises backlog_age.
    logged(&ferry, "kind=\"backlog_age\"", 1).await;
    // The id was not applied: north stays up, as the gateway it was.
    assert_eq!(ferry.admin_json("/api/status")["north"]["up"], true);
    assert_eq!(ferry.admin_json("/api/status")["gateway"], gw);

    // A file with problems is refused as a whole, one line each.
    edit(&ferry, "format = \"text\"", "format = \"xml\"");
    edit(
        &ferry,
        "batch_size = ",
        "batch_size = 0\n# was: batch_size = ",
    );
    ferry.hangup();
    let log = logged(&ferry, "config_reload_refused", 2).await;
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("config_reload_refused"))
        .collect();
    assert!(
        refused.iter().any(|l| l.contains("key=log.format"))
            && refused
                .iter()
                .any(|l| l.contains("key=downlink.batch_size")),
        "{refused:#?}"
    );
    assert_eq!(
        log.matches("event=\"config_reloaded\"").count(),
        1,
        "not applied"
    );
    assert!(ferry.pid().is_some(), "still running");
}

/// `mosquitto_pub` over TLS trusting `ca`: whether it got its PUBACK.
fn publishes_trusting(port: u16, ca: &std::path::Path, id: &str) -> bool {
    tokio::task::block_in_place(|| {
        std::process::Command::new("/usr/bin/mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
            .arg("--cafile")
            .arg(ca)
            .args(["-i", id, "-t", &format!("devices/{id}/up/t")])
            .args(["-m", r#"{"msg_id":"tls-r","payload":1}"#])
            .output()
            .expect("run mosquitto_pub")
            .status
            .success()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_puts_a_rotated_certificate_in_use_and_connected_devices_stay() {
    use crate::support::Pki;
    let (old_ca, new_ca) = (Pki::new("reload-old"), Pki::new("reload-new"));
    let files = ServerFiles::new();
    let (cert, put) = (files.cert.clone(), |pki: &Pki| files.put(pki));
    let key = files.key.clone();
    put(&old_ca);
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-reload-tls", mq.port).with(|c| {
        c.south.tls.cert = cert.clone();
        c.south.tls.key = key.clone();
    }));
    let port = ferry.south_port;
    assert!(
        publishes_trusting(port, &old_ca.ca, "tls-a"),
        "the old certificate at start"
    );
    assert!(
        !publishes_trusting(port, &new_ca.ca, "tls-b"),
        "not yet the new one"
    );
    let mut connected = Device::connect_tls(port, "tls-stays", old_ca.client_config(None)).await;

    // The rotation: new files in place, then `systemctl reload`.
    put(&new_ca);
    let before = ferry.log().matches("south TLS files (1 listener)").count();
    ferry.hangup();
    logged(&ferry, "south TLS files (1 listener)", before + 1).await;
    assert!(
        publishes_trusting(port, &new_ca.ca, "tls-c"),
        "new handshakes: the new one"
    );
    assert!(
        !publishes_trusting(port, &old_ca.ca, "tls-d"),
        "and not the old one"
    );
    // The device connected before keeps its connection.
    connected
        .publish_envelope("t", "tls-stayed", serde_json::json!({"v": 1}))
        .await;
    let (r, _) = connected.next_receipt_for("tls-stayed", SECS_20).await;
    assert_eq!(
        r.expect("a receipt on the old connection")["status"],
        "stored"
    );

    // A certificate that cannot be read: the reload is refused, naming
    // it, and the listener keeps what it had.
    std::fs::write(&cert, "not a certificate").expect("spoil the certificate");
    ferry.hangup();
    let log = logged(&ferry, "config_reload_refused", 1).await;
    assert!(
        log.lines()
            .any(|l| l.contains("config_reload_refused") && l.contains("key=south.tls.cert")),
        "{log}"
    );
    assert!(
        publishes_trusting(port, &new_ca.ca, "tls-e"),
        "still the good one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_puts_new_per_device_limits_in_force() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-reload-rate", mq.port));
    let mut device = Device::connect(ferry.south_port, "press-rate").await;
    let statuses = |receipts: &[serde_json::Value]| -> Vec<String> {
        receipts
            .iter()
            .filter_map(|r| r["status"].as_str().map(str::to_string))
            .collect()
    };
    let before = burst(&mut device, "before").await;
    assert_eq!(
        statuses(&before),
        ["stored"; 5],
        "within the start's limits"
    );
    let text = std::fs::read_to_string(&ferry.config_path).expect("read ferry.toml");
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("rate_per_s = ") {
                "rate_per_s = 0.5".to_string()
            } else if l.starts_with("burst = ") {
                "burst = 1".to_string()
            } else {
                l.to_string()
            }
        })
        .map(|l| l + "\n")
        .collect();
    std::fs::write(&ferry.config_path, text).expect("write ferry.toml");
    ferry.hangup();
    let log = logged(&ferry, "event=\"config_reloaded\"", 1).await;
    assert!(log.contains("south.rate_per_s"), "{}", ferry.log_tail());
    // The door takes them as the reload hands them over; the burst's own
    // tokens, refilled at the old rate, are spent by its first publish.
    let after = burst(&mut device, "after").await;
    let refused = statuses(&after).iter().filter(|s| *s == "rejected").count();
    assert!(refused >= 3, "over the new rate: {after:?}");
}

/// Five envelopes at once from `device`, tagged `tag`: their receipts.
async fn burst(device: &mut Device, tag: &str) -> Vec<serde_json::Value> {
    let ids: Vec<String> = (0..5).map(|i| format!("{tag}-{i}")).collect();
    for id in &ids {
        device
            .publish_envelope("t", id, serde_json::json!({"v": 1}))
            .await;
    }
    device
        .receipts_until(SECS_20, |r| r.len() >= ids.len())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_puts_a_new_downlink_batch_size_in_force() {
    let mq = Mosquitto::start();
    let gw = "gw-reload-down";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    let backend = Backend::connect(mq.port, gw).await;
    let device = ferry::ids::DeviceId::new("panel-r").expect("a device id");
    for i in 0..3 {
        backend
            .publish_raw(
                &crate::support::north_topics(gw).down_to(&device),
                serde_json::json!({"msg_id": format!("r-{i}"), "payload": i})
                    .to_string()
                    .into_bytes(),
            )
            .await;
    }
    crate::support::receipts::eventually(SECS_20, "3 downlinks queued", || {
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery WHERE device = 'panel-r'",
            [],
        ) == 3
    })
    .await;
    let text = std::fs::read_to_string(&ferry.config_path).expect("read ferry.toml");
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("batch_size = ") {
                "batch_size = 1"
            } else {
                l
            }
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&ferry.config_path, text).expect("write ferry.toml");
    ferry.hangup();
    let log = logged(&ferry, "event=\"config_reloaded\"", 1).await;
    assert!(log.contains("downlink.batch_size"), "{}", ferry.log_tail());
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new("/usr/bin/mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &ferry.south_port.to_string()])
            .args([
                "-i",
                "panel-r",
                "-q",
                "1",
                "-t",
                "devices/panel-r/inbox",
                "-C",
                "1",
                "-W",
                "10",
            ])
            .output()
            .expect("run mosquitto_sub")
    });
    let batch: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(
        batch["messages"].as_array().map(Vec::len),
        Some(1),
        "{batch}"
    );
    assert_eq!(batch["more"], true, "{batch}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_switches_the_log_to_json() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-reload-json", mq.port));
    edit(&ferry, "format = \"text\"", "format = \"json\"");
    ferry.hangup();
    let log = logged(&ferry, "config_reloaded", 1).await;
    let line = log
        .lines()
        .find(|l| l.contains("config_reloaded"))
        .expect("the line");
    let json: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    assert_eq!(json["event"], "config_reloaded", "{json}");
    assert!(
        json["applied"]
            .as_str()
            .unwrap_or("")
            .contains("log.format"),
        "{json}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_puts_a_new_disk_budget_in_force_both_ways() {
    let mq = Mosquitto::start();
    // No backend: what is stored stays undelivered, so it takes room.
    let ferry = Ferry::start(FerryOpts::new("gw-reload-budget", mq.port).with(|c| {
        c.retry.max_attempts = 100_000;
    }));
    let mut device = Device::connect(ferry.south_port, "press-b").await;
    for i in 0..30 {
        assert_eq!(
            send(&mut device, &format!("big-{i}")).await["status"],
            "stored"
        );
    }
    // Down to the smallest budget: the 1.5 MB of uplinks are over it.
    let text = std::fs::read_to_string(&ferry.config_path).expect("read ferry.toml");
    let line = text
        .lines()
        .find(|l| l.starts_with("max_db_bytes = "))
        .expect("the key")
        .to_string();
    edit(&ferry, &line, "max_db_bytes = 1048576");
    ferry.hangup();
    let log = logged(&ferry, "event=\"config_reloaded\"", 1).await;
    assert!(log.contains("store.max_db_bytes"), "{}", ferry.log_tail());
    let r = send(&mut device, "after-lower").await;
    assert_eq!(r["status"], "rejected", "{r}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("disk_budget"),
        "{r}"
    );
    // Back up: taken again once the writer measures (within its clock's
    // 10 s commit).
    edit(&ferry, "max_db_bytes = 1048576", &line);
    ferry.hangup();
    logged(&ferry, "event=\"config_reloaded\"", 2).await;
    let deadline = std::time::Instant::now() + SECS_20;
    let mut n = 0;
    loop {
        n += 1;
        let r = send(&mut device, &format!("after-raise-{n}")).await;
        if r["status"] == "stored" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still refused: {r}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A 50 kB envelope `id` from `device`: its receipt.
async fn send(device: &mut Device, id: &str) -> serde_json::Value {
    let blob = "x".repeat(50_000);
    device
        .publish_envelope("blob", id, serde_json::json!({ "blob": blob }))
        .await;
    let (r, _) = device.next_receipt_for(id, SECS_20).await;
    r.unwrap_or_else(|| panic!("no receipt for {id}"))
}

/// `mosquitto_pub -q 1` of `body` on `topic` as client `id`.
fn plain_publish(port: u16, id: &str, topic: &str, body: &str) {
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new("/usr/bin/mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
            .args(["-i", id, "-t", topic, "-m", body])
            .output()
            .expect("run mosquitto_pub (Debian's mosquitto-clients)")
    });
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_adds_a_plain_topic_and_the_gateway_reads_it() {
    let mq = Mosquitto::start();
    let gw = "gw-reload-plain";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port).with(|c| {
        c.south.plain_topics = vec!["plant/{device}/pressure".into()];
    }));
    let mut backend = Backend::connect_auto_ack(mq.port, gw).await;
    let port = ferry.south_port;
    // Not a plain topic yet: refused, nothing north.
    plain_publish(port, "press-p", "plant/press-p/temp", "20.5");
    let early = backend.drain_for(Duration::from_secs(1)).await;
    assert!(early.is_empty(), "{early:?}");

    edit(
        &ferry,
        "plain_topics = [\"plant/{device}/pressure\"]",
        "plain_topics = [\"plant/{device}/pressure\", \"plant/{device}/temp\"]",
    );
    ferry.hangup();
    let log = logged(&ferry, "event=\"config_reloaded\"", 1).await;
    assert!(log.contains("south.plain_topics"), "{}", ferry.log_tail());
    assert!(!log.contains("config_reload_needs_restart"), "{log}");
    logged(&ferry, "event=\"plain_topic_added\"", 1).await;
    plain_publish(port, "press-p", "plant/press-p/temp", "21.5");
    plain_publish(port, "press-p", "plant/press-p/pressure", "3.2");
    let got = backend.messages_until(SECS_20, |all| all.len() >= 2).await;
    let topics: Vec<&str> = got
        .iter()
        .filter_map(|m| m.body["topic"].as_str())
        .collect();
    assert_eq!(
        topics,
        ["plant/press-p/temp", "plant/press-p/pressure"],
        "{got:?}"
    );
    assert_eq!(got[0].body["payload"], 21.5, "the new topic's publish");
    assert_eq!(got[0].device(), "press-p");
}
