//! An absent backend: the upstream broker is up, the application behind
//! it acks nothing. Its messages wait, uncounted; a message it ignores
//! while it acks others is still dead-lettered (docs/PROTOCOL.md, "An
//! absent backend").

use super::*;
use crate::support::receipts::{eventually, ids_with};
use crate::support::BareClient;

/// Small timeouts, few attempts: without the rule every message would be
/// dead-lettered within about a second of the backend's absence.
fn impatient(gateway: &str, mq: &Mosquitto) -> FerryOpts {
    FerryOpts::new(gateway, mq.port).with(|c| {
        c.north.ack_timeout_ms = 200;
        c.retry.max_attempts = 3;
        c.retry.base_ms = 100;
        c.retry.max_ms = 800;
        c.retry.jitter = 0.0;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_seconds_without_a_backend_dead_letter_nothing_and_it_gets_everything_once_in_order_whenever_it_comes(
) {
    let mq = Mosquitto::start();
    let gw = "gw-nobackend";
    let ferry = Ferry::start(impatient(gw, &mq));
    // A consumer that is subscribed and acks nothing (paused, or a backend
    // whose application is down): it counts the resends.
    let mut paused = Backend::connect(mq.port, gw).await;
    let boot = boot_id();
    let mut devices = Vec::new();
    let mut ids = HashMap::new();
    for name in ["press-1", "press-2"] {
        let device = Device::connect(ferry.south_port, name).await;
        ids.insert(name, device.publish_many("t", &boot, name, 5).await);
        devices.push(device);
    }

    let started = Instant::now();
    let mut resends: HashMap<(String, u64), usize> = HashMap::new();
    let mut receipts: HashMap<&str, Vec<Value>> = HashMap::new();
    while started.elapsed() < SECS_30 {
        for m in paused.drain_for(Duration::from_millis(100)).await {
            let seq = m.seq().expect("a seq");
            *resends.entry((m.device().to_string(), seq)).or_default() += 1;
        }
        for d in &mut devices {
            while let Some(r) = d.next_receipt(Duration::from_millis(1)).await {
                receipts.entry(d_name(&r, &ids)).or_default().push(r);
            }
        }
    }
    // While the backend is away each device sends only its oldest message
    // again (and, every retry.max_attempts-th round, the next one behind
    // it): the rest went once, before a timeout found the backend silent.
    for name in ["press-1", "press-2"] {
        let mut mine: Vec<(u64, usize)> = resends
            .iter()
            .filter(|((d, _), _)| d == name)
            .map(|((_, seq), n)| (*seq, *n))
            .collect();
        mine.sort();
        let sends = |i: usize| mine.get(i).map_or(0, |(_, n)| *n);
        assert!(
            sends(0) >= 15,
            "{name}'s oldest was sent again and again, far past retry.max_attempts (3): {mine:?}"
        );
        assert!(
            (2..mine.len()).all(|i| sends(i) <= 1),
            "{name}'s later messages wait behind the oldest: {mine:?}"
        );
    }
    for (name, got) in &receipts {
        assert_eq!(ids_with(got, "stored").len(), 5, "{name}: {got:?}");
        assert!(
            got.iter().all(|r| status(r) == "stored"),
            "{name} was told nothing but `stored`: {got:?}"
        );
    }
    assert_eq!(ferry.query_i64("SELECT count(*) FROM dead_letter", []), 0);
    assert_eq!(
        ferry.query_i64("SELECT max(attempts) FROM uplink", []),
        0,
        "no attempt counted"
    );
    let m = ferry.metrics();
    assert_eq!(m.value("ferry_backend_present"), 0.0, "{}", m.0);
    assert_eq!(m.value("ferry_north_connected"), 1.0);
    assert_eq!(
        m.value("ferry_uplink_resends_backend_behind_total"),
        0.0,
        "away, not behind"
    );
    let status_view = ferry.admin_json("/api/status");
    assert_eq!(status_view["backend"]["present"], false, "{status_view}");
    let status_json = crate::ops::cli_json(&ferry, &["status"]);
    assert_eq!(status_json["backend"]["present"], false, "{status_json}");
    let (code, text, err) = crate::ops::cli(&ferry.config_path, &["status"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.lines().any(|l| l.starts_with("backend: silent since")),
        "ferry status says the backend is silent:\n{text}"
    );
    let log = ferry.log();
    assert_eq!(
        log.matches("event=\"backend_silent\"").count(),
        1,
        "one line per silence, not per timeout:\n{}",
        ferry.log_tail()
    );

    // The backend's application comes back at a moment not aligned with
    // ferry's resends (each run a different offset into a round).
    drop(paused);
    let offset = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() % 1_000_000_000);
    tokio::time::sleep(Duration::from_nanos(u64::from(offset))).await;
    let mut backend = Backend::connect_auto_ack(mq.port, gw).await;
    for d in &mut devices {
        let name = device_name(d, &ids);
        let mine = ids[name.as_str()].clone();
        let got = d
            .receipts_until(SECS_10, |all| {
                ids_with(all, "delivered").len() == mine.len()
            })
            .await;
        let delivered: Vec<u64> = got
            .iter()
            .filter(|r| status(r) == "delivered")
            .filter_map(|r| r["seq"].as_u64())
            .collect();
        assert_eq!(
            delivered.len(),
            5,
            "{name}: delivered once each (offset {offset} ns): {got:?}"
        );
        assert!(
            delivered.windows(2).all(|w| w[0] < w[1]),
            "{name}: delivered in seq order (offset {offset} ns): {delivered:?}"
        );
    }
    let north = backend.drain_for(Duration::from_millis(500)).await;
    let mut duplicates = 0;
    for name in ["press-1", "press-2"] {
        let mut first = Vec::new();
        for m in north.iter().filter(|m| m.device() == name) {
            let seq = m.seq().expect("a seq");
            if first.contains(&seq) {
                duplicates += 1;
            } else {
                first.push(seq);
            }
        }
        assert_eq!(first.len(), 5, "{name}: {north:?}");
        assert!(
            first.windows(2).all(|w| w[0] < w[1]),
            "{name}: first arrivals in seq order (offset {offset} ns): {first:?}"
        );
    }
    // The backend acks each at once, well inside the ack timeout, so
    // nothing that reached it is sent again; at most a device's probe
    // whose ack came back late.
    assert!(
        duplicates <= 2,
        "{duplicates} duplicates at the backend (offset {offset} ns): {north:?}"
    );
    assert_eq!(ferry.query_i64("SELECT count(*) FROM dead_letter", []), 0);
    assert!(
        ferry.log().contains("event=\"backend_heard\""),
        "{}",
        ferry.log_tail()
    );
    let m = ferry.metrics();
    assert_eq!(m.value("ferry_backend_present"), 1.0);
    assert!(m.value("ferry_backend_last_ack_age_seconds") < 10.0);
    assert_eq!(
        m.value(r#"ferry_messages_dead_lettered_total{direction="up"}"#),
        0.0
    );
    let status_view = ferry.admin_json("/api/status");
    assert_eq!(status_view["backend"]["present"], true, "{status_view}");
}

/// Which device a receipt is for, by the msg_ids each was given.
fn d_name(r: &Value, ids: &HashMap<&'static str, Vec<String>>) -> &'static str {
    let id = r["msg_id"].as_str().unwrap_or_default();
    ids.iter()
        .find(|(_, mine)| mine.iter().any(|m| m == id))
        .map_or("?", |(name, _)| name)
}

fn device_name(d: &Device, ids: &HashMap<&'static str, Vec<String>>) -> String {
    let topic = d.up_topic("t");
    ids.keys()
        .find(|name| topic.contains(&format!("/{name}/")))
        .map(|n| n.to_string())
        .expect("a known device")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_backend_never_acks_while_it_acks_the_rest_is_dead_lettered_after_max_attempts(
) {
    let mq = Mosquitto::start();
    let gw = "gw-ignored";
    let ferry = Ferry::start(impatient(gw, &mq));
    let mut backend = Backend::connect(mq.port, gw).await;
    let mut device = Device::connect(ferry.south_port, "press-9").await;
    let boot = boot_id();
    let ignored = format!("{boot}-ignored");
    device
        .publish_envelope("t", &ignored, json!({"v": 0}))
        .await;
    let mut rest = Vec::new();
    let mut sends_of_ignored = 0;
    let started = Instant::now();
    let mut receipts = Vec::new();
    // The rest keep coming, one every 100 ms, and are acked at once.
    while started.elapsed() < SECS_10 {
        let id = format!("{boot}-{:04}", rest.len());
        device.publish_envelope("t", &id, json!({"v": 1})).await;
        rest.push(id);
        for m in backend.drain_for(Duration::from_millis(100)).await {
            if m.msg_id() == ignored {
                sends_of_ignored += 1;
            } else {
                backend.ack_ok(m.device(), m.msg_id()).await;
            }
        }
        while let Some(r) = device.next_receipt(Duration::from_millis(1)).await {
            receipts.push(r);
        }
        if receipts
            .iter()
            .any(|r| r["msg_id"] == ignored && status(r) == "failed")
        {
            break;
        }
    }
    let failed = receipts
        .iter()
        .find(|r| r["msg_id"] == ignored && status(r) == "failed")
        .unwrap_or_else(|| panic!("never dead-lettered: {receipts:?}\n{}", ferry.log_tail()));
    let reason = failed["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("exhausted: 3 attempts, last: no ack within 200 ms"),
        "{reason}"
    );
    assert!(
        sends_of_ignored >= 3,
        "sent at least max_attempts times: {sends_of_ignored}"
    );
    // The rest still unacked are acked when they come again.
    backend.set_auto_ack(true);
    let got = device
        .receipts_until(SECS_10, |all| {
            let mut all_seen = receipts.clone();
            all_seen.extend_from_slice(all);
            rest.iter().all(|id| {
                all_seen
                    .iter()
                    .any(|r| r["msg_id"] == id.as_str() && status(r) == "delivered")
            })
        })
        .await;
    receipts.extend(got);
    for id in &rest {
        assert!(
            receipts
                .iter()
                .any(|r| r["msg_id"] == id.as_str() && status(r) == "delivered"),
            "{id} delivered while the ignored one was retried: {receipts:?}"
        );
    }
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM dead_letter", []),
        1,
        "only the ignored one"
    );
}

/// Alerts from `ferry/{gw}/alerts` for `window`, `backend_silent` only.
async fn silent_alerts(watcher: &mut BareClient, window: Duration) -> Vec<Value> {
    let until = Instant::now() + window;
    let mut got = Vec::new();
    while let Some(a) = watcher
        .next_json(until.saturating_duration_since(Instant::now()))
        .await
    {
        if a["kind"] == "backend_silent" {
            got.push(a);
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_acks_nothing_is_alerted_once_per_silence() {
    let mq = Mosquitto::start();
    let gw = "gw-silent-alert";
    let ferry = Ferry::start(impatient(gw, &mq).with(|c| c.alerts.backend_silent_s = 2));
    let mut watcher = BareClient::connect(
        mq.port,
        "silent-watcher",
        vec![format!("ferry/{gw}/alerts")],
    )
    .await;
    let paused = Backend::connect(mq.port, gw).await;
    let device = Device::connect(ferry.south_port, "press-4").await;
    let boot = boot_id();
    device
        .publish_envelope("t", &format!("{boot}-a"), json!(1))
        .await;

    // Silent from the first ack timeout (0.2 s); looked at every 5 s.
    let first = silent_alerts(&mut watcher, SECS_10).await;
    assert_eq!(first.len(), 1, "{first:?}\n{}", ferry.log_tail());
    let detail = first[0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("alerts.backend_silent_s = 2"), "{detail}");
    // Two more looks while the silence lasts: nothing new.
    let again = silent_alerts(&mut watcher, Duration::from_secs(11)).await;
    assert!(again.is_empty(), "once per silence: {again:?}");
    let m = ferry.metrics();
    assert_eq!(
        m.value(r#"ferry_alerts_raised_total{kind="backend_silent"}"#),
        1.0
    );

    // Heard again, then silent again: a second silence, a second alert.
    drop(paused);
    let backend = Backend::connect_auto_ack(mq.port, gw).await;
    eventually(SECS_10, "the backend heard again", || {
        ferry.metrics().value("ferry_backend_present") == 1.0
    })
    .await;
    drop(backend);
    device
        .publish_envelope("t", &format!("{boot}-b"), json!(2))
        .await;
    let second = silent_alerts(&mut watcher, SECS_10).await;
    assert_eq!(second.len(), 1, "{second:?}\n{}", ferry.log_tail());
    assert_eq!(
        ferry
            .metrics()
            .value(r#"ferry_alerts_raised_total{kind="backend_silent"}"#),
        2.0
    );
}

/// A backend that is there but behind: it works through what reaches it
/// in order, one message every 50 ms (resends included, as a real one
/// would), so most acks come long after the 200 ms ack timeout, and every
/// ack it sends is of a message sent before the ones still waiting. Each
/// message waits for it, uncounted: none is dead-lettered (the rule before
/// counted every one of those timeouts, and killed the later messages
/// after 3), and every one is delivered, stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_behind_by_more_than_the_ack_timeout_dead_letters_nothing() {
    let mq = Mosquitto::start();
    let gw = "gw-behind";
    let ferry = Ferry::start(impatient(gw, &mq));
    let mut backend = Backend::connect(mq.port, gw).await;
    let mut device = Device::connect(ferry.south_port, "press-7").await;
    let boot = boot_id();
    let ids: Vec<String> = (0..30).map(|i| format!("{boot}-{i:02}")).collect();
    for id in &ids {
        device.publish_envelope("t", id, json!({"v": 1})).await;
    }
    let mut queue = std::collections::VecDeque::new();
    let mut acked = std::collections::HashSet::new();
    let mut arrivals = 0;
    let started = Instant::now();
    while acked.len() < ids.len() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "acked {} of {} in 60 s\n{}",
            acked.len(),
            ids.len(),
            ferry.log_tail()
        );
        for m in backend.drain_for(Duration::from_millis(50)).await {
            arrivals += 1;
            queue.push_back((m.device().to_owned(), m.msg_id().to_owned()));
        }
        if let Some((d, id)) = queue.pop_front() {
            backend.ack_ok(&d, &id).await;
            acked.insert(id);
        }
    }
    let receipts = device
        .receipts_until(SECS_10, |all| {
            ids.iter().all(|id| {
                all.iter()
                    .any(|r| r["msg_id"] == id.as_str() && status(r) == "delivered")
            })
        })
        .await;
    for id in &ids {
        assert!(
            receipts
                .iter()
                .any(|r| r["msg_id"] == id.as_str() && status(r) == "delivered"),
            "{id} not delivered: {receipts:?}\n{}",
            ferry.log_tail()
        );
        assert!(
            !receipts
                .iter()
                .any(|r| r["msg_id"] == id.as_str() && status(r) == "failed"),
            "{id} dead-lettered by a backend that was only behind"
        );
    }
    assert_eq!(ferry.query_i64("SELECT count(*) FROM dead_letter", []), 0);
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM uplink WHERE state = 'delivered'", []),
        30
    );
    // It was behind: messages were sent again while it caught up, each
    // resend counted, and one line said so (at most one a minute).
    assert!(arrivals > ids.len(), "{arrivals} arrivals: never behind");
    let resends = ferry
        .metrics()
        .value("ferry_uplink_resends_backend_behind_total");
    assert!(
        resends >= 1.0 && resends <= (arrivals - ids.len()) as f64 + 32.0,
        "{resends} resends counted for {arrivals} arrivals"
    );
    let log = ferry.log();
    assert_eq!(
        crate::support::logged(&log, "backend_behind", " WARN "),
        1,
        "{log}"
    );
    assert_eq!(crate::support::logged(&log, "backend_silent", ""), 0);
}
