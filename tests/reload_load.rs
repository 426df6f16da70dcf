//! `systemctl reload` under load (issue 34's must-show): TLS devices with
//! client certificates publish at a steady rate while the gateway is
//! reloaded twice, first with a bad file (refused as a whole: nothing
//! changes), then with the server certificate and the CRL swapped in
//! place, a per-device limit raised and north moved to another upstream
//! node. Checked: no device connection dropped, every message stored once
//! and delivered, new handshakes get the new certificate, a client
//! certificate revoked by the new CRL is refused, north is on the new
//! node.
//!
//! The offered rate is `FERRY_RELOAD_RATE` messages/s (default 5,000,
//! the figure) for `FERRY_RELOAD_SECS` seconds (default 6). The
//! debug build under test keeps up on two cores (every message committed
//! within 0.1 s of the load's end); `FERRY_RELOAD_BINARY=target/release/ferry`
//! runs a release build (the figures are in docs/BENCHMARKS.md).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::reload::{logged, ServerFiles};
use crate::support::certs::{client_config, Issued};
use crate::support::traffic::env_or;
use crate::support::{Backend, Device, Ferry, FerryOpts, Mosquitto, Pki, RawMqtt};

const DEVICES: usize = 8;

/// Whether a TLS handshake (and CONNECT) trusting `ca`, presenting `who`,
/// gets a CONNACK.
async fn handshakes(port: u16, ca: &std::path::Path, who: &Issued, id: &str) -> bool {
    RawMqtt::try_connect_tls(port, id, 30, client_config(ca, Some(who)))
        .await
        .is_ok()
}

