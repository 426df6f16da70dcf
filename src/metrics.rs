//! ferry's metrics: every counter, gauge and histogram in one registry,
//! rendered in the Prometheus text format ([`render`]).
//!
//! - Counters and histograms are bumped where the event happens, after its
//!   commit, through the functions here: a counter never counts something
//!   a failed commit took back. The conditions counted without labels
//!   (refusals, limits, oversize, dropped alerts) are [`Count`]s; their
//!   bump returns the running total for the log line beside it.
//! - No counter lives outside this module, and this module knows no
//!   component: what it labels are the floor-1 and wire enums
//!   ([`Direction`], [`AlertKind`], [`RejectCode`]), each label value the
//!   enum's own text (`labels.rs`).
//! - The registry is one per process, like the counts it holds: several
//!   gateways in one process (the tests) add to the same figures.
//! - Gauges of the store (backlogs, ages, dead letters, size) are set from
//!   the database on each scrape ([`set_store_gauges`]); the link gauges
//!   as the links go up and down. The embedded broker's own counters are
//!   read at scrape time (`broker.rs`).
//!
//! Every name is listed, with its meaning, in docs/OPERATIONS.md
//! ("Metrics"); the Grafana dashboard in `docs/grafana/` uses them.

use std::sync::atomic::AtomicU64;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use budget::{set_budget_holders, BudgetHolder};
pub use count::Count;
use labels::{dir, Dir, DirReason, Kind, REJECT_REASONS};
pub use stages::Stage;

use buckets::{fast_buckets, slow_buckets};

use crate::dead_letter::Direction;
use crate::protocol::alert::AlertKind;
use crate::protocol::envelope::RejectCode;

/// A family labelled by direction whose two series are made at start (a
/// rate over a series that appears with its first event misses that
/// event) and kept at hand: a count on the message path is an atomic add,
/// not a lookup in the family's map.
struct PerDir<M> {
    family: Family<Dir, M, fn() -> M>,
    up: M,
    down: M,
}

impl<M: Clone> PerDir<M>
where
    fn() -> M: prometheus_client::metrics::family::MetricConstructor<M>,
{
    fn new(family: Family<Dir, M, fn() -> M>) -> PerDir<M> {
        let up = family.get_or_create(&dir(Direction::Up)).clone();
        let down = family.get_or_create(&dir(Direction::Down)).clone();
        PerDir { family, up, down }
    }

    fn of(&self, d: Direction) -> &M {
        match d {
            Direction::Up => &self.up,
            Direction::Down => &self.down,
        }
    }
}

