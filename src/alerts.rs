//! Alerts for the backend's operators, on `ferry/{gateway}/alerts` as
//! `{"kind", "detail", "ts"}`, each also a WARN log event and a count
//! (`ferry_alerts_raised_total{kind}`):
//! - `dead_letter`: a message was dead-lettered (either direction; found by
//!   the dead-letter table's ids, so every path that writes one is seen);
//! - `north_down`: the upstream link has been down longer than
//!   `alerts.north_down_s` (once per outage);
//! - `backlog_age`: the oldest undelivered message is older than
//!   `alerts.backlog_age_s` (once, until the backlog is younger again);
//! - `disk_budget`: the store reached `store.max_db_bytes` (once, until it
//!   is under it again);
//! - `backend_silent`: uplinks have waited on a backend that acks nothing
//!   for longer than `alerts.backend_silent_s` (once per silence).
//!
//! Delivery: alerts wait in memory while the link is down and are sent
//! when it is up; one the upstream has not acknowledged when the link
//! drops is sent again. A restart loses the queue, but nothing in it for
//! good: the store marks how far the dead letters' alerts were
//! acknowledged (`alert_mark`), and the next run raises those past the
//! mark again; the other conditions are still in the store and raise
//! their alerts again if they last. Past [`MAX_QUEUED`] waiting the oldest
//! are dropped, counted and logged.
//!
//! What to raise is decided by [`Monitor`], free of I/O and clocks.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::clip::Clip;
use crate::config::AlertsConfig;
use crate::metrics::{self, Count};
use crate::north::{AlertEvent, Link, NorthSender, Tag};
pub use crate::protocol::alert::AlertKind;
use crate::protocol::now_ms;
use crate::shutdown::Shutdown;
use crate::store::{AlertScan, Store};

/// Alerts waiting for the link, at most.
pub const MAX_QUEUED: usize = 10_000;
/// How often the store is looked at.
const CHECK_EVERY: Duration = Duration::from_secs(5);
/// Dead letters read per check; past it, one alert says how many more.
const DEAD_PER_CHECK: usize = 100;

/// One alert as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alert {
    pub kind: AlertKind,
    pub detail: String,
    pub ts: i64,
    /// A dead-letter alert: the dead-letter ids it stands for, `(after,
    /// upto]`. Not published; marks them alerted once acknowledged.
    #[serde(skip)]
    pub covers: Option<(i64, i64)>,
}

/// Decides what to raise from what it is shown.
#[derive(Debug)]
pub struct Monitor {
    cfg: AlertsConfig,
    /// Since when the link is down (`None`: up).
    down_since: Option<Instant>,
    north_raised: bool,
    /// Since when the backend is silent (`None`: it is not).
    silent_since: Option<Instant>,
    silent_raised: bool,
    backlog_raised: bool,
    budget_raised: bool,
}

impl Monitor {
    /// The link starts down, as of `now`.
    pub fn new(cfg: AlertsConfig, now: Instant) -> Monitor {
        Monitor {
            cfg,
            down_since: Some(now),
            north_raised: false,
            silent_since: None,
            silent_raised: false,
            backlog_raised: false,
            budget_raised: false,
        }
    }

    /// Whether the condition of `kind` was raised and is not over yet (a
    /// dead letter never stays open: each is an alert of its own).
    pub fn is_open(&self, kind: AlertKind) -> bool {
        match kind {
            AlertKind::NorthDown => self.north_raised,
            AlertKind::BackendSilent => self.silent_raised,
            AlertKind::BacklogAge => self.backlog_raised,
            AlertKind::DiskBudget => self.budget_raised,
            AlertKind::DeadLetter => false,
        }
    }

    pub fn link_up(&mut self) {
        self.down_since = None;
        self.north_raised = false;
    }

    pub fn link_down(&mut self, now: Instant) {
        self.down_since.get_or_insert(now);
    }

    /// The uplink engine found the backend silent since then, or no longer.
    pub fn backend_silent(&mut self, since: Option<Instant>) {
        if since.is_none() {
            self.silent_raised = false;
        }
        self.silent_since = since;
    }

