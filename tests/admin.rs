//! The admin HTTP server of a running gateway, with real Mosquitto
//! upstream and real devices: `/metrics` moves with the traffic, the JSON
//! API serves the CLI's views, the status page shows the gateway's figures
//! in a real headless Chromium, and the Grafana dashboard uses only
//! metrics that exist. (`/healthz` and `/readyz` are checked where their
//! conditions are made: tests/operate.rs wedges the writer and reaches the
//! disk budget.)

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::admin::{try_get, Metrics};
#[cfg(feature = "system-tests")]
use crate::support::chromium::{render_dom, text_of};
use crate::support::receipts::{eventually, ids_with};
use crate::support::{
    boot_id, check_config, device_topics, ferry_command, north_topics, write_file, Backend,
    BareClient, Device, Ferry, FerryOpts, Mode, Mosquitto,
};

const SECS_10: Duration = Duration::from_secs(10);

fn up(name: &str) -> String {
    format!("ferry_{name}{{direction=\"up\"}}")
}

fn down(name: &str) -> String {
    format!("ferry_{name}{{direction=\"down\"}}")
}

/// Polls `/metrics` until `done` holds; the last scrape either way.
async fn metrics_until(
    ferry: &Ferry,
    what: &str,
    mut done: impl FnMut(&Metrics) -> bool,
) -> Metrics {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = ferry.metrics();
        if done(&m) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics never showed {what}:\n{}\n--- ferry log ---\n{}",
            m.0,
            ferry.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A downlink for `device`, from the backend, handed in an inbox batch and
/// confirmed by the device; returns its seq.
async fn deliver_down(
    backend: &Backend,
    panel: &mut BareClient,
    gateway: &str,
    device: &str,
    id: &str,
) -> u64 {
    let topic = north_topics(gateway).down_to(&ferry::ids::DeviceId::new(device).unwrap());
    backend
        .publish_raw(
            &topic,
            serde_json::to_vec(&json!({"msg_id": id, "payload": "shift B"})).unwrap(),
        )
        .await;
    let batch = panel.next_json(SECS_10).await.expect("an inbox batch");
    let seq = batch["messages"][0]["seq"].as_u64().expect("a seq");
    panel
        .publish(
            &device_topics(device).confirm(),
            json!({"upto": seq}).to_string(),
        )
        .await;
    seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_counters_and_histograms_move_with_the_traffic_in_both_directions() {
    const N: usize = 5;
    let mq = Mosquitto::start();
    let gw = "gw-metrics";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    let before = ferry.metrics();
    for series in [
        up("messages_received_total"),
        down("messages_delivered_total"),
    ] {
        assert_eq!(before.value(&series), 0.0, "{series} before any traffic");
    }
    assert_eq!(
        before.value(r#"ferry_messages_rejected_total{direction="up",reason="malformed"}"#),
        0.0
    );

    let backend = Backend::connect_auto_ack(mq.port, gw).await;
    let mut device = Device::connect(ferry.south_port, "press-1").await;
    let boot = boot_id();
    let ids: Vec<String> = (0..N).map(|i| format!("{boot}-{i}")).collect();
    for id in &ids {
        device.publish_envelope("t", id, json!({"v": 1})).await;
    }
    let receipts = device
        .receipts_until(SECS_10, |r| ids_with(r, "delivered").len() == N)
        .await;
    assert_eq!(ids_with(&receipts, "delivered").len(), N, "{receipts:?}");
    // One malformed publish: rejected and dead-lettered.
    device.publish_raw(&device.up_topic("t"), "not json").await;
    let r = device.next_receipt(SECS_10).await.expect("a receipt");
    assert_eq!(r["status"], "rejected", "{r}");

    let mut panel = BareClient::device(&ferry, "panel-1").await;
    let m = metrics_until(&ferry, "panel-1 online", |m| {
        m.value("ferry_devices_online") == 1.0
    })
    .await;
    assert_eq!(m.value("ferry_north_connected"), 1.0);
    let down_id = format!("{boot}-down");
    deliver_down(&backend, &mut panel, gw, "panel-1", &down_id).await;
    metrics_until(&ferry, "the downlink delivered", |m| {
        m.value(&down("messages_delivered_total")) == 1.0
    })
    .await;
    // Scraped again: a scrape reads the store's gauges before it renders
    // the counters, so the one that saw the count may predate the commit.
    let m = ferry.metrics();

    assert_eq!(m.value(&up("messages_received_total")), (N + 1) as f64);
    assert_eq!(m.value(&up("messages_stored_total")), N as f64);
    assert_eq!(m.value(&up("messages_delivered_total")), N as f64);
    assert_eq!(
        m.value(r#"ferry_messages_rejected_total{direction="up",reason="malformed"}"#),
        1.0
    );
    assert_eq!(m.value(&up("messages_dead_lettered_total")), 0.0);
    assert_eq!(m.value(&down("messages_received_total")), 1.0);
    assert_eq!(m.value(&down("messages_stored_total")), 1.0);
    // Every stored uplink's receipt and every delivery timed once.
    assert_eq!(m.value("ferry_stored_receipt_seconds_count"), N as f64);
    assert_eq!(m.value(&up("delivery_seconds_count")), N as f64);
    assert_eq!(m.value(&down("delivery_seconds_count")), 1.0);
    assert!(
        m.value("ferry_store_commit_seconds_count") >= (N + 2) as f64,
        "{}",
        m.0
    );
    assert!(m.value("ferry_store_commit_seconds_sum") > 0.0);
    // The gauges, read from the store at the scrape: nothing waits, one
    // dead letter (the malformed publish).
    assert_eq!(m.value(&up("backlog_messages")), 0.0);
    assert_eq!(m.value(&down("backlog_messages")), 0.0);
    assert_eq!(m.value("ferry_dead_letters"), 1.0);
    assert!(m.value("ferry_store_bytes") > 0.0);
    assert_eq!(m.0.lines().last(), Some("# EOF"));

    // A nack with retry: retried, then dead-lettered once it is final.
    let mut backend = backend;
    backend.set_auto_ack(false);
    backend.drain_for(Duration::from_millis(300)).await;
    let nacked = format!("{boot}-nack");
    device.publish_envelope("t", &nacked, json!({"v": 2})).await;
    for (reason, retry) in [("busy", true), ("unknown sensor", false)] {
        let msg = backend.next_message(SECS_10).await.expect("north");
        assert_eq!(msg.msg_id(), nacked);
        backend.nack("press-1", &nacked, reason, retry).await;
    }
    metrics_until(&ferry, "the nack dead-lettered", |m| {
        m.value(&up("messages_dead_lettered_total")) == 1.0
    })
    .await;
    // Scraped again, as above: the gauge of dead letters is read before
    // the counter that saw the commit.
    let m = ferry.metrics();
    assert_eq!(m.value(&up("messages_retried_total")), 1.0);
    assert_eq!(m.value("ferry_dead_letters"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_api_serves_the_cli_views_and_answers_bad_requests_with_a_status() {
    let mq = Mosquitto::start();
    let gw = "gw-api";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    let mut backend = Backend::connect(mq.port, gw).await;
    let device = Device::connect(ferry.south_port, "press-7").await;
    let id = format!("{}-api", boot_id());
    device.publish_envelope("t", &id, json!({"v": 1})).await;
    let m = backend.next_message(SECS_10).await.expect("north");
    backend
        .nack("press-7", m.msg_id(), "unknown sensor", false)
        .await;
    eventually(SECS_10, "the nack dead-lettered", || {
        ferry.query_i64("SELECT count(*) FROM dead_letter", []) == 1
    })
    .await;

    let list = ferry.admin_json("/api/dlq?direction=up&reason=nacked");
    let rows = list.as_array().expect("an array");
    assert_eq!(rows.len(), 1, "{list}");
    assert_eq!(
        (rows[0]["device"].as_str(), rows[0]["msg_id"].as_str()),
        (Some("press-7"), Some(id.as_str()))
    );
    assert_eq!(ferry.admin_json("/api/dlq?direction=down"), json!([]));
    let dl = rows[0]["id"].as_i64().expect("an id");
    let shown = ferry.admin_json(&format!("/api/dlq/{dl}"));
    // The CLI's views, as the CLI prints them with --json.
    assert_eq!(
        shown,
        crate::ops::cli_json(&ferry, &["dlq", "show", &dl.to_string()])
    );
    assert_eq!(
        list,
        crate::ops::cli_json(
            &ferry,
            &["dlq", "list", "--direction", "up", "--reason", "nacked"]
        )
    );
    assert!(
        shown["payload"]["data"]
            .as_str()
            .unwrap_or("")
            .contains(&id),
        "{shown}"
    );
    assert_eq!(shown["seq"], m.seq().map_or(Value::Null, Value::from));
    let trace = ferry.admin_json(&format!("/api/trace/press-7/{id}"));
    assert_eq!(
        trace,
        crate::ops::cli_json(&ferry, &["trace", "press-7", &id])
    );
    let events = crate::ops::event_names(&trace);
    assert!(events.contains(&"stored"), "{trace}");
    assert!(events.iter().any(|e| e.starts_with("dead")), "{trace}");
    let status = ferry.admin_json("/api/status");
    assert_eq!(status["dead_letters"], 1, "{status}");
    assert_eq!(status["running"], true, "{status}");
    assert_eq!(status["north"]["up"], true, "{status}");

    for (path, code) in [
        ("/api/dlq/999999", 404),
        ("/api/dlq?direction=sideways", 400),
        ("/api/dlq/not-a-number", 400),
        ("/api/trace/press-7/never-sent", 404),
        ("/nothing-here", 404),
    ] {
        let (got, body) = ferry.admin_get(path);
        assert_eq!(got, code, "GET {path}: {body}");
    }
    let (code, body) = ferry.admin_get("/api/dlq/999999");
    assert_eq!(
        (code, body.as_str()),
        (404, r#"{"error":"no dead letter 999999"}"#)
    );
}

#[cfg(feature = "system-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_gateways_figures_in_headless_chromium() {
    let mq = Mosquitto::start();
    let gw = "gw-page";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    // The backend reads but never acks: 3 uplinks wait.
    let mut backend = Backend::connect(mq.port, gw).await;
    let mut device = Device::connect(ferry.south_port, "press-3").await;
    let boot = boot_id();
    for i in 0..3 {
        let id = format!("{boot}-{i}");
        device.publish_envelope("t", &id, json!({"i": i})).await;
        let (r, _) = device.next_receipt_for(&id, SECS_10).await;
        assert_eq!(r.expect("stored")["status"], "stored");
        backend.next_message(SECS_10).await.expect("sent north");
    }
    // One dead letter: a malformed publish.
    device.publish_raw(&device.up_topic("t"), "{broken").await;
    assert_eq!(
        device.next_receipt(SECS_10).await.expect("a receipt")["status"],
        "rejected"
    );
    // Two downlinks for a device that is not there.
    for i in 0..2 {
        let topic = north_topics(gw).down_to(&ferry::ids::DeviceId::new("panel-away").unwrap());
        backend
            .publish_raw(
                &topic,
                serde_json::to_vec(&json!({"msg_id": format!("{boot}-d{i}"), "payload": i}))
                    .unwrap(),
            )
            .await;
    }
    eventually(SECS_10, "2 downlinks queued", || {
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery WHERE state = 'stored'",
            [],
        ) == 2
    })
    .await;
    let api = ferry.admin_json("/api/status");
    assert_eq!(
        (
            api["uplink_backlog"].as_i64(),
            api["downlink_backlog"].as_i64()
        ),
        (Some(3), Some(2)),
        "{api}"
    );

    // The backend read the 3 and acked nothing: past their ack timeout it
    // is silent.
    eventually(SECS_10, "the backend seen silent", || {
        ferry.admin_json("/api/status")["backend"]["present"] == false
    })
    .await;
    // 7 s of the page's (virtual) time: it loads, then refreshes itself
    // every 2 s.
    let dom = render_dom(&ferry.admin_url("/"), Duration::from_secs(7));
    let refreshes: u32 = dom
        .split("data-refreshes=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(refreshes >= 3, "refreshed {refreshes} times in 7 s:\n{dom}");
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page's script never rendered:\n{dom}"
    );
    let shown = |id: &str| text_of(&dom, id);
    assert_eq!(shown("gateway"), gw);
    assert_eq!(shown("north-state"), "up");
    assert_eq!(shown("south-state"), "up");
    assert_eq!(shown("backend-state"), "silent");
    assert!(
        shown("backend-since").contains("last ack none yet"),
        "{}",
        shown("backend-since")
    );
    assert_eq!(shown("devices-online"), "1");
    assert_eq!(shown("uplink-backlog"), "3");
    assert_eq!(shown("downlink-backlog"), "2");
    assert_eq!(shown("dead-letters"), "1");
    assert_eq!(shown("ready"), "ready");
    assert_eq!(shown("pid"), api["pid"].to_string());
    assert!(
        shown("uplink-oldest").ends_with(" s"),
        "{}",
        shown("uplink-oldest")
    );
    assert!(!shown("downlink-oldest").is_empty());
    assert_eq!(shown("top-devices"), "device messages panel-away 2");
    let dead = shown("dead-letter-list");
    assert!(
        dead.contains("press-3") && dead.contains("malformed"),
        "{dead}"
    );
    assert!(
        shown("store-budget").ends_with("GiB"),
        "{}",
        shown("store-budget")
    );

    // The page follows the gateway: the backend acks, the backlog empties.
    let acks: Vec<String> = (0..3).map(|i| format!("{boot}-{i}")).collect();
    for id in &acks {
        backend.ack_ok("press-3", id).await;
    }
    eventually(SECS_10, "the backlog empties", || {
        ferry.query_i64("SELECT count(*) FROM uplink WHERE state = 'stored'", []) == 0
    })
    .await;
    let dom = render_dom(&ferry.admin_url("/"), Duration::from_secs(5));
    assert_eq!(text_of(&dom, "uplink-backlog"), "0");
    assert_eq!(text_of(&dom, "uplink-oldest"), "none");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_grafana_dashboard_uses_is_exported() {
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/grafana/ferry.json"
    ))
    .expect("docs/grafana/ferry.json");
    let parsed: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert_eq!(parsed["uid"], "ferry");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-grafana", mq.port));
    let families = ferry.metrics().families();
    let mut used = std::collections::BTreeSet::new();
    for (at, _) in dashboard.match_indices("ferry_") {
        let name: String = dashboard[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        used.insert(name);
    }
    assert!(used.len() > 20, "the dashboard uses few metrics: {used:?}");
    for name in &used {
        // Counters are exported as `name_total`, histograms as
        // `name_bucket`, `_sum` and `_count` of the family `name`.
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| families.iter().any(|x| x == f))
            })
            .unwrap_or(name);
        assert!(
            families.iter().any(|f| f == family),
            "the dashboard uses {name}, which /metrics does not export; it exports {families:?}"
        );
    }
}

#[test]
fn a_bad_admin_listen_is_refused_naming_the_key() {
    let opts = FerryOpts::new("gw-admin-bad", 1883).with(|c| c.admin.listen = "localhost".into());
    let (code, err) = check_config(&opts.to_toml());
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("admin.listen"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_port_in_use_stops_the_start_naming_the_key() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let mq = Mosquitto::start();
    let opts = FerryOpts::new("gw-admin-taken", mq.port)
        .with(|c| c.admin.listen = format!("127.0.0.1:{port}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_file(dir.path(), "ferry.toml", &opts.to_toml());
    let mut child = ferry_command()
        .args(["run", "--config"])
        .arg(&config)
        .current_dir(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start ferry");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ferry kept running with admin.listen on a port in use");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("read");
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("admin.listen") && err.contains(&port.to_string()),
        "{err}"
    );
    // The start failed: it leaves no data dir it made (the config's
    // ./data) and no pid file behind.
    assert!(
        !dir.path().join("data").exists(),
        "a failed start left ./data"
    );
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_admin_connections_are_bounded_and_timed_out_and_devices_are_served_meanwhile() {
    let mq = Mosquitto::start();
    let gw = "gw-admin-flood";
    let ferry = Ferry::start(FerryOpts::new(gw, mq.port));
    let _backend = Backend::connect_auto_ack(mq.port, gw).await;
    let mut device = Device::connect(ferry.south_port, "press-9").await;
    let pid = ferry.pid().expect("running");
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let before = fds();
    let port = ferry.admin_port.expect("admin on");
    // 300 clients that connect and say nothing.
    let idle: Vec<std::net::TcpStream> = (0..300)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = fds();
    assert!(
        held <= before + ferry::admin::MAX_CONNECTIONS + 8,
        "ferry holds {held} descriptors, {before} before 300 idle admin clients"
    );
    // Devices are served meanwhile.
    let id = format!("{}-flood", boot_id());
    device.publish_envelope("t", &id, json!({"v": 1})).await;
    let receipts = device
        .receipts_until(SECS_10, |r| ids_with(r, "delivered").contains(&id))
        .await;
    assert!(
        ids_with(&receipts, "delivered").contains(&id),
        "{receipts:?}"
    );
    // The idle ones are closed after the header timeout (5 s); the admin
    // server answers again, and counted what it turned away.
    let deadline = Instant::now() + Duration::from_secs(15);
    let m = loop {
        if let Ok((200, body)) = try_get(&ferry.admin_url("/metrics")) {
            break Metrics(body);
        }
        assert!(
            Instant::now() < deadline,
            "the admin server never answered again"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        m.value("ferry_admin_connections_refused_total")
            >= (300 - ferry::admin::MAX_CONNECTIONS) as f64,
        "{}",
        m.0
    );
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_in_external_mode_asks_the_site_session_and_a_site_outage_is_not_a_failure() {
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start_in(Mode::External, FerryOpts::new("gw-health-ext", mq.port));
    let healthy =
        |ferry: &Ferry| ferry.admin_get("/healthz") == (200, r#"{"ok":true}"#.to_string());
    eventually(SECS_10, "healthy", || healthy(&ferry)).await;
    // The site broker goes away: the session reconnects with backoff,
    // which is alive; checks run every 5 s.
    ferry.site.as_mut().expect("a site broker").stop();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(healthy(&ferry), "{:?}", ferry.admin_get("/healthz"));
    let status = ferry.admin_json("/api/status");
    assert_eq!(status["south"]["up"], false, "{status}");
    assert_eq!(ferry.admin_get("/readyz").0, 200);
}

/// A gateway with traffic for the status page: two devices online whose
/// uplinks the backend acks, one it nacks with markup in its reason
/// (dead-lettered), and a
/// downlink waiting for an absent device past `alerts.backlog_age_s` (1 s),
/// so a `backlog_age` alert is open. Returns what must stay alive.
#[cfg(feature = "system-tests")]
async fn page_with_traffic(gw: &str) -> (Mosquitto, Ferry, Backend, Vec<Device>) {
    let mq = Mosquitto::start();
    let mut opts = FerryOpts::new(gw, mq.port);
    opts.config.alerts.backlog_age_s = 1;
    let ferry = Ferry::start(opts);
    let mut backend = Backend::connect_auto_ack(mq.port, gw).await;
    let boot = boot_id();
    let mut devices = Vec::new();
    for name in ["press-7", "panel-7"] {
        let mut device = Device::connect(ferry.south_port, name).await;
        for i in 0..20 {
            device
                .publish_envelope("t", &format!("{boot}-{name}-{i}"), json!({"i": i}))
                .await;
        }
        let receipts = device
            .receipts_until(SECS_10, |r| ids_with(r, "delivered").len() == 20)
            .await;
        assert_eq!(ids_with(&receipts, "delivered").len(), 20, "{receipts:?}");
        devices.push(device);
    }
    // Dead-lettered, its reason quoting what the backend said: the page
    // shows it as text, never as markup.
    backend.set_auto_ack(false);
    let nacked = format!("{boot}-nacked");
    devices[0]
        .publish_envelope("t", &nacked, json!({"i": "last"}))
        .await;
    let deadline = Instant::now() + SECS_10;
    loop {
        let m = backend.next_message(SECS_10).await.expect("sent north");
        if m.msg_id() == nacked {
            break;
        }
        assert!(Instant::now() < deadline, "{nacked} never came north");
    }
    backend
        .nack("press-7", &nacked, "<b id=\"injected\">x</b>", false)
        .await;
    eventually(SECS_10, "a dead letter", || {
        ferry.query_i64("SELECT count(*) FROM dead_letter", []) == 1
    })
    .await;
    let topic = north_topics(gw).down_to(&ferry::ids::DeviceId::new("panel-away").unwrap());
    backend
        .publish_raw(
            &topic,
            serde_json::to_vec(&json!({"msg_id": format!("{boot}-away"), "payload": 1})).unwrap(),
        )
        .await;
    // The alerts task looks every 5 s.
    eventually(Duration::from_secs(20), "a backlog_age alert open", || {
        ferry
            .admin_json("/api/alerts")
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["kind"] == "backlog_age"))
    })
    .await;
    eventually(SECS_10, "both devices listed", || {
        ferry.admin_json("/api/devices")["total"] == 2
    })
    .await;
    (mq, ferry, backend, devices)
}

#[cfg(feature = "system-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_north_endpoint_devices_throughput_alerts_and_version() {
    let (mq, ferry, _backend, _devices) = page_with_traffic("gw-page-more").await;
    let dom = render_dom(&ferry.admin_url("/"), Duration::from_secs(3));
    assert!(dom.contains("data-loaded=\"true\""), "{dom}");
    let shown = |id: &str| text_of(&dom, id);
    assert_eq!(shown("north-endpoint"), format!("127.0.0.1:{}", mq.port));
    assert_eq!(shown("north-error"), "");
    assert_eq!(shown("version"), env!("CARGO_PKG_VERSION"));
    assert!(shown("uptime").ends_with(" s"), "{}", shown("uptime"));
    let listed = shown("device-list");
    assert!(
        listed.contains("press-7") && listed.contains("panel-7"),
        "{listed}"
    );
    assert_eq!(shown("devices-range"), "1–2 of 2");
    let alerts = shown("alert-list");
    assert!(
        alerts.contains("backlog_age") && alerts.contains("alerts.backlog_age_s = 1"),
        "{alerts}"
    );
    // The chart: a step for the interval the 40 uplinks came in, above
    // the zero line (y = 180), on the uplink-in and uplink-out paths.
    for path in ["tp-uplink-in", "tp-uplink-out"] {
        let d = svg_path(&dom, path);
        assert!(d.starts_with('M'), "{path}: {d:?}\n{dom}");
        let ys: Vec<f64> = d
            .split(['M', 'L'])
            .filter_map(|p| p.trim().split(',').nth(1)?.parse().ok())
            .collect();
        assert!(
            ys.iter().any(|y| *y < 180.0),
            "{path}: no traffic drawn: {d}"
        );
    }
    // Dead letters link to their detail and trace (as JSON).
    let dead = dom
        .split("id=\"dead-letter-list\"")
        .nth(1)
        .expect("the dead-letter table");
    assert!(dead.contains("href=\"/api/dlq/1\""), "{dead}");
    assert!(
        dead.contains("&lt;b id=") && !dom.contains("<b id=\"injected\""),
        "what the device sent is not shown as text:\n{dead}"
    );
    let (code, _) = ferry.admin_get("/api/dlq/1");
    assert_eq!(code, 200);
}

/// The `d` of the SVG path with `id` in rendered `html`.
#[cfg(feature = "system-tests")]
fn svg_path(html: &str, id: &str) -> String {
    let at = html
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id}"));
    let tag_end = at + html[at..].find('>').expect("the tag closes");
    let tag_start = html[..at].rfind('<').expect("a tag");
    let tag = &html[tag_start..tag_end];
    tag.split(" d=\"")
        .nth(1)
        .and_then(|d| d.split('"').next())
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_devices_api_pages_the_devices_online_and_refuses_bad_paging_with_a_message() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-devices", mq.port));
    let mut devices = Vec::new();
    for name in ["dev-a", "dev-b", "dev-c"] {
        devices.push(Device::connect(ferry.south_port, name).await);
    }
    eventually(SECS_10, "3 devices online", || {
        ferry.admin_json("/api/devices")["total"] == 3
    })
    .await;
    let page = ferry.admin_json("/api/devices?offset=1&limit=1");
    assert_eq!(
        (
            page["total"].as_u64(),
            page["offset"].as_u64(),
            page["limit"].as_u64()
        ),
        (Some(3), Some(1), Some(1)),
        "{page}"
    );
    assert_eq!(page["devices"][0]["device"], "dev-b", "{page}");
    assert_eq!(page["devices"].as_array().map(Vec::len), Some(1), "{page}");
    assert!(page["devices"][0]["last_seen_ms"].as_i64().unwrap_or(0) > 0);
    let past = ferry.admin_json("/api/devices?offset=10");
    assert_eq!(past["devices"], json!([]), "{past}");
    for (query, message) in [
        (
            "offset=-1",
            r#"offset must be a whole number from 0 to 4294967295 (got \"-1\")"#,
        ),
        (
            "offset=x",
            r#"offset must be a whole number from 0 to 4294967295 (got \"x\")"#,
        ),
        (
            "limit=0",
            r#"limit must be a whole number from 1 to 1000 (got \"0\")"#,
        ),
        (
            "limit=5000",
            r#"limit must be a whole number from 1 to 1000 (got \"5000\")"#,
        ),
    ] {
        let (code, body) = ferry.admin_get(&format!("/api/devices?{query}"));
        assert_eq!(
            (code, body),
            (400, format!(r#"{{"error":"{message}"}}"#)),
            "{query}"
        );
    }
    let long = "9".repeat(500);
    let (code, body) = ferry.admin_get(&format!("/api/devices?limit={long}"));
    assert_eq!(code, 400);
    assert!(body.len() < 300, "{body}");
    // A device that leaves is no longer listed.
    drop(devices.pop());
    eventually(SECS_10, "dev-c gone", || {
        ferry.admin_json("/api/devices")["total"] == 2
    })
    .await;
    let throughput = ferry.admin_json("/api/throughput");
    assert_eq!(throughput["every_s"], 10, "{throughput}");
}

/// Regenerates docs/status-page.png: the status page of a gateway with
/// traffic, in headless Chromium at 1280x1000.
/// `cargo test --features system-tests --test tests
/// admin::status_page_screenshot -- --ignored`
#[cfg(feature = "system-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "regenerates docs/status-page.png"]
async fn status_page_screenshot() {
    let (_mq, ferry, backend, mut devices) = page_with_traffic("edge-01").await;
    backend.set_auto_ack(true);
    // A minute more of uplinks, uneven, so the chart has samples to draw;
    // they go on while the screenshot is taken.
    let boot = boot_id();
    let traffic = async {
        for round in 0..80u64 {
            for (n, device) in devices.iter_mut().enumerate() {
                let burst = 2 + (round / 6 + n as u64 * 3) % 9;
                for i in 0..burst {
                    device
                        .publish_envelope("t", &format!("{boot}-{round}-{n}-{i}"), json!({"i": i}))
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let shot = async {
        tokio::time::sleep(Duration::from_secs(65)).await;
        let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/status-page.png");
        let url = ferry.admin_url("/");
        tokio::task::spawn_blocking(move || {
            crate::support::chromium::screenshot(&url, &out, (1280, 1000))
        })
        .await
        .expect("the screenshot");
    };
    tokio::join!(traffic, shot);
}
