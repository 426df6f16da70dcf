//! What devices' kept sessions cost in memory (vendor/README.md, patch 61):
//! a session holds at most 256 messages / 256 KiB counted by what they
//! really cost, all sessions together at most `south.max_session_bytes`,
//! and past that a session keeps its subscriptions but no more messages,
//! counted and said. Measured on the real binary by its RSS, with devices
//! that publish and never acknowledge their receipts, so that what they
//! leave behind is sessions filled to their bound (docs/BENCHMARKS.md
//! "Sessions", docs/SECURITY.md "MQTT 5 and sessions").

use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use serde_json::json;

use crate::support::admin::Metrics;
use crate::support::{free_port, logged, rss_kib, Ferry, FerryOpts, RawMqtt};

const SECS_30: Duration = Duration::from_secs(30);
/// Receipts a session keeps, at most (vendor `router/sessions.rs`).
const SESSION_MESSAGES: usize = 256;
/// Uplinks each device sends: more receipts than its session keeps.
const UPLINKS: usize = 260;
/// What one session full of receipts may cost in ferry's RSS, KiB: the
/// figure docs/SECURITY.md and docs/BENCHMARKS.md give (measured: 39–40,
/// what the broker counts; 81–82 before sessions kept their messages
/// compactly).
const SESSION_KIB: u64 = 48;

/// A CONNECT as `id` with this clean session flag, its `ack` subscribed
/// if `subscribe`; the client and whether its session was present.
async fn connect(port: u16, id: &str, clean_session: bool, subscribe: bool) -> (RawMqtt, bool) {
    let (mut raw, ack) = RawMqtt::connect_session(port, id, clean_session).await;
    if subscribe {
        raw.subscribe(&[format!("devices/{id}/ack")]).await;
    }
    (raw, ack.session_present)
}

/// `id` connects, sends `uplinks` uplinks, reads their PUBACKs (so the
/// broker has every one), acknowledges none of its receipts, and is gone.
async fn publish_and_vanish(
    port: u16,
    id: String,
    round: &str,
    clean_session: bool,
    uplinks: usize,
) {
    let (mut raw, _) = connect(port, &id, clean_session, true).await;
    let publishes: Vec<_> = (0..uplinks)
        .map(|i| {
            let body = json!({"msg_id": format!("{round}-{i:04}"), "payload": {"t": i}});
            raw.publish(
                &format!("devices/{id}/up/t"),
                serde_json::to_vec(&body).unwrap(),
            )
        })
        .collect();
    raw.send_many(publishes).await;
    let mut acked = 0;
    while acked < uplinks {
        match raw.recv(SECS_30).await {
            Some(rumqttc::Packet::PubAck(_)) => acked += 1,
            Some(_) => {}
            None => panic!("{id}: PUBACKs for {acked} of {uplinks}"),
        }
    }
}