    /// The alerts due at `now` (`now_ms` on the wall clock) given `scan`.
    pub fn check(&mut self, now: Instant, now_ms: i64, scan: &AlertScan) -> Vec<Alert> {
        let mut out = Vec::new();
        let alert = |kind, detail: String| Alert {
            kind,
            detail,
            ts: now_ms,
            covers: None,
        };
        if let Some(since) = self.down_since {
            let down = now.saturating_duration_since(since);
            if down >= self.cfg.north_down && !self.north_raised {
                self.north_raised = true;
                out.push(alert(
                    AlertKind::NorthDown,
                    format!(
                        "the upstream link has been down for {} s (alerts.north_down_s = {})",
                        down.as_secs(),
                        self.cfg.north_down.as_secs()
                    ),
                ));
            }
        }
        if let Some(since) = self.silent_since {
            let silent = now.saturating_duration_since(since);
            if silent >= self.cfg.backend_silent && !self.silent_raised {
                self.silent_raised = true;
                out.push(alert(
                    AlertKind::BackendSilent,
                    format!(
                        "the backend has acked nothing for {} s while uplinks wait for it (alerts.backend_silent_s = {}); {} uplinks waiting",
                        silent.as_secs(),
                        self.cfg.backend_silent.as_secs(),
                        scan.backlog.uplinks
                    ),
                ));
            }
        }
        let age = [scan.oldest_uplink_age, scan.oldest_downlink_age]
            .into_iter()
            .flatten()
            .max();
        match age {
            Some(age) if age >= self.cfg.backlog_age => {
                if !self.backlog_raised {
                    self.backlog_raised = true;
                    out.push(alert(
                        AlertKind::BacklogAge,
                        format!(
                            "the oldest undelivered message is {} s old (alerts.backlog_age_s = {}); {} uplinks waiting",
                            age.as_secs(),
                            self.cfg.backlog_age.as_secs(),
                            scan.backlog.uplinks
                        ),
                    ));
                }
            }
            _ => self.backlog_raised = false,
        }
        if scan.over_budget && !self.budget_raised {
            self.budget_raised = true;
            out.push(alert(
                AlertKind::DiskBudget,
                format!(
                    "the store is at store.max_db_bytes ({} of {} bytes): new messages are refused until delivered ones are pruned; whose: {}",
                    scan.used_bytes,
                    scan.max_db_bytes,
                    scan.holders
                        .as_ref()
                        .map_or_else(|| "not read".to_string(), ToString::to_string)
                ),
            ));
        } else if !scan.over_budget {
            self.budget_raised = false;
        }
        let mut after = scan.after_dead;
        for d in &scan.dead {
            out.push(Alert {
                covers: Some((after, d.id)),
                ..alert(
                    AlertKind::DeadLetter,
                    format!(
                        "dead letter {} ({}): device {}, msg_id {}: {}",
                        d.id,
                        d.direction,
                        d.device.as_deref().unwrap_or("?"),
                        d.msg_id.as_deref().unwrap_or("?"),
                        d.reason
                    ),
                )
            });
            after = d.id;
        }
        if scan.more_dead > 0 {
            out.push(Alert {
                covers: Some((after, scan.max_dead_id)),
                ..alert(
                    AlertKind::DeadLetter,
                    format!("{} more dead letters since the last check", scan.more_dead),
                )
            });
        }
        out
    }
}

/// One alert waiting for the upstream's acknowledgement.
#[derive(Debug)]
struct Queued {
    id: u64,
    body: Bytes,
    /// The dead letters it stands for (see [`Alert::covers`]).
    covers: Option<(i64, i64)>,
}

/// Alerts not yet acknowledged by the upstream, and how far the dead
/// letters are alerted.
#[derive(Debug, Default)]
struct AlertQueue {
    next_id: u64,
    queued: VecDeque<Queued>,
    in_flight: BTreeMap<u64, Queued>,
    /// Dead-letter alerts not yet settled: `upto` → `after`.
    unsettled: BTreeMap<i64, i64>,
    /// The highest dead-letter id any alert stood for.
    raised_upto: i64,
}

impl AlertQueue {
    fn push(&mut self, body: Bytes, covers: Option<(i64, i64)>) {
        if self.queued.len() + self.in_flight.len() >= MAX_QUEUED {
            if let Some(dropped) = self.queued.pop_front() {
                // Counted and logged: not sent again after a restart.
                self.settle(&dropped);
            }
            let total = metrics::count(Count::AlertsDropped);
            warn!(
                event = "alert_dropped",
                total,
                max = MAX_QUEUED,
                "alert queue full while north is down; the oldest alert was dropped"
            );
        }
        if let Some((after, upto)) = covers {
            self.unsettled.insert(upto, after);
            self.raised_upto = self.raised_upto.max(upto);
        }
        self.next_id += 1;
        self.queued.push_back(Queued {
            id: self.next_id,
            body,
            covers,
        });
    }

    /// The link dropped: what was not acknowledged goes again, first.
    fn link_down(&mut self) {
        let again = std::mem::take(&mut self.in_flight);
        for (_, q) in again.into_iter().rev() {
            self.queued.push_front(q);
        }
    }

    /// Alert `id` was acknowledged (or refused, and logged): done.
    fn done(&mut self, id: u64) {
        if let Some(q) = self.in_flight.remove(&id) {
            self.settle(&q);
        }
    }

    fn settle(&mut self, q: &Queued) {
        if let Some((_, upto)) = q.covers {
            self.unsettled.remove(&upto);
        }
    }

