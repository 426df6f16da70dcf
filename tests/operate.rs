//! Operating ferry as a service, against the real binary and a real
//! Mosquitto upstream: systemd's notify protocol and watchdog (with a
//! notify socket the test binds), the disk budget, and retention.

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::receipts::eventually;
use crate::support::{
    self, boot_id, north_topics, Backend, BareClient, Device, Ferry, FerryOpts, Mode,
};

const DAY_MS: i64 = 86_400_000;

fn reason(r: &Value) -> &str {
    r["reason"].as_str().unwrap_or("")
}

/// Every datagram on `socket` until `until`, with when it arrived.
fn collect(socket: &UnixDatagram, start: Instant, until: Instant) -> Vec<(Duration, String)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let now = Instant::now();
        if now >= until {
            return got;
        }
        socket
            .set_read_timeout(Some(until - now))
            .expect("set read timeout");
        match socket.recv(&mut buf) {
            Ok(len) => got.push((
                start.elapsed(),
                String::from_utf8_lossy(&buf[..len]).into_owned(),
            )),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("notify socket: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_is_fed_while_the_pipeline_answers_and_stops_when_the_writer_wedges() {
    let mosquitto = support::Mosquitto::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
    // Checks every 250 ms, each part given 500 ms to answer; the writer
    // wedges at its first request 4 s after it started.
    let wedge_at = Duration::from_millis(4000);
    let opts = support::FerryOpts::new("gw-watchdog", mosquitto.port)
        .with_env("NOTIFY_SOCKET", path.to_str().expect("utf-8 path"))
        .with_env("WATCHDOG_USEC", "1000000")
        .with_env(
            "TEST_FERRY_WEDGE_WRITER_AFTER_MS",
            &wedge_at.as_millis().to_string(),
        );
    let start = Instant::now();
    let ferry = support::Ferry::start(opts);
    // The admin server's /healthz is the same check.
    healthy_by(&ferry, start + wedge_at).await;
    let got = tokio::task::block_in_place(|| {
        collect(&socket, start, start + wedge_at + Duration::from_secs(5))
    });
    let log = ferry.log();
    let summary = format!("{got:?}\n--- ferry log ---\n{}", ferry.log_tail());

    let ready = got.iter().position(|(_, m)| m == "READY=1");
    assert!(ready.is_some(), "no READY=1: {summary}");
    let fed: Vec<Duration> = got
        .iter()
        .filter(|(_, m)| m == "WATCHDOG=1")
        .map(|(at, _)| *at)
        .collect();
    assert!(
        fed.iter().filter(|at| **at < wedge_at).count() >= 3,
        "the watchdog was not fed before the wedge: {summary}"
    );
    assert!(
        got.iter()
            .any(|(_, m)| m.starts_with("STATUS=backlog: 0 uplinks, 0 downlinks")),
        "no STATUS= with the backlog: {summary}"
    );
    // The wedge takes effect at the first ping after 4 s (within 250 ms),
    // and one check already under way may still feed: from 5.5 s on,
    // nothing.
    let quiet_from = wedge_at + Duration::from_millis(1500);
    assert!(
        fed.iter().all(|at| *at < quiet_from),
        "the watchdog was fed after the writer wedged: {summary}"
    );
    assert!(
        log.contains("the systemd watchdog is not fed") && log.contains("store writer"),
        "no WARN naming the store writer: {summary}"
    );
    let (code, body) = ferry.admin_get("/healthz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("store writer"), "{body}");
    let (code, body) = ferry.admin_get("/readyz");
    assert_eq!(code, 503, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_disk_budget_nothing_new_is_stored_nothing_is_deleted_and_intake_resumes_once_delivered_messages_are_pruned(
) {
    let mosquitto = support::Mosquitto::start();
    // 12 MiB: the WAL (up to ~4 MiB between checkpoints) counts too.
    let budget: u64 = 12 << 20;
    let opts = FerryOpts::new("gw-budget", mosquitto.port).with(|c| {
        c.store.max_db_bytes = budget;
        // Unacked messages wait for the backend, however long the test takes.
        c.retry.max_attempts = 100_000;
    });
    let ferry = Ferry::start(opts);
    let backend = Backend::connect(mosquitto.port, "gw-budget").await;
    let mut device = Device::connect(ferry.south_port, "press-1").await;
    let receipts_topic = north_topics("gw-budget").receipts();
    let mut receipts =
        BareClient::connect(mosquitto.port, "budget-receipts", vec![receipts_topic]).await;
    let mut alerts = BareClient::connect(
        mosquitto.port,
        "budget-alerts",
        vec!["ferry/gw-budget/alerts".to_string()],
    )
    .await;
    let boot = boot_id();
    let blob = "x".repeat(60_000);

    // Fill the store with undelivered messages until the first refusal.
    let mut stored = Vec::new();
    let mut first_seq = None;
    let mut refused = None;
    for i in 0..1000 {
        let id = format!("{boot}-{i:04}");
        device
            .publish_envelope("blob", &id, json!({ "blob": blob }))
            .await;
        let (r, _) = device.next_receipt_for(&id, Duration::from_secs(10)).await;
        let r = r.unwrap_or_else(|| panic!("no receipt for {id}\n{}", ferry.log_tail()));
        match r["status"].as_str() {
            Some("stored") => {
                first_seq.get_or_insert(r["seq"].clone());
                stored.push(id)
            }
            Some("rejected") => {
                assert!(reason(&r).starts_with("disk_budget: "), "{r}");
                refused = Some(id);
                break;
            }
            other => panic!("unexpected receipt {other:?}: {r}"),
        }
    }
    let refused =
        refused.unwrap_or_else(|| panic!("the budget was never reached\n{}", ferry.log_tail()));
    assert!(
        stored.len() > 20,
        "the budget was reached after {} messages",
        stored.len()
    );
    let count = |ferry: &Ferry| ferry.query_i64("SELECT count(*) FROM uplink", []);
    assert_eq!(count(&ferry) as usize, stored.len());
    assert!(
        ferry.log().contains("disk budget reached"),
        "{}",
        ferry.log_tail()
    );

    // More of the same: refused, nothing written; a downlink too.
    for i in 0..3 {
        let id = format!("{boot}-more{i}");
        device
            .publish_envelope("blob", &id, json!({ "i": i }))
            .await;
        let (r, _) = device.next_receipt_for(&id, Duration::from_secs(10)).await;
        let r = r.expect("a receipt");
        assert_eq!(r["status"], "rejected", "{r}");
        assert!(reason(&r).starts_with("disk_budget: "), "{r}");
    }
    backend
        .publish_raw(
            "ferry/gw-budget/down/panel-1",
            serde_json::to_vec(&json!({"msg_id": format!("{boot}-down"), "payload": "hello"}))
                .unwrap(),
        )
        .await;
    let r = receipts
        .next_json(Duration::from_secs(10))
        .await
        .expect("a downlink receipt");
    assert_eq!(r["status"], "rejected", "{r}");
    assert!(reason(&r).starts_with("disk_budget: "), "{r}");
    assert_eq!(ferry.query_i64("SELECT count(*) FROM down_message", []), 0);
    // The admin server says so: not ready, the refusals counted.
    let (code, body) = ferry.admin_get("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("store.max_db_bytes"), "{body}");
    let m = ferry.metrics();
    assert_eq!(
        m.value(r#"ferry_messages_rejected_total{direction="up",reason="disk_budget"}"#),
        4.0
    );
    assert_eq!(
        m.value(r#"ferry_messages_rejected_total{direction="down",reason="disk_budget"}"#),
        1.0
    );
    assert_eq!(
        m.value(r#"ferry_messages_stored_total{direction="up"}"#) as usize,
        stored.len()
    );
    // Refused before a message would take it past the budget: the store
    // is within it, and over 95% of it (where it stays refusing).
    let used = m.value("ferry_store_bytes");
    assert!(
        used >= budget as f64 * 0.95 && used <= budget as f64,
        "{}",
        m.0
    );
    assert_eq!(m.value("ferry_store_budget_bytes"), budget as f64);

    // The alert: published north, with the figures.
    let a = alerts
        .next_alert("disk_budget", Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("no disk_budget alert\n{}", ferry.log_tail()));
    assert!(
        a["detail"].as_str().unwrap_or("").contains("max_db_bytes"),
        "{a}"
    );
    assert_eq!(
        ferry
            .metrics()
            .value(r#"ferry_alerts_raised_total{kind="disk_budget"}"#),
        1.0
    );
    // The pruner runs every second while at the budget, and may delete
    // nothing undelivered.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(count(&ferry) as usize, stored.len());
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM uplink WHERE state = 'stored'", []) as usize,
        stored.len()
    );

    // The backend takes everything: delivered messages are pruned early,
    // and the refused message is stored when the device sends it again.
    backend.set_auto_ack(true);
    for id in &stored {
        backend.ack_ok("press-1", id).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        device
            .publish_envelope("blob", &refused, json!({ "again": true }))
            .await;
        let (r, _) = device
            .next_receipt_for(&refused, Duration::from_secs(10))
            .await;
        let r = r.expect("a receipt");
        if r["status"] == "stored" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused after the backend took everything: {r}\n{}",
            ferry.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = ferry.log();
    assert!(
        log.contains("new messages are taken again"),
        "{}",
        ferry.log_tail()
    );
    assert!(
        log.contains("pruned past retention"),
        "{}",
        ferry.log_tail()
    );
    // Everything is delivered in the end, the late message too (pruning
    // deletes only delivered rows): nothing stored was lost on the way.
    eventually(Duration::from_secs(30), "nothing waits", || {
        ferry.query_i64("SELECT count(*) FROM uplink WHERE state = 'stored'", []) == 0
    })
    .await;
    assert_eq!(ferry.query_i64("SELECT count(*) FROM dead_letter", []), 0);
    // Ready again once pruning has taken the store under the budget.
    eventually(Duration::from_secs(30), "/readyz 200 again", || {
        ferry.admin_get("/readyz").0 == 200
    })
    .await;
    // The first message was pruned early, its dedup key kept: sent again
    // (its `delivered` receipt lost, say), it is answered with its
    // original seq and not stored a second time.
    let first = &stored[0];
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM uplink WHERE msg_id = ?1", [first]),
        0,
        "pruned"
    );
    device
        .publish_envelope("blob", first, json!({ "again": true }))
        .await;
    let (r, _) = device
        .next_receipt_for(first, Duration::from_secs(10))
        .await;
    let r = r.expect("a receipt for the pruned message");
    assert_eq!(r["status"], "delivered", "{r}");
    assert_eq!(Some(&r["seq"]), first_seq.as_ref(), "{r}");
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM uplink WHERE msg_id = ?1", [first]),
        0,
        "stored again"
    );
    // `ferry trace` says what is left of it.
    let (code, text, err) = crate::ops::cli(&ferry.config_path, &["trace", "press-1", first]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.contains("delivered (backend ack)") && text.contains("only its dedup key is kept"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_delivered_rows_and_old_dead_letters_and_keeps_undelivered_ones() {
    let mosquitto = support::Mosquitto::start();
    let opts = FerryOpts::new("gw-retain", mosquitto.port).with(|c| {
        c.retry.max_attempts = 100_000;
    });
    let mut ferry = Ferry::start(opts);
    let backend = Backend::connect_auto_ack(mosquitto.port, "gw-retain").await;
    let mut device = Device::connect(ferry.south_port, "press-2").await;
    let boot = boot_id();

    let delivered = device.publish_many("t", &boot, "d", 5).await;
    let got = device
        .receipts_until(Duration::from_secs(20), |rs| {
            rs.iter().filter(|r| r["status"] == "delivered").count() == 5
        })
        .await;
    assert_eq!(
        got.iter().filter(|r| r["status"] == "delivered").count(),
        5,
        "{got:?}"
    );
    backend.set_auto_ack(false);
    drop(backend);
    let waiting = device.publish_many("t", &boot, "w", 3).await;
    let got = device
        .receipts_until(Duration::from_secs(20), |rs| {
            rs.iter().filter(|r| r["status"] == "stored").count() == 3
        })
        .await;
    assert_eq!(
        got.iter().filter(|r| r["status"] == "stored").count(),
        3,
        "{got:?}"
    );
    // A dead letter: a message that is not JSON.
    device
        .publish_raw(&device.up_topic("t"), b"not json".to_vec())
        .await;
    let got = device
        .receipts_until(Duration::from_secs(10), |rs| {
            rs.iter().any(|r| r["status"] == "rejected")
        })
        .await;
    assert!(got.iter().any(|r| r["status"] == "rejected"), "{got:?}");
    assert!(
        ferry.terminate(Duration::from_secs(10)),
        "{}",
        ferry.log_tail()
    );

    // Age everything by 31 days, the dead letter by 91: past both
    // retentions (30 and 90 days by default), on the wall clock and the
    // store clock (old on the wall clock alone is a clock step, kept).
    // Each delivered message also gets the `delivered` history line an
    // older ferry wrote, so the prune has history to take with its rows.
    {
        let conn =
            rusqlite::Connection::open(ferry.data_dir.join("ferry.db")).expect("open the store");
        conn.execute_batch(&format!(
            "UPDATE uplink SET stored_ms = stored_ms - {a}, done_ms = done_ms - {a},
                 stored_store_ms = stored_store_ms - {a}, done_store_ms = done_store_ms - {a};
             UPDATE uplink_history SET at_ms = at_ms - {a};
             INSERT INTO uplink_history (uplink_id, at_ms, state, detail)
                 SELECT id, done_ms, 'delivered', NULL FROM uplink WHERE state = 'delivered';
             UPDATE dead_letter SET at_ms = at_ms - {b}, at_store_ms = at_store_ms - {b};",
            a = 31 * DAY_MS,
            b = 91 * DAY_MS
        ))
        .expect("age the rows");
    }
    let history_before = ferry.query_i64("SELECT count(*) FROM uplink_history", []);
    ferry.restart();

    eventually(Duration::from_secs(20), "delivered rows pruned", || {
        ferry.query_i64("SELECT count(*) FROM uplink WHERE state = 'delivered'", []) == 0
    })
    .await;
    eventually(Duration::from_secs(20), "the dead letter pruned", || {
        ferry.query_i64("SELECT count(*) FROM dead_letter", []) == 0
    })
    .await;
    for id in &delivered {
        assert_eq!(
            ferry.query_i64("SELECT count(*) FROM uplink WHERE msg_id = ?1", [id]),
            0,
            "{id}"
        );
    }
    for id in &waiting {
        assert_eq!(
            ferry.query_i64(
                "SELECT count(*) FROM uplink WHERE msg_id = ?1 AND state = 'stored'",
                [id]
            ),
            1,
            "{id} is undelivered and must be kept"
        );
    }
    let history_after = ferry.query_i64("SELECT count(*) FROM uplink_history", []);
    assert!(
        history_after < history_before,
        "{history_before} -> {history_after}"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM uplink_history h JOIN uplink u ON u.id = h.uplink_id",
            []
        ),
        history_after,
        "no history is left of a pruned message"
    );
    // The device's sequence carries on after its rows are gone.
    let next = format!("{boot}-after");
    device.publish_envelope("t", &next, json!(1)).await;
    let (r, _) = device
        .next_receipt_for(&next, Duration::from_secs(10))
        .await;
    let r = r.expect("a receipt");
    assert_eq!(r["status"], "stored", "{r}");
    assert_eq!(r["seq"], 9, "{r}");
    assert!(
        ferry.log().contains("pruned past retention"),
        "{}",
        ferry.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_and_an_old_backlog_are_alerted_on_the_alerts_topic() {
    let mosquitto = support::Mosquitto::start();
    let opts = FerryOpts::new("gw-alerts", mosquitto.port).with(|c| {
        c.alerts.backlog_age_s = 2;
        c.retry.max_attempts = 100_000;
    });
    let ferry = Ferry::start(opts);
    let mut watcher = BareClient::connect(
        mosquitto.port,
        "alerts-watcher",
        vec!["ferry/gw-alerts/alerts".to_string()],
    )
    .await;
    let mut backend = Backend::connect(mosquitto.port, "gw-alerts").await;
    let device = Device::connect(ferry.south_port, "press-3").await;
    let boot = boot_id();
    let doomed = format!("{boot}-doomed");
    device.publish_envelope("t", &doomed, json!(1)).await;
    let m = backend
        .next_message(Duration::from_secs(20))
        .await
        .expect("the message reaches the backend");
    assert_eq!(m.msg_id(), doomed);
    backend.nack("press-3", &doomed, "bad unit", false).await;
    // Never acked: it ages past alerts.backlog_age_s.
    device
        .publish_envelope("t", &format!("{boot}-waits"), json!(2))
        .await;

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut alerts: Vec<Value> = Vec::new();
    while !(alerts.iter().any(|a| a["kind"] == "dead_letter")
        && alerts.iter().any(|a| a["kind"] == "backlog_age"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match watcher.next_json(left).await {
            Some(a) => alerts.push(a),
            None => panic!("alerts so far: {alerts:?}\n{}", ferry.log_tail()),
        }
    }
    let dead = alerts
        .iter()
        .find(|a| a["kind"] == "dead_letter")
        .expect("a dead letter alert");
    let detail = dead["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("press-3") && detail.contains(&doomed),
        "{dead}"
    );
    assert!(dead["ts"].as_i64().is_some_and(|ts| ts > 0), "{dead}");
    assert!(ferry.log().contains("alert raised"), "{}", ferry.log_tail());
    // Counted by kind.
    let m = ferry.metrics();
    assert_eq!(
        m.value(r#"ferry_alerts_raised_total{kind="dead_letter"}"#),
        1.0
    );
    assert!(m.value(r#"ferry_alerts_raised_total{kind="backlog_age"}"#) >= 1.0);
    assert_eq!(
        m.value(r#"ferry_alerts_raised_total{kind="north_down"}"#),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_north_session_turns_healthz_unhealthy_naming_it() {
    wedged_session_turns_healthz_unhealthy(Mode::Embedded, "NORTH", "north session").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_site_session_turns_healthz_unhealthy_naming_it() {
    wedged_session_turns_healthz_unhealthy(Mode::External, "SOUTH", "site session").await;
}

/// Wedges one MQTT session's task 3 s after start (a debug-only hook) and
/// waits for `/healthz` to name it.
async fn wedged_session_turns_healthz_unhealthy(mode: Mode, which: &str, named: &str) {
    let mosquitto = support::Mosquitto::start();
    let dir = tempfile::tempdir().expect("temp dir");
    // Under a (silent) systemd with a 1 s watchdog: checks every 250 ms.
    let wedge_at = Duration::from_millis(3000);
    let opts = support::FerryOpts::new("gw-session-wedge", mosquitto.port)
        .with_env(
            "NOTIFY_SOCKET",
            dir.path().join("nobody").to_str().expect("utf-8 path"),
        )
        .with_env("WATCHDOG_USEC", "1000000")
        .with_env(
            &format!("TEST_FERRY_WEDGE_{which}_AFTER_MS"),
            &wedge_at.as_millis().to_string(),
        );
    let start = Instant::now();
    let ferry = support::Ferry::start_in(mode, opts);
    healthy_by(&ferry, start + wedge_at).await;
    let deadline = start + wedge_at + Duration::from_secs(10);
    loop {
        let (code, body) = ferry.admin_get("/healthz");
        if code == 503 {
            assert!(body.contains(named), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz still {code} {body} after the {named} wedged\n{}",
            ferry.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        start.elapsed() >= wedge_at,
        "unhealthy before the wedge\n{}",
        ferry.log_tail()
    );
    assert!(
        ferry.log().contains("the systemd watchdog is not fed"),
        "{}",
        ferry.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_alert_not_acknowledged_before_a_crash_is_sent_after_the_restart_and_only_once(
) {
    let mut mosquitto = support::Mosquitto::start();
    let gw = "gw-alerts-crash";
    let mut ferry = Ferry::start(FerryOpts::new(gw, mosquitto.port));
    let device = Device::connect(ferry.south_port, "press-4").await;
    // North goes away; a malformed publish is dead-lettered meanwhile, its
    // alert raised (checks every 5 s) and queued in memory.
    mosquitto.stop();
    device.publish_raw(&device.up_topic("t"), "{broken").await;
    eventually(Duration::from_secs(20), "the alert raised", || {
        ferry
            .log()
            .contains("event=\"alert_raised\" kind=\"dead_letter\"")
    })
    .await;
    let dead: i64 = ferry.query_i64("SELECT max(id) FROM dead_letter", []);
    // The crash loses the queue.
    ferry.kill();
    mosquitto.restart();
    let mut watcher = BareClient::connect(
        mosquitto.port,
        "alerts-watcher",
        vec![format!("ferry/{gw}/alerts")],
    )
    .await;
    ferry.restart();
    let named = format!("dead letter {dead} ");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let a = watcher
            .next_json(left)
            .await
            .unwrap_or_else(|| panic!("no alert for dead letter {dead}\n{}", ferry.log_tail()));
        if a["kind"] == "dead_letter" && a["detail"].as_str().unwrap_or("").contains(&named) {
            break;
        }
    }
    // Acknowledged now: the mark moved, and the next run does not raise it
    // again.
    eventually(Duration::from_secs(10), "the alert marked", || {
        ferry.query_i64(
            "SELECT value FROM alert_mark WHERE name = 'dead_letters_alerted'",
            [],
        ) >= dead
    })
    .await;
    ferry.restart();
    let again = watcher.next_json(Duration::from_secs(7)).await;
    assert!(
        again.as_ref().is_none_or(|a| a["kind"] != "dead_letter"),
        "alerted twice: {again:?}"
    );
}

/// Waits until `by` for `/healthz` to answer 200: the supervisor's first
/// check runs as the gateway starts, and may not be in yet.
async fn healthy_by(ferry: &Ferry, by: Instant) {
    loop {
        let (code, body) = ferry.admin_get("/healthz");
        if (code, body.as_str()) == (200, r#"{"ok":true}"#) {
            return;
        }
        assert!(
            Instant::now() < by,
            "not healthy before the wedge: {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
