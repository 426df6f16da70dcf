//! TLS on every link, with certificates made at test time (a CA, servers
//! for 127.0.0.1, devices whose certificate CN is their id):
//! - the embedded device listener, with and without client certificates,
//!   and a device held by its certificate to its own topics;
//! - north to a Mosquitto TLS listener that requires ferry's certificate;
//! - external south to a site Mosquitto over TLS;
//! - handshakes that never finish: they delay nobody and are closed after
//!   `south.connect_timeout_ms`;
//! - a bad certificate, key or CA file: one line naming the key, exit 64.

use std::path::Path;
use std::time::{Duration, Instant};

use ferry::ids::DeviceId;
use rumqttc::{ConnectReturnCode, SubscribeReasonCode};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use crate::support::certs::{client_config, Issued};
use crate::support::forgeries;
use crate::support::receipts::status;
use crate::support::{
    self, boot_id, check_config, device_topics, north_connects, north_topics, run_on_config,
    Backend, BareClient, Device, Ferry, FerryOpts, Mode, Mosquitto, Pki, RawMqtt, TlsListener,
};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

/// Options for an embedded gateway whose device listener serves TLS with a
/// server certificate from `pki` and, with `client_certs`, requires device
/// certificates `pki` issued.
fn tls_opts(gateway: &str, north_port: u16, pki: &Pki, client_certs: bool) -> FerryOpts {
    let server = pki.server("ferry-south");
    FerryOpts::new(gateway, north_port).with(|c| {
        c.south.tls.cert = server.cert;
        c.south.tls.key = server.key;
        if client_certs {
            c.south.tls.client_ca = pki.ca.clone();
        }
    })
}

/// A device's envelope, as JSON text.
fn envelope(msg_id: &str) -> String {
    json!({"msg_id": msg_id, "payload": {"t": 21.5}}).to_string()
}

/// Reads a bare client's messages (receipts and batches alike) until
/// `done` holds or `timeout` passes.
async fn read_until(
    client: &mut BareClient,
    timeout: Duration,
    mut done: impl FnMut(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut all = Vec::new();
    while !done(&all) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match client.next_json(left).await {
            Some(v) => all.push(v),
            None => break,
        }
    }
    all
}

fn has_receipt(all: &[Value], msg_id: &str, want: &str) -> bool {
    all.iter()
        .any(|v| v["msg_id"] == json!(msg_id) && status(v) == want)
}