/// The registry and every metric in it.
pub struct Metrics {
    registry: Registry,
    received: PerDir<Counter>,
    stored: PerDir<Counter>,
    delivered: PerDir<Counter>,
    read: Family<Dir, Counter>,
    /// `read`'s one series (down).
    read_down: Counter,
    retried: PerDir<Counter>,
    dead_lettered: PerDir<Counter>,
    rejected: Family<DirReason, Counter>,
    expired: PerDir<Counter>,
    alerts: Family<Kind, Counter>,
    /// One per [`Count`], in [`Count::ALL`]'s order.
    counts: [Counter; Count::ALL.len()],
    backlog: Family<Dir, Gauge>,
    oldest_age: Family<Dir, Gauge<f64, AtomicU64>>,
    dead_letters: Gauge,
    devices_online: Gauge,
    north_connected: Gauge,
    north_endpoint_index: Gauge,
    south_connected: Gauge,
    sparkplug_host_online: Gauge,
    backend_present: Gauge,
    backend_ack_age: Gauge<f64, AtomicU64>,
    /// When the backend last sent an ack message (monotonic).
    backend_heard: Mutex<Option<Instant>>,
    store_bytes: Gauge,
    store_budget_bytes: Gauge,
    commit_seconds: Histogram,
    stored_receipt_seconds: Histogram,
    delivery_seconds: PerDir<Histogram>,
    stages: stages::Stages,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ferry");
        let m = Metrics {
            received: PerDir::new(Family::default()),
            stored: PerDir::new(Family::default()),
            delivered: PerDir::new(Family::default()),
            read: Family::default(),
            read_down: Counter::default(),
            retried: PerDir::new(Family::default()),
            dead_lettered: PerDir::new(Family::default()),
            rejected: Family::default(),
            expired: PerDir::new(Family::default()),
            alerts: Family::default(),
            counts: Default::default(),
            backlog: Family::default(),
            oldest_age: Family::default(),
            dead_letters: Gauge::default(),
            devices_online: Gauge::default(),
            north_connected: Gauge::default(),
            north_endpoint_index: Gauge::default(),
            south_connected: Gauge::default(),
            sparkplug_host_online: Gauge::default(),
            backend_present: Gauge::default(),
            backend_ack_age: Gauge::default(),
            backend_heard: Mutex::new(None),
            store_bytes: Gauge::default(),
            store_budget_bytes: Gauge::default(),
            commit_seconds: fast_buckets(),
            stored_receipt_seconds: fast_buckets(),
            delivery_seconds: PerDir::new(Family::new_with_constructor(
                slow_buckets as fn() -> Histogram,
            )),
            stages: stages::Stages::new(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "messages_received",
            "Messages that reached ferry: device publishes on uplink topics (up), backend downlinks (down)",
            m.received.family.clone(),
        );
        r.register(
            "messages_stored",
            "Messages committed to the store: new uplinks (up), deliveries queued for a device (down)",
            m.stored.family.clone(),
        );
        r.register(
            "messages_delivered",
            "Uplinks the backend acked (up); deliveries a device confirmed (down)",
            m.delivered.family.clone(),
        );
        r.register(
            "messages_read",
            "Deliveries a device's read cursor passed (down only)",
            m.read.clone(),
        );
        r.register(
            "messages_retried",
            "Failed attempts that will be retried: an uplink the backend did not take (up), an inbox batch sent again unconfirmed (down, per message)",
            m.retried.family.clone(),
        );
        r.register(
            "messages_dead_lettered",
            "Messages moved to DEAD: nacked, exhausted, expired (up) or nacked by the device (down)",
            m.dead_lettered.family.clone(),
        );
        r.register(
            "messages_rejected",
            "Messages answered `rejected`, by reason (rate and disk_budget are retryable and not stored)",
            m.rejected.clone(),
        );
        r.register(
            "messages_expired",
            "Messages whose expiry passed before delivery (up: also counted dead-lettered)",
            m.expired.family.clone(),
        );
        r.register(
            "alerts_raised",
            "Alerts raised, by kind (each is also a WARN alert_raised line and a message on the alerts topic)",
            m.alerts.clone(),
        );
        r.register(
            "backlog_messages",
            "Messages stored and not yet delivered: uplinks not acked by the backend, deliveries not confirmed by their device",
            m.backlog.clone(),
        );
        r.register(
            "oldest_undelivered_age_seconds",
            "Age of the oldest message in the backlog, 0 when it is empty",
            m.oldest_age.clone(),
        );
        r.register(
            "dead_letters",
            "Rows in the dead-letter table",
            m.dead_letters.clone(),
        );
        r.register(
            "devices_online",
            "Devices online: connected to the embedded broker, or (external mode) whose last status message said online",
            m.devices_online.clone(),
        );
        r.register(
            "north_connected",
            "1 while the session to the upstream broker is up",
            m.north_connected.clone(),
        );
        m.north_endpoint_index.set(-1);
        r.register(
            "north_endpoint_index",
            "The place in north.endpoints (0-based) of the upstream node the session is up on; -1 while it is down",
            m.north_endpoint_index.clone(),
        );
        r.register(
            "south_connected",
            "1 while the embedded listener runs, or the session to the site broker is up",
            m.south_connected.clone(),
        );
        m.sparkplug_host_online.set(-1);
        r.register(
            "sparkplug_host_online",
            "The Sparkplug B primary host followed (south.sparkplug.host_id): 1 while its STATE says online, 0 while not (Sparkplug uplinks are held, stored), -1 when none is followed",
            m.sparkplug_host_online.clone(),
        );
        r.register(
            "backend_present",
            "0 while uplinks wait on a backend that acks nothing (an ack timeout passed with no ack from it since the send), 1 otherwise",
            m.backend_present.clone(),
        );
        r.register(
            "backend_last_ack_age_seconds",
            "Seconds since the backend last sent an ack message (any message, ok or nack); NaN before the first",
            m.backend_ack_age.clone(),
        );
        r.register(
            "store_bytes",
            "The store's size as measured against store.max_db_bytes: pages in use plus the WAL",
            m.store_bytes.clone(),
        );
        r.register(
            "store_budget_bytes",
            "store.max_db_bytes",
            m.store_budget_bytes.clone(),
        );
        r.register(
            "store_commit_seconds",
            "Time to apply and commit (fsync) one batch of the store writer",
            m.commit_seconds.clone(),
        );
        r.register(
            "stored_receipt_seconds",
            "Time from a device's publish reaching intake to its `stored` receipt being sent",
            m.stored_receipt_seconds.clone(),
        );
        r.register(
            "delivery_seconds",
            "Time from a message's commit to its delivery: the backend's ack (up), the device's confirm (down)",
            m.delivery_seconds.family.clone(),
        );
        r.register(
            "uplink_stage_seconds",
            "An uplink's life by stage: queued (handed to the store writer → its batch begins), commit (the batch's apply and fsync), receipt (commit → `stored` receipt handed to the south broker), north_publish (commit → first publish handed to the north session), backend_ack (publish → the backend's ok applied)",
            m.stages.family.clone(),
        );
        r.register_collector(Box::new(count::Counts(m.counts.clone())));
        r.register_collector(Box::new(broker::Broker));
        r.register_collector(Box::new(budget::Holders));
        // Every series from the start, at 0: a rate over a series that
        // appears only with its first event misses that event.
        // (The per-direction counters and histograms made theirs in
        // `PerDir::new`, the stages theirs in `Stages::new`.)
        for d in Direction::ALL {
            let _ = m.backlog.get_or_create(&dir(d));
            let _ = m.oldest_age.get_or_create(&dir(d));
        }
        let read_down = m.read.get_or_create(&dir(Direction::Down)).clone();
        m.backend_present.set(1);
        m.backend_ack_age.set(f64::NAN);
        for kind in AlertKind::ALL {
            let _ = m.alerts.get_or_create(&Kind { kind });
        }
        for (d, codes) in REJECT_REASONS {
            for &code in codes {
                let _ = m.rejected.get_or_create(&DirReason::new(d, code));
            }
        }
        Metrics {
            registry,
            read_down,
            ..m
        }
    }
}