/// Every device in `ids` publishes `uplinks` and vanishes, 50 at a time;
/// then waits until every uplink is answered and the answers have settled.
async fn round(ferry: &Ferry, ids: &[String], round: &str, clean_session: bool, uplinks: usize) {
    let port = ferry.south_port;
    let limited = || {
        let m: Metrics = ferry.metrics();
        m.value("ferry_rate_limited_from_devices_total") as usize
    };
    let want = limited() + ids.len() * (uplinks - 1);
    stream::iter(ids.iter().cloned())
        .map(|id| publish_and_vanish(port, id, round, clean_session, uplinks))
        .buffer_unordered(50)
        .collect::<Vec<()>>()
        .await;
    // The first of each device's uplinks may be stored, the rest are not.
    crate::support::receipts::eventually(SECS_30, "every uplink answered", || limited() >= want)
        .await;
    let mut last = 0;
    while limited() != last {
        last = limited();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Their receipts reach the broker within moments.
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// ferry's RSS once it has handed back what it freed (it trims every
/// [`ferry::memory::TRIM_EVERY`]), KiB.
async fn settled_rss_kib(pid: u32) -> u64 {
    tokio::time::sleep(ferry::memory::TRIM_EVERY + Duration::from_secs(1)).await;
    rss_kib(pid).unwrap()
}

fn device_ids(n: usize, tag: &str) -> Vec<String> {
    (0..n).map(|i| format!("{tag}-{i:03}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_full_of_receipts_costs_at_most_its_documented_memory() {
    let devices = 1000;
    // Each device's first uplink is stored, the rest answered `rejected`
    // (rate) without the store: receipts cheaply, so that there can be
    // enough sessions for their memory to stand out of the allocator's.
    let ferry = Ferry::start(FerryOpts::new("gw-sess-mem", free_port()).with(|c| {
        c.south.max_connections = 2 * devices;
        c.south.rate_per_s = 0.1;
        c.south.burst = 1;
    }));
    let pid = ferry.pid().expect("ferry runs");
    let ids = device_ids(devices, "mem");
    // The same devices, the same work, with clean sessions: what the
    // store, the pipeline and the allocator settle at without sessions.
    round(&ferry, &ids, "clean", true, UPLINKS).await;
    let before = settled_rss_kib(pid).await;
    round(&ferry, &ids, "kept", false, UPLINKS).await;
    let full = devices * (UPLINKS - SESSION_MESSAGES);
    let left_out = || {
        let m: Metrics = ferry.metrics();
        m.value("ferry_broker_session_messages_left_out_total") as usize
    };
    crate::support::receipts::eventually(SECS_30, "every session is full", || left_out() == full)
        .await;
    let after = settled_rss_kib(pid).await;
    let m: Metrics = ferry.metrics();
    assert_eq!(left_out(), full, "no more than full");
    let over_budget = m.get("ferry_broker_session_messages_over_budget_total");
    assert!(over_budget.unwrap_or(0.0) == 0.0, "{over_budget:?}");
    let per_session = (after.saturating_sub(before)) / devices as u64;
    let counted = m.get("ferry_broker_session_bytes").unwrap_or(0.0) / devices as f64 / 1024.0;
    eprintln!(
        "{devices} sessions of {SESSION_MESSAGES} receipts: RSS {before} -> {after} KiB, \
         {per_session} KiB per session ({counted:.1} KiB counted)"
    );
    assert!(
        per_session <= SESSION_KIB,
        "{per_session} KiB per full session > {SESSION_KIB} KiB"
    );

    // They are real: a device comes back to its 256 receipts.
    let (mut raw, present) = connect(ferry.south_port, &ids[0], false, false).await;
    assert!(present);
    let mut again = 0;
    raw.read_publishes(SECS_30, |_| {
        again += 1;
        again == SESSION_MESSAGES
    })
    .await;
    assert_eq!(again, SESSION_MESSAGES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_of_all_sessions_a_session_keeps_its_subscriptions_and_no_more_messages() {
    let budget = 16 << 10;
    let ferry = Ferry::start(FerryOpts::new("gw-sess-budget", free_port()).with(|c| {
        c.south.max_session_bytes = budget;
        c.south.rate_per_s = 0.1;
        c.south.burst = 1;
    }));
    let port = ferry.south_port;
    // The first session takes what it needs of the budget; the next
    // twenty take the rest and find it spent; the last finds it spent.
    round(&ferry, &device_ids(1, "first"), "first", false, 60).await;
    let kept_first = ferry.metrics().value("ferry_broker_session_bytes");
    assert!(
        kept_first > 0.0 && kept_first <= budget as f64,
        "{kept_first}"
    );
    round(&ferry, &device_ids(20, "late"), "late", false, 60).await;
    let over_late = ferry
        .metrics()
        .value("ferry_broker_session_messages_over_budget_total");
    round(&ferry, &device_ids(1, "last"), "last", false, 60).await;

    let m: Metrics = ferry.metrics();
    let kept = m.value("ferry_broker_session_bytes");
    assert!(kept <= budget as f64, "{kept} bytes kept > {budget}");
    let over = m.value("ferry_broker_session_messages_over_budget_total");
    // What the first left of the budget holds a few dozen receipts.
    assert!(
        (15.0 * 60.0..20.0 * 60.0).contains(&over_late),
        "all but what fits in the rest of the budget are left out and counted: {over_late}"
    );
    assert_eq!(over - over_late, 60.0, "all of the last one's");
    assert_eq!(m.value("ferry_broker_session_messages_left_out_total"), 0.0);
    let log = ferry.log();
    assert_eq!(
        logged(&log, "sessions_full", "WARN"),
        1,
        "said at once, then not again within the minute:\n{log}"
    );

    // The first comes back to its receipts.
    let (mut raw, present) = connect(port, "first-000", false, false).await;
    assert!(present);
    let mut again = 0;
    raw.read_publishes(SECS_30, |_| {
        again += 1;
        again == 60
    })
    .await;
    assert_eq!(again, 60);
    // The last one has its session, and its subscription: a new uplink's
    // receipt comes without a SUBSCRIBE, and nothing from before.
    let (mut raw, present) = connect(port, "last-000", false, false).await;
    assert!(present, "its session is kept");
    let body = json!({"msg_id": "after-1", "payload": 1});
    let publish = raw.publish("devices/last-000/up/t", serde_json::to_vec(&body).unwrap());
    raw.send(publish).await;
    let mut seen = Vec::new();
    raw.read_publishes(SECS_30, |p| {
        let r: serde_json::Value = serde_json::from_slice(&p.payload).unwrap();
        seen.push(r["msg_id"].as_str().unwrap_or("").to_string());
        r["msg_id"] == "after-1"
    })
    .await;
    assert_eq!(seen, ["after-1"]);
}

/// The defaults with every session full: ten thousand devices away (as
/// many sessions as `south.max_connections` keeps), each leaving more
/// receipts than its session holds. All of them together are held to
/// `south.max_session_bytes` (128 MiB), and ferry stays well within a
/// 1 GiB box (docs/BENCHMARKS.md "Sessions"). Minutes, not seconds:
/// `cargo test --test tests session_memory -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes: measures docs/BENCHMARKS.md's sessions at the defaults"]
async fn ten_thousand_full_sessions_at_the_defaults_fit_in_a_gigabyte() {
    crate::support::raise_fd_limit();
    let devices = 10_000;
    let defaults = ferry::config::RawConfig::default().south;
    let ferry = Ferry::start(FerryOpts::new("gw-sess-10k", free_port()).with(|c| {
        c.south.max_connections = defaults.max_connections;
        c.south.rate_per_s = 0.1;
        c.south.burst = 1;
    }));
    let pid = ferry.pid().expect("ferry runs");
    let start = settled_rss_kib(pid).await;
    round(&ferry, &device_ids(devices, "k"), "kept", false, UPLINKS).await;
    let after = settled_rss_kib(pid).await;
    let m: Metrics = ferry.metrics();
    let kept = m.value("ferry_broker_session_bytes");
    let over = m.value("ferry_broker_session_messages_over_budget_total");
    eprintln!(
        "{devices} sessions at the defaults: RSS {start} -> {after} KiB; \
         {kept} bytes kept (max {}), {over} receipts left out over it",
        defaults.max_session_bytes
    );
    assert!(kept <= defaults.max_session_bytes as f64);
    assert!(over > 0.0, "more than the budget was wanted");
    assert!(after < 1 << 20, "{after} KiB");
}