/// Rewrites the lines of `path` that start with a key in `to`.
fn set_keys(path: &std::path::Path, to: &[(&str, String)]) {
    let text = std::fs::read_to_string(path).expect("read ferry.toml");
    let mut hit = HashSet::new();
    let text: String = text
        .lines()
        .map(|l| {
            let line = match to.iter().find(|(k, _)| l.starts_with(&format!("{k} = "))) {
                Some((k, v)) if hit.insert(*k) => format!("{k} = {v}"),
                _ => l.to_string(),
            };
            line + "\n"
        })
        .collect();
    assert_eq!(hit.len(), to.len(), "every key found in:\n{text}");
    std::fs::write(path, text).expect("write ferry.toml");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_swaps_certificates_limits_and_north_and_drops_and_loses_nothing() {
    let rate: u64 = env_or("FERRY_RELOAD_RATE", 5_000);
    let secs: u64 = env_or("FERRY_RELOAD_SECS", 6);
    let site = Pki::new("rl-site");
    let (old_srv, new_srv) = (Pki::new("rl-srv-old"), Pki::new("rl-srv-new"));
    let files = ServerFiles::new();
    let (cert, key) = (files.cert.clone(), files.key.clone());
    let put = |pki: &Pki| files.put(pki);
    put(&old_srv);
    let revoked = site.client("rl-revoked");
    let probe = site.client("rl-probe");
    let crl = site.crl(&[]);
    let (mq1, mq2) = (Mosquitto::start(), Mosquitto::start());
    let gw = "gw-reload-load";
    let mut opts = FerryOpts::new(gw, mq1.port);
    // The benchmark runs a release build (docs/BENCHMARKS.md).
    opts.binary = std::env::var_os("FERRY_RELOAD_BINARY").map(Into::into);
    let ferry = Ferry::start(opts.with(|c| {
        c.south.tls.cert = cert.clone();
        c.south.tls.key = key.clone();
        c.south.tls.client_ca = site.ca.clone();
        c.south.tls.crl = crl.clone();
        c.south.rate_per_s = 5_000.0;
        c.south.burst = 5_000;
    }));
    let port = ferry.south_port;
    let (_b1, _b2) = (
        Backend::connect_auto_ack(mq1.port, gw).await,
        Backend::connect_auto_ack(mq2.port, gw).await,
    );
    let mut seen1 = Backend::connect(mq1.port, gw).await;
    let mut seen2 = Backend::connect(mq2.port, gw).await;
    assert!(
        handshakes(port, &old_srv.ca, &revoked, "rl-revoked").await,
        "not revoked yet"
    );

    let mut devices = Vec::new();
    for i in 0..DEVICES {
        let id = format!("rl-dev-{i}");
        let me = site.client(&id);
        devices.push(Device::connect_tls(port, &id, client_config(&old_srv.ca, Some(&me))).await);
    }
    // The load: every device its share of `rate`, in 10 ms ticks.
    let per_tick = rate as f64 / (100 * DEVICES) as f64;
    let ticks = secs * 100;
    let senders: Vec<_> = devices
        .iter()
        .map(|d| {
            let (client, topic, id) = (d.client(), d.up_topic("t"), d.id.clone());
            tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_millis(10));
                let mut n = 0usize;
                for tick in 0..ticks {
                    every.tick().await;
                    let due = ((tick + 1) as f64 * per_tick) as usize;
                    while n < due {
                        let body = serde_json::json!({"msg_id": format!("{id}-{n}"), "payload": n});
                        assert!(client.publish(topic.as_str(), body.to_string()).await);
                        n += 1;
                    }
                }
                n
            })
        })
        .collect();
    let started = Instant::now();

    // A third in: a bad file, refused as a whole.
    tokio::time::sleep(Duration::from_secs(secs) / 3).await;
    let good = std::fs::read_to_string(&ferry.config_path).expect("read ferry.toml");
    set_keys(
        &ferry.config_path,
        &[
            ("rate_per_s", "-1".into()),
            ("crl", "\"/nonexistent/crl.pem\"".into()),
        ],
    );
    ferry.hangup();
    let log = logged(&ferry, "config_reload_refused", 2).await;
    assert!(
        log.contains("key=south.rate_per_s") && log.contains("key=south.tls.crl"),
        "{}",
        ferry.log_tail()
    );
    std::fs::write(&ferry.config_path, good).expect("put the good file back");
    assert!(
        !handshakes(port, &new_srv.ca, &probe, "rl-probe-0").await,
        "the refused reload changed nothing: still the old certificate"
    );

    // Two thirds in: the real rotation.
    tokio::time::sleep((Duration::from_secs(secs) * 2 / 3).saturating_sub(started.elapsed())).await;
    put(&new_srv);
    site.crl(&[&revoked]);
    set_keys(&ferry.config_path, &[("rate_per_s", "6000.0".into())]);
    let text = std::fs::read_to_string(&ferry.config_path).expect("read ferry.toml");
    let north = format!("port = {}", mq1.port);
    assert!(text.contains(&north), "{text}");
    let text = text.replacen(&north, &format!("port = {}", mq2.port), 1);
    std::fs::write(&ferry.config_path, text).expect("write ferry.toml");
    ferry.hangup();
    let log = logged(&ferry, "event=\"config_reloaded\"", 1).await;
    let applied = log
        .lines()
        .find(|l| l.contains("event=\"config_reloaded\""))
        .expect("the line");
    for what in [
        "south.rate_per_s",
        "north.port",
        "south TLS files (1 listener)",
    ] {
        assert!(applied.contains(what), "{what} in: {applied}");
    }
    assert!(
        !log.contains("config_reload_needs_restart"),
        "{}",
        ferry.log_tail()
    );
    assert!(
        handshakes(port, &new_srv.ca, &probe, "rl-probe-1").await,
        "a new handshake gets the new certificate"
    );
    assert!(
        !handshakes(port, &old_srv.ca, &probe, "rl-probe-2").await,
        "and not the old one"
    );
    assert!(
        !handshakes(port, &new_srv.ca, &revoked, "rl-revoked-2").await,
        "the certificate the new CRL revokes is refused"
    );

    let mut sent: HashMap<String, usize> = HashMap::new();
    for (d, s) in devices.iter().zip(senders) {
        sent.insert(d.id.clone(), s.await.expect("a sender"));
    }
    let offered = sent.values().sum::<usize>();
    let took = started.elapsed();
    // When the gateway had them all in its store (its own pace, not the
    // test's clients' at reading receipts).
    let in_store = |f: &Ferry| f.query_i64("SELECT count(*) FROM uplink", []) as usize;
    let deadline = Instant::now() + Duration::from_secs(120);
    while in_store(&ferry) < offered && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let committed_by = started.elapsed();
    // Every message stored once, each device still on its first
    // connection.
    for d in &mut devices {
        let want = sent[&d.id];
        // Counted as they come (once per receipt, not over all so far).
        let mut stored_n = 0;
        let receipts = d
            .receipts_until(Duration::from_secs(120), |r| {
                stored_n += usize::from(r.last().is_some_and(|r| r["status"] == "stored"));
                stored_n >= want
            })
            .await;
        let stored: HashSet<&str> = receipts
            .iter()
            .filter(|r| r["status"] == "stored")
            .filter_map(|r| r["msg_id"].as_str())
            .collect();
        assert_eq!(stored.len(), want, "{}: {} receipts", d.id, receipts.len());
        assert_eq!(d.subacks(), 1, "{} reconnected", d.id);
    }
    let stored_by = started.elapsed();
    // ... and delivered: the backend on either node has every one.
    let mut delivered = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while delivered.len() < offered && Instant::now() < deadline {
        for b in [&mut seen1, &mut seen2] {
            for m in b.drain_for(Duration::from_millis(100)).await {
                delivered.insert(m.msg_id().to_string());
            }
        }
    }
    assert_eq!(delivered.len(), offered, "lost north: {}", ferry.log_tail());
    crate::support::receipts::eventually(Duration::from_secs(60), "all delivered", || {
        ferry.query_i64("SELECT count(*) FROM uplink WHERE state = 'stored'", []) == 0
    })
    .await;
    let status = ferry.admin_json("/api/status");
    assert_eq!(
        status["north"]["endpoint"],
        format!("127.0.0.1:{}", mq2.port),
        "{status}"
    );
    eprintln!(
        "reload under load: {offered} messages from {DEVICES} TLS devices in {:.1} s \
         ({:.0} msgs/s offered); all committed by {:.1} s, their stored receipts read by \
         {:.1} s, all delivered by {:.1} s; 0 lost, 0 reconnects",
        took.as_secs_f64(),
        offered as f64 / took.as_secs_f64(),
        committed_by.as_secs_f64(),
        stored_by.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
}