fn get() -> &'static Metrics {
    &METRICS
}

pub fn received(d: Direction) {
    get().received.of(d).inc();
}

pub fn stored(d: Direction, n: u64) {
    get().stored.of(d).inc_by(n);
}

pub fn delivered(d: Direction, n: u64) {
    get().delivered.of(d).inc_by(n);
}

pub fn read(n: u64) {
    get().read_down.inc_by(n);
}

pub fn retried(d: Direction, n: u64) {
    get().retried.of(d).inc_by(n);
}

pub fn dead_lettered(d: Direction, n: u64) {
    get().dead_lettered.of(d).inc_by(n);
}

pub fn expired(d: Direction, n: u64) {
    get().expired.of(d).inc_by(n);
}

/// A `rejected` answer with the receipt's reason `code`.
pub fn rejected(d: Direction, code: RejectCode) {
    get().rejected.get_or_create(&DirReason::new(d, code)).inc();
}

/// An alert of `kind` raised; returns how many alerts of every kind were
/// raised so far, this one included.
pub fn alert_raised(kind: AlertKind) -> u64 {
    let alerts = &get().alerts;
    alerts.get_or_create(&Kind { kind }).inc();
    AlertKind::ALL
        .into_iter()
        .map(|kind| alerts.get_or_create(&Kind { kind }).get())
        .sum()
}

/// `c` happened once more; returns its running total, this one included.
pub fn count(c: Count) -> u64 {
    count_n(c, 1)
}

/// `c` happened `n` times more; returns its running total.
pub fn count_n(c: Count, n: u64) -> u64 {
    get().counts[c as usize].inc_by(n) + n
}