    /// Every dead letter up to this id has had its alert settled.
    fn dead_alerted(&self) -> i64 {
        match self.unsettled.first_key_value() {
            Some((_, after)) => *after,
            None => self.raised_upto,
        }
    }
}

/// Where the alerts task goes: the session north and its topic, and the
/// open alerts (the conditions raised and not over yet).
pub struct Outlets {
    pub north: NorthSender,
    pub topic: String,
    pub open: watch::Sender<Vec<Alert>>,
}

/// Runs until shutdown begins or the store stops.
pub async fn run(
    cfg: watch::Receiver<AlertsConfig>,
    store: Store,
    Outlets { north, topic, open }: Outlets,
    mut events: mpsc::Receiver<AlertEvent>,
    mut silence: watch::Receiver<Option<Instant>>,
    mut shutdown: Shutdown,
) {
    let mut monitor = Monitor::new(*cfg.borrow(), Instant::now());
    let mut outbox = AlertQueue::default();
    let mut epoch: Option<u64> = None;
    // Dead letters whose alerts were acknowledged, in this run or an
    // earlier one, were someone's news already; the rest are raised again.
    let mut after_dead = match store.alert_scan(i64::MAX, 0).await {
        Ok(scan) => scan.dead_alerted,
        Err(_) => return,
    };
    outbox.raised_upto = after_dead;
    let mut marked = after_dead;
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // The thresholds may have changed while it runs.
        monitor.cfg = *cfg.borrow();
        tokio::select! {
            _ = shutdown.begun() => return,
            ev = events.recv() => match ev {
                Some(AlertEvent::Link(Link::Up(e))) => {
                    epoch = Some(e);
                    monitor.link_up();
                }
                Some(AlertEvent::Link(Link::Down)) => {
                    epoch = None;
                    monitor.link_down(Instant::now());
                    outbox.link_down();
                }
                Some(AlertEvent::Published(id)) => outbox.done(id),
                Some(AlertEvent::Refused(id)) => {
                    outbox.done(id);
                    warn!(event = "alert_refused", alert = id, "the upstream refused an alert; dropped");
                }
                None => return,
            },
            Ok(()) = silence.changed() => {
                let since = *silence.borrow_and_update();
                monitor.backend_silent(since);
                continue;
            }
            _ = tick.tick() => {
                let scan = match store.alert_scan(after_dead, DEAD_PER_CHECK).await {
                    Ok(scan) => scan,
                    Err(e) if e.is_fatal() => return,
                    Err(e) => {
                        debug!(error = %e, "alert check failed; tried again");
                        continue;
                    }
                };
                after_dead = after_dead.max(scan.max_dead_id);
                metrics::set_budget_holders(&budget_holders(&scan));
                for alert in monitor.check(Instant::now(), now_ms(), &scan) {
                    if alert.kind != AlertKind::DeadLetter {
                        open.send_modify(|o| {
                            o.retain(|a| a.kind != alert.kind);
                            o.push(alert.clone());
                        });
                    }
                    let total = metrics::alert_raised(alert.kind);
                    warn!(event = "alert_raised", kind = alert.kind.as_str(), detail = %Clip(&alert.detail), total, "alert raised");
                    match serde_json::to_vec(&alert) {
                        Ok(body) => outbox.push(Bytes::from(body), alert.covers),
                        Err(e) => debug!(error = %e, "alert not serialized"),
                    }
                }
            }
        }
        open.send_if_modified(|o| {
            let before = o.len();
            o.retain(|a| monitor.is_open(a.kind));
            o.len() != before
        });
        if let Some(e) = epoch {
            while let Some(q) = outbox.queued.pop_front() {
                if !north.publish(topic.clone(), q.body.clone(), Tag::Alert(q.id), e) {
                    // The session's queue is full: next turn.
                    outbox.queued.push_front(q);
                    break;
                }
                outbox.in_flight.insert(q.id, q);
            }
        }
        let alerted = outbox.dead_alerted();
        if alerted > marked {
            if store.dead_alerted(alerted).is_err() {
                return;
            }
            marked = alerted;
        }
    }
}

/// The largest holder of each kind while the store is at its budget (none
/// otherwise), for `ferry_disk_budget_holder`.
fn budget_holders(scan: &AlertScan) -> Vec<metrics::BudgetHolder> {
    let Some(h) = scan.holders.as_ref().filter(|_| scan.over_budget) else {
        return Vec::new();
    };
    let by_device = |kind, top: &[(String, i64)]| {
        top.first().map(|(d, n)| metrics::BudgetHolder {
            kind,
            holder: d.clone(),
            value: *n,
        })
    };
    let shares = h.dead_letters.first().map(|s| metrics::BudgetHolder {
        kind: "dead_letter_bytes",
        holder: s.share.clone(),
        value: s.bytes,
    });
    [
        by_device("uplinks", &h.uplinks),
        by_device("downlinks", &h.downlinks),
        shares,
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[cfg(test)]
mod tests;