fn has_inbox_message(all: &[Value], msg_id: &str) -> bool {
    all.iter().any(|v| {
        v["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["msg_id"] == json!(msg_id)))
    })
}

/// The lines of ferry's log at ERROR: an operator reads every one.
fn error_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" ERROR ")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_over_tls_gets_stored_delivered_and_its_downlink() {
    let pki = Pki::new("tls-basic");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(tls_opts("gw-tls", mq.port, &pki, false));
    let backend = Backend::connect_auto_ack(mq.port, "gw-tls").await;
    let boot = boot_id();

    let dt = device_topics("tls-dev");
    let mut dev = BareClient::connect_tls(
        ferry.south_port,
        "tls-dev",
        vec![dt.ack(), dt.inbox()],
        pki.client_config(None),
    )
    .await;
    let up = format!("{boot}-up");
    dev.publish(&dt.up("t"), envelope(&up)).await;
    let down = format!("{boot}-down");
    let device = DeviceId::new("tls-dev").expect("device id");
    backend
        .publish_raw(
            &north_topics("gw-tls").down_to(&device),
            json!({"msg_id": down, "payload": "shift B"})
                .to_string()
                .into_bytes(),
        )
        .await;
    let seen = read_until(&mut dev, SECS_30, |all| {
        has_receipt(all, &up, "delivered") && has_inbox_message(all, &down)
    })
    .await;
    assert!(has_receipt(&seen, &up, "stored"), "{seen:?}");
    assert!(has_receipt(&seen, &up, "delivered"), "{seen:?}");
    assert!(has_inbox_message(&seen, &down), "{seen:?}");

    // The listener speaks TLS only: plain MQTT gets no CONNACK.
    let plain = RawMqtt::try_connect(ferry.south_port, "tls-plain", 30).await;
    assert!(plain.is_err(), "plain MQTT on the TLS port was answered");
    // A device trusting another CA refuses the gateway's certificate: the
    // log says so in words, not only as the raw TLS alert.
    let rogue = Pki::new("tls-basic-rogue");
    let out = tokio::task::block_in_place(|| {
        std::process::Command::new("/usr/bin/mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &ferry.south_port.to_string()])
            .arg("--cafile")
            .arg(&rogue.ca)
            .args([
                "-i",
                "tls-rogue-ca",
                "-t",
                "devices/tls-rogue-ca/up/t",
                "-m",
                "{}",
            ])
            .output()
            .expect("run mosquitto_pub")
    });
    assert!(!out.status.success(), "{out:?}");
    let deadline = std::time::Instant::now() + SECS_30;
    while !ferry
        .log()
        .contains("does not trust the gateway's certificate")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no hint in words: {}",
            ferry.log_tail()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(error_lines(&ferry.log()), Vec::<&str>::new());
}

/// `south.listeners`: a TLS listener and a plain loopback listener side
/// by side on one broker; a device on each stores and gets its receipts,
/// and each listener speaks only its own transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_listener_and_a_plain_loopback_listener_serve_side_by_side() {
    let pki = Pki::new("tls-two");
    let mq = Mosquitto::start();
    let server = pki.server("ferry-south");
    let opts = FerryOpts::new("gw-two", mq.port).with(|c| {
        c.south.tls.cert = server.cert;
        c.south.tls.key = server.key;
        c.south.listeners = vec![
            crate::support::listener("127.0.0.1:0", "tls"),
            crate::support::listener("127.0.0.1:0", "tcp"),
        ];
    });
    let ferry = Ferry::start(opts);
    let port = |i: usize| -> u16 {
        let listen = &ferry.config.south.listeners[i].listen;
        listen.rsplit_once(':').unwrap().1.parse().unwrap()
    };
    let (tls_port, plain_port) = (port(0), port(1));
    let _backend = Backend::connect_auto_ack(mq.port, "gw-two").await;
    let boot = boot_id();

    let over_tls = device_topics("two-tls");
    let mut secure = BareClient::connect_tls(
        tls_port,
        "two-tls",
        vec![over_tls.ack()],
        pki.client_config(None),
    )
    .await;
    let plain_topics = device_topics("two-plain");
    let mut plain = BareClient::connect(plain_port, "two-plain", vec![plain_topics.ack()]).await;
    let (a, b) = (format!("{boot}-tls"), format!("{boot}-plain"));
    secure.publish(&over_tls.up("t"), envelope(&a)).await;
    plain.publish(&plain_topics.up("t"), envelope(&b)).await;
    let seen = read_until(&mut secure, SECS_30, |all| {
        has_receipt(all, &a, "delivered")
    })
    .await;
    assert!(has_receipt(&seen, &a, "stored"), "{seen:?}");
    let seen = read_until(&mut plain, SECS_30, |all| has_receipt(all, &b, "delivered")).await;
    assert!(has_receipt(&seen, &b, "stored"), "{seen:?}");

    // Each listener speaks its own transport only.
    assert!(
        RawMqtt::try_connect(tls_port, "two-x", 30).await.is_err(),
        "plain MQTT on the TLS listener was answered"
    );
    assert!(
        ferry.log().contains(&format!(
            "127.0.0.1:{tls_port} (TLS), 127.0.0.1:{plain_port}"
        )),
        "the start line names both listeners"
    );
    assert_eq!(error_lines(&ferry.log()), Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_a_device_presenting_its_own_certificate_connects() {
    let pki = Pki::new("tls-cc");
    let rogue = Pki::new("tls-rogue");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(tls_opts("gw-tls-cc", mq.port, &pki, true));
    let port = ferry.south_port;
    let a = pki.client("cc-a");

    // No certificate, or one another CA issued: the handshake is refused.
    for (what, tls) in [
        ("no certificate", pki.client_config(None)),
        (
            "a certificate from another CA",
            client_config(&pki.ca, Some(&rogue.client("cc-a"))),
        ),
    ] {
        let got = RawMqtt::try_connect_tls(port, "cc-a", 30, tls).await;
        assert!(got.is_err(), "{what}: got a CONNACK");
    }

    // A certificate, and a client id that is not its CN (or no id, or a
    // certificate whose CN cannot be a device id): refused, then closed.
    // A client id that can be no device id is refused for that first
    // (CONNACK 2, identifier rejected), whatever the certificate says.
    let not_authorized = ConnectReturnCode::NotAuthorized;
    let not_an_id = ConnectReturnCode::BadClientId;
    let refused: [(&str, &Issued, &str, ConnectReturnCode); 4] = [
        ("another device's id", &a, "cc-b", not_authorized),
        ("an empty client id", &a, "", not_an_id),
        (
            "no CN",
            &pki.client_without_cn("cc-a"),
            "cc-a",
            not_authorized,
        ),
        (
            "a CN that is no device id",
            &pki.client("cc a"),
            "cc a",
            not_an_id,
        ),
    ];
    for (what, cert, client_id, code) in refused {
        let tls = pki.client_config(Some(cert));
        let (mut raw, ack) = RawMqtt::try_connect_tls(port, client_id, 30, tls)
            .await
            .unwrap_or_else(|e| panic!("{what}: no CONNACK: {e}"));
        assert_eq!(ack.code, code, "{what}");
        assert!(raw.closed_within(SECS_10).await, "{what}: left open");
    }

    // Its own id: accepted, and it works.
    let mut device = Device::connect_tls(port, "cc-a", pki.client_config(Some(&a))).await;
    device.publish_envelope("t", "cc-a-1", json!(1)).await;
    let r = device.next_receipt(SECS_10).await.expect("a receipt");
    assert_eq!(status(&r), "stored", "{r}");

    let log = ferry.log();
    assert!(
        log.contains("client certificate refused") && log.contains("peer=127.0.0.1:"),
        "a refused certificate is a warning naming the peer"
    );
    assert!(log.contains("CONNECT refused: not the client its certificate names"));
    assert_eq!(error_lines(&log), Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_is_held_by_its_certificate_to_its_own_topics() {
    let pki = Pki::new("tls-iso");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(tls_opts("gw-tls-iso", mq.port, &pki, true));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-tls-iso").await;
    let port = ferry.south_port;
    let boot = boot_id();
    let (cert_a, cert_b) = (pki.client("iso-a"), pki.client("iso-b"));
    let (bt, at) = (device_topics("iso-b"), device_topics("iso-a"));

    let mut b = BareClient::connect_tls(
        port,
        "iso-b",
        vec![bt.ack(), bt.inbox()],
        pki.client_config(Some(&cert_b)),
    )
    .await;

    // A may subscribe to its own ack and inbox, nothing of B's.
    let mut raw = RawMqtt::connect_tls(port, "iso-a", 30, pki.client_config(Some(&cert_a))).await;
    let filters = vec![
        at.ack(),
        at.inbox(),
        bt.ack(),
        bt.inbox(),
        "devices/#".to_string(),
        "devices/+/ack".to_string(),
    ];
    let codes = raw.subscribe(&filters).await;
    assert_eq!(codes.len(), filters.len(), "{codes:?}");
    for (filter, code) in filters.iter().zip(&codes) {
        let granted = !matches!(code, SubscribeReasonCode::Failure);
        assert_eq!(
            granted,
            filter.starts_with("devices/iso-a/"),
            "{filter}: {code:?}"
        );
    }
    drop(raw);

    // A, with its certificate, publishes on B's topics: rejected.
    let mut a = Device::connect_tls(port, "iso-a", pki.client_config(Some(&cert_a))).await;
    let forged = format!("{boot}-forged");
    let attempts = forgeries(&bt, envelope(&forged), &format!("{boot}-x"));
    for (topic, body) in &attempts {
        a.publish_raw(topic, body.clone()).await;
    }
    let got = a
        .receipts_until(SECS_10, |r| r.len() >= attempts.len())
        .await;
    assert_eq!(got.len(), attempts.len(), "one answer per attempt: {got:?}");
    for r in &got {
        assert_eq!(status(r), "rejected", "{r}");
        assert!(
            r["reason"]
                .as_str()
                .unwrap_or("")
                .starts_with("unauthorized"),
            "{r}"
        );
    }

    // B's own traffic goes on; the backend sees nothing as B but B's own.
    let own = format!("{boot}-own");
    b.publish(&bt.up("t"), envelope(&own)).await;
    let seen = read_until(&mut b, SECS_30, |all| has_receipt(all, &own, "delivered")).await;
    assert!(has_receipt(&seen, &own, "delivered"), "{seen:?}");
    assert!(
        seen.iter().all(|v| v["msg_id"] != json!(forged)),
        "B saw the forged message: {seen:?}"
    );
    let north = backend.drain_for(Duration::from_millis(300)).await;
    assert!(
        north.iter().all(|m| m.msg_id() != forged),
        "the forged uplink went north: {north:?}"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM uplink WHERE device = 'iso-b' AND msg_id = ?1",
            [forged.as_str()]
        ),
        0,
        "nothing stored as B"
    );
    assert!(
        seen.iter()
            .all(|v| v["msg_id"] != json!(format!("{boot}-x"))),
        "B got A's forged receipt: {seen:?}"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT COALESCE(MAX(delivered_upto), 0) FROM devices WHERE device = 'iso-b'",
            []
        ),
        0,
        "A's confirm did not move B's cursor"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_device_certificate_is_refused() {
    let pki = Pki::new("tls-crl");
    let (revoked, kept) = (pki.client("crl-old"), pki.client("crl-new"));
    let crl = pki.crl(&[&revoked]);
    let mq = Mosquitto::start();
    let ferry = Ferry::start(
        tls_opts("gw-tls-crl", mq.port, &pki, true).with(|c| c.south.tls.crl = crl.clone()),
    );
    let got = RawMqtt::try_connect_tls(
        ferry.south_port,
        "crl-old",
        30,
        pki.client_config(Some(&revoked)),
    )
    .await;
    assert!(got.is_err(), "a revoked certificate got a CONNACK");
    let mut device =
        Device::connect_tls(ferry.south_port, "crl-new", pki.client_config(Some(&kept))).await;
    device.publish_envelope("t", "crl-new-1", json!(1)).await;
    let r = device.next_receipt(SECS_10).await.expect("a receipt");
    assert_eq!(status(&r), "stored", "{r}");
    assert!(ferry.log().contains("client certificate refused"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn north_over_tls_with_a_client_certificate_reaches_the_backend() {
    let pki = Pki::new("tls-north");
    let server = pki.server("upstream");
    let mq = Mosquitto::start_tls(&TlsListener {
        ca: pki.ca.clone(),
        cert: server.cert.clone(),
        key: server.key.clone(),
        require_certificate: true,
    });
    let tls_port = mq.tls_port.expect("a TLS listener");
    let ferry_cert = pki.client("ferry-edge");
    let ferry = Ferry::start(FerryOpts::new("gw-tls-north", tls_port).with(|c| {
        c.north.tls.ca = pki.ca.clone();
        c.north.tls.cert = ferry_cert.cert.clone();
        c.north.tls.key = ferry_cert.key.clone();
    }));
    // The backend stays on the plain listener.
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-tls-north").await;
    let mut device = Device::connect(ferry.south_port, "north-dev").await;
    device.publish_envelope("t", "north-dev-1", json!(1)).await;
    let north = backend
        .messages_until(SECS_30, |all| {
            all.iter().any(|m| m.msg_id() == "north-dev-1")
        })
        .await;
    assert!(
        north
            .iter()
            .any(|m| m.msg_id() == "north-dev-1" && m.device() == "north-dev"),
        "{north:?}"
    );
    let got = device
        .receipts_until(SECS_30, |all| all.iter().any(|r| status(r) == "delivered"))
        .await;
    assert!(got.iter().any(|r| status(r) == "delivered"), "{got:?}");
    assert!(north_connects(&ferry.log()) >= 1);

    // A gateway that trusts another CA never gets that far.
    let rogue = Pki::new("tls-north-rogue");
    let doubtful = Ferry::start(FerryOpts::new("gw-tls-north-x", tls_port).with(|c| {
        c.north.tls.ca = rogue.ca.clone();
        c.north.tls.cert = ferry_cert.cert.clone();
        c.north.tls.key = ferry_cert.key.clone();
    }));
    let deadline = Instant::now() + SECS_10;
    while !doubtful.log().contains("link down") {
        assert!(Instant::now() < deadline, "no failed north connect logged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = doubtful.log();
    assert_eq!(
        north_connects(&log),
        0,
        "connected to an untrusted upstream"
    );
    assert!(log.contains("UnknownIssuer"), "the reason is named: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_south_over_tls_to_the_site_broker() {
    let pki = Pki::new("tls-site");
    let server = pki.server("site-broker");
    let ferry_cert = pki.client("ferry-south");
    let mq = Mosquitto::start();
    let mut opts = FerryOpts::new("gw-tls-site", mq.port)
        .in_mode(Mode::External)
        .with(|c| {
            c.south.site_tls.ca = pki.ca.clone();
            c.south.site_tls.cert = ferry_cert.cert.clone();
            c.south.site_tls.key = ferry_cert.key.clone();
        });
    opts.site_tls = Some(TlsListener {
        ca: pki.ca.clone(),
        cert: server.cert.clone(),
        key: server.key.clone(),
        require_certificate: true,
    });
    let ferry = Ferry::start(opts);
    let site = ferry.site.as_ref().expect("a site broker");
    assert_eq!(
        Some(ferry.config.south.port),
        site.tls_port,
        "ferry is on the site broker's TLS listener"
    );
    let _backend = Backend::connect_auto_ack(mq.port, "gw-tls-site").await;
    // Devices stay on the site broker's plain listener.
    let mut device = Device::connect(ferry.south_port, "site-dev").await;
    device.publish_envelope("t", "site-dev-1", json!(1)).await;
    let got = device
        .receipts_until(SECS_30, |all| all.iter().any(|r| status(r) == "delivered"))
        .await;
    assert!(got.iter().any(|r| status(r) == "stored"), "{got:?}");
    assert!(got.iter().any(|r| status(r) == "delivered"), "{got:?}");
}

/// Opens `n` TCP connections to `port` that never send a byte.
async fn silent_connections(port: u16, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("tcp connect");
        all.push(s);
    }
    all
}

/// Whether the peer has closed `s` (a read sees the end) within `timeout`.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(s: &mut S, timeout: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(timeout, s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_stalled_tls_handshakes_do_not_delay_a_device() {
    // With the handshake inline in the accept loop, the first of these
    // held up every later connection until it timed out.
    support::raise_fd_limit();
    let pki = Pki::new("tls-stall");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(tls_opts("gw-tls-stall", mq.port, &pki, true));
    let port = ferry.south_port;
    let mut silent = silent_connections(port, 500).await;
    // And some that finish the handshake but never send CONNECT.
    let cert = pki.client("stall-quiet");
    let mut quiet = Vec::new();
    for _ in 0..20 {
        let tls = pki.client_config(Some(&cert));
        quiet.push(
            support::raw_mqtt::tls_stream(port, tls)
                .await
                .expect("handshake"),
        );
    }

    let started = Instant::now();
    let cert = pki.client("stall-prompt");
    let mut device =
        Device::connect_tls(port, "stall-prompt", pki.client_config(Some(&cert))).await;
    device
        .publish_envelope("t", "stall-prompt-1", json!(1))
        .await;
    let r = device.next_receipt(SECS_10).await.expect("a receipt");
    let took = started.elapsed();
    assert_eq!(status(&r), "stored", "{r}");
    eprintln!("TLS connect and `stored` with 520 stalled connections open: {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");

    // They were stalled all along: still open (the timeout is 5 s).
    for s in silent.iter_mut().step_by(100) {
        assert!(!closed_within(s, Duration::from_millis(10)).await);
    }
    assert!(!closed_within(&mut quiet[0], Duration::from_millis(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_tls_client_is_closed_after_the_connect_timeout() {
    let pki = Pki::new("tls-timeout");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(
        tls_opts("gw-tls-timeout", mq.port, &pki, true).with(|c| c.south.connect_timeout_ms = 300),
    );
    let port = ferry.south_port;
    let cert = pki.client("timeout-quiet");
    let opened = Instant::now();
    let mut silent = silent_connections(port, 5).await;
    let mut quiet = support::raw_mqtt::tls_stream(port, pki.client_config(Some(&cert)))
        .await
        .expect("handshake");
    for s in silent.iter_mut() {
        assert!(closed_within(s, Duration::from_secs(3)).await, "left open");
    }
    assert!(closed_within(&mut quiet, Duration::from_secs(3)).await);
    let took = opened.elapsed();
    eprintln!("stalled TLS clients closed after {took:?} (timeout 300 ms)");
    assert!(
        took >= Duration::from_millis(280),
        "closed before the timeout: {took:?}"
    );
    let log = ferry.log();
    assert!(log.contains("TLS handshake not done within the connection timeout"));
    assert_eq!(error_lines(&log), Vec::<&str>::new());
}

/// A config for `check-config` with `change` applied, as TOML.
fn config_with(change: impl FnOnce(&mut ferry::config::RawConfig)) -> String {
    FerryOpts::new("gw-tls-conf", 1884).with(change).to_toml()
}

/// Asserts ferry refused the config with exit 64 and one line naming `key`.
fn assert_refused(got: (Option<i32>, String), key: &str) {
    let (code, stderr) = got;
    assert_eq!(code, Some(64), "{key}: stderr: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains(&format!("`{key}`")),
        "must name {key}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_bad_certificate_key_or_ca_file_is_one_line_naming_the_key_and_exit_64() {
    let pki = Pki::new("tls-conf");
    let server = pki.server("conf");
    let other = pki.server("other");
    let garbage = support::write_file(pki.dir.path(), "garbage.pem", "not a certificate\n");
    let missing = Path::new("/nonexistent/ferry/cert.pem").to_path_buf();

    let good = config_with(|c| {
        c.south.tls.cert = server.cert.clone();
        c.south.tls.key = server.key.clone();
        c.south.tls.client_ca = pki.ca.clone();
        c.north.tls.ca = pki.ca.clone();
    });
    let (code, stderr) = check_config(&good);
    assert_eq!(code, Some(0), "{stderr}");

    let cases: Vec<(&str, String)> = vec![
        (
            "south.tls.cert",
            config_with(|c| {
                c.south.tls.cert = missing.clone();
                c.south.tls.key = server.key.clone();
            }),
        ),
        (
            "south.tls.key",
            config_with(|c| {
                c.south.tls.cert = server.cert.clone();
                c.south.tls.key = other.key.clone();
            }),
        ),
        (
            "south.tls.key",
            config_with(|c| c.south.tls.cert = server.cert.clone()),
        ),
        (
            "south.tls.client_ca",
            config_with(|c| {
                c.south.tls.cert = server.cert.clone();
                c.south.tls.key = server.key.clone();
                c.south.tls.client_ca = garbage.clone();
            }),
        ),
        (
            "north.tls.ca",
            config_with(|c| c.north.tls.ca = garbage.clone()),
        ),
        (
            "north.tls.ca",
            config_with(|c| {
                c.north.tls.cert = server.cert.clone();
                c.north.tls.key = server.key.clone();
            }),
        ),
        (
            "south.site_tls.ca",
            config_with(|c| c.south.site_tls.ca = pki.ca.clone()),
        ),
        (
            "south.tls.cert",
            config_with(|c| {
                c.south.mode = "external".into();
                c.south.tls.cert = server.cert.clone();
            }),
        ),
    ];
    for (key, config) in &cases {
        assert_refused(check_config(config), key);
    }
    // `run` refuses it the same way, before starting anything.
    assert_refused(run_on_config("run", &cases[0].1), "south.tls.cert");
}

/// The client library (`ferry::client::device`) as a device proves itself
/// twice: its certificate (CN = its id) and its password. Either alone is
/// not enough when the gateway asks for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_client_library_connects_with_its_certificate_and_password() {
    use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
    use ferry::mqtt::Transport;
    use ferry::protocol::receipt::ReceiptStatus;

    let pki = Pki::new("tls-lib");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(
        tls_opts("gw-tls-lib", mq.port, &pki, true).with_passwords(&[("lib-dev", "pw-lib")]),
    );
    let _backend = Backend::connect_auto_ack(mq.port, "gw-tls-lib").await;
    let cert = pki.client("lib-dev");
    let device = |password: &str| {
        let mut opts = DeviceOptions::new("127.0.0.1", ferry.south_port, "lib-dev");
        opts.transport = Transport::Tls(pki.client_config(Some(&cert)));
        opts.password = Some(password.to_string());
        DeviceClient::connect(opts)
    };

    // The right certificate with a wrong password never gets connected.
    let mut wrong = device("not-it");
    let connected = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match wrong.events.recv().await {
                Some(DeviceEvent::Connected) => return true,
                Some(_) => {}
                None => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    assert!(!connected, "connected with a wrong password");
    drop(wrong);
    assert!(
        ferry.log().contains("wrong password"),
        "{}",
        ferry.log_tail()
    );

    let mut dev = device("pw-lib");
    let id = format!("{}-lib", boot_id());
    dev.send("t", &id, json!({"t": 1})).expect("a msg_id");
    let delivered = tokio::time::timeout(SECS_30, async {
        while let Some(event) = dev.events.recv().await {
            if let DeviceEvent::Receipt(r) = event {
                if r.status == ReceiptStatus::Delivered {
                    return r.msg_id.map(|m| m.to_string());
                }
            }
        }
        None
    })
    .await
    .ok()
    .flatten();
    assert_eq!(
        delivered.as_deref(),
        Some(id.as_str()),
        "{}",
        ferry.log_tail()
    );
}