pub fn commit_took(t: Duration) {
    get().commit_seconds.observe(t.as_secs_f64());
}

pub fn stored_receipt_took(t: Duration) {
    get().stored_receipt_seconds.observe(t.as_secs_f64());
}

/// One uplink spent `t` in `stage`.
pub fn stage_took(stage: Stage, t: Duration) {
    get().stages.of(stage).observe(t.as_secs_f64());
}

/// A delivery `ms` milliseconds after the message's commit.
pub fn delivery_took(d: Direction, ms: i64) {
    get()
        .delivery_seconds
        .of(d)
        .observe(ms.max(0) as f64 / 1000.0);
}

pub fn set_north_connected(up: bool) {
    get().north_connected.set(i64::from(up));
}

/// The north session is up on `north.endpoints[i]`, or (`None`) down.
pub fn set_north_endpoint(index: Option<usize>) {
    get()
        .north_endpoint_index
        .set(index.map_or(-1, |i| i as i64));
}

/// The Sparkplug primary host followed is online (`Some(true)`), not
/// (`Some(false)`), or none is followed (`None`).
pub fn set_sparkplug_host_online(online: Option<bool>) {
    get()
        .sparkplug_host_online
        .set(online.map_or(-1, i64::from));
}

pub fn set_south_connected(up: bool) {
    get().south_connected.set(i64::from(up));
}

pub fn set_backend_present(present: bool) {
    get().backend_present.set(i64::from(present));
}

/// The backend sent an ack message.
pub fn backend_heard() {
    if let Ok(mut at) = get().backend_heard.lock() {
        *at = Some(Instant::now());
    }
}

pub fn set_devices_online(n: usize) {
    get().devices_online.set(n as i64);
}

/// The messages in and out of each direction, as totals since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flow {
    /// Device publishes on uplink topics (`messages_received{up}`).
    pub uplink_in: u64,
    /// Uplinks the backend acked (`messages_delivered{up}`).
    pub uplink_out: u64,
    /// Backend downlinks (`messages_received{down}`).
    pub downlink_in: u64,
    /// Deliveries devices confirmed (`messages_delivered{down}`).
    pub downlink_out: u64,
}

/// The totals of [`Flow`] now.
pub fn flow() -> Flow {
    let m = get();
    Flow {
        uplink_in: m.received.up.get(),
        uplink_out: m.delivered.up.get(),
        downlink_in: m.received.down.get(),
        downlink_out: m.delivered.down.get(),
    }
}

/// The store's figures as of a scrape.
#[derive(Debug, Clone, Default)]
pub struct StoreGauges {
    pub uplink_backlog: i64,
    pub uplink_oldest_age_s: Option<f64>,
    pub downlink_backlog: i64,
    pub downlink_oldest_age_s: Option<f64>,
    pub dead_letters: i64,
    pub store_bytes: u64,
    pub budget_bytes: u64,
}

pub fn set_store_gauges(g: &StoreGauges) {
    let m = get();
    m.backlog
        .get_or_create(&dir(Direction::Up))
        .set(g.uplink_backlog);
    m.backlog
        .get_or_create(&dir(Direction::Down))
        .set(g.downlink_backlog);
    m.oldest_age
        .get_or_create(&dir(Direction::Up))
        .set(g.uplink_oldest_age_s.unwrap_or(0.0));
    m.oldest_age
        .get_or_create(&dir(Direction::Down))
        .set(g.downlink_oldest_age_s.unwrap_or(0.0));
    m.dead_letters.set(g.dead_letters);
    m.store_bytes.set(g.store_bytes as i64);
    m.store_budget_bytes.set(g.budget_bytes as i64);
}

/// Every metric in the Prometheus (OpenMetrics) text format.
pub fn render() -> String {
    let m = get();
    if let Some(at) = m.backend_heard.lock().ok().and_then(|at| *at) {
        m.backend_ack_age.set(at.elapsed().as_secs_f64());
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &get().registry);
    out
}

mod broker;
mod buckets;
mod budget;
mod count;
mod labels;
mod stages;
#[cfg(test)]
mod tests;
