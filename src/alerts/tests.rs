use super::*;
use crate::dead_letter::Direction;
use crate::store::Backlog;

fn cfg() -> AlertsConfig {
    AlertsConfig {
        north_down: Duration::from_secs(60),
        backlog_age: Duration::from_secs(600),
        backend_silent: Duration::from_secs(120),
    }
}

fn scan() -> AlertScan {
    AlertScan::default()
}

fn kinds(alerts: &[Alert]) -> Vec<AlertKind> {
    alerts.iter().map(|a| a.kind).collect()
}

#[test]
fn dead_letters_count_as_alerted_up_to_the_first_alert_not_yet_settled() {
    let mut scan = scan();
    scan.after_dead = 4;
    scan.dead = (5..=7)
        .map(|id| crate::store::DeadSummary {
            id,
            direction: Direction::Up,
            device: Some("d".into()),
            msg_id: Some(format!("m{id}")),
            reason: "nacked: x".into(),
        })
        .collect();
    scan.more_dead = 3;
    scan.max_dead_id = 10;
    let mut m = Monitor::new(cfg(), Instant::now());
    let alerts = m.check(Instant::now(), 0, &scan);
    let covers: Vec<_> = alerts.iter().filter_map(|a| a.covers).collect();
    assert_eq!(covers, [(4, 5), (5, 6), (6, 7), (7, 10)]);

    let mut outbox = AlertQueue {
        raised_upto: 4,
        ..AlertQueue::default()
    };
    for a in &alerts {
        outbox.push(Bytes::from_static(b"{}"), a.covers);
    }
    assert_eq!(outbox.dead_alerted(), 4);
    // Sent, then acknowledged out of order.
    let ids: Vec<u64> = outbox.queued.iter().map(|q| q.id).collect();
    while let Some(q) = outbox.queued.pop_front() {
        outbox.in_flight.insert(q.id, q);
    }
    outbox.done(ids[1]);
    assert_eq!(outbox.dead_alerted(), 4, "5 is not acknowledged yet");
    outbox.done(ids[0]);
    assert_eq!(outbox.dead_alerted(), 6);
    // A drop at the link: what was in flight goes again, unsettled.
    outbox.link_down();
    assert_eq!(outbox.dead_alerted(), 6);
    while let Some(q) = outbox.queued.pop_front() {
        outbox.in_flight.insert(q.id, q);
    }
    outbox.done(ids[3]);
    outbox.done(ids[2]);
    assert_eq!(outbox.dead_alerted(), 10);
}

#[tokio::test(start_paused = true)]
async fn a_north_outage_is_raised_once_past_its_threshold_and_again_for_the_next_outage() {
    let start = Instant::now();
    let mut m = Monitor::new(cfg(), start);
    m.link_up();
    m.link_down(Instant::now());
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(m.check(Instant::now(), 0, &scan()).is_empty());
    tokio::time::advance(Duration::from_secs(1)).await;
    let alerts = m.check(Instant::now(), 0, &scan());
    assert_eq!(kinds(&alerts), [AlertKind::NorthDown]);
    assert!(alerts[0].detail.contains("60 s"), "{}", alerts[0].detail);
    tokio::time::advance(Duration::from_secs(600)).await;
    assert!(m.check(Instant::now(), 0, &scan()).is_empty());
    m.link_up();
    m.link_down(Instant::now());
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(
        kinds(&m.check(Instant::now(), 0, &scan())),
        [AlertKind::NorthDown]
    );
}

#[tokio::test(start_paused = true)]
async fn an_old_backlog_and_the_disk_budget_are_raised_once_until_they_clear() {
    let mut m = Monitor::new(cfg(), Instant::now());
    m.link_up();
    let now_ms = 10_000_000;
    let old = AlertScan {
        oldest_uplink_age: Some(Duration::from_secs(601)),
        backlog: Backlog {
            uplinks: 3,
            downlinks: 0,
        },
        over_budget: true,
        ..scan()
    };
    let alerts = m.check(Instant::now(), now_ms, &old);
    assert_eq!(
        kinds(&alerts),
        [AlertKind::BacklogAge, AlertKind::DiskBudget]
    );
    assert!(m.check(Instant::now(), now_ms, &old).is_empty());
    let young = AlertScan {
        oldest_downlink_age: Some(Duration::from_secs(1)),
        ..scan()
    };
    assert!(m.check(Instant::now(), now_ms, &young).is_empty());
    assert_eq!(
        kinds(&m.check(Instant::now(), now_ms, &old)),
        [AlertKind::BacklogAge, AlertKind::DiskBudget]
    );
}

#[test]
fn every_dead_letter_is_an_alert_and_a_flood_is_summed_up() {
    let mut m = Monitor::new(cfg(), Instant::now());
    m.link_up();
    let s = AlertScan {
        dead: vec![crate::store::DeadSummary {
            id: 7,
            direction: Direction::Up,
            device: Some("press-7".into()),
            msg_id: Some("m1".into()),
            reason: "nack: bad unit".into(),
        }],
        more_dead: 250,
        ..scan()
    };
    let alerts = m.check(Instant::now(), 5, &s);
    assert_eq!(
        kinds(&alerts),
        [AlertKind::DeadLetter, AlertKind::DeadLetter]
    );
    assert_eq!(
        alerts[0].detail,
        "dead letter 7 (up): device press-7, msg_id m1: nack: bad unit"
    );
    assert_eq!(
        serde_json::to_value(&alerts[0]).unwrap()["kind"],
        "dead_letter"
    );
    assert!(alerts[1].detail.starts_with("250 more"));
}

#[test]
fn alerts_not_acknowledged_when_the_link_drops_go_again_first() {
    let mut o = AlertQueue::default();
    for b in ["a", "b", "c"] {
        o.push(Bytes::from(b), None);
    }
    let q = o.queued.pop_front().unwrap();
    o.in_flight.insert(q.id, q);
    o.link_down();
    let order: Vec<u64> = o.queued.iter().map(|q| q.id).collect();
    assert_eq!(order, [1, 2, 3]);
    assert!(o.in_flight.is_empty());
}

#[test]
fn a_silent_backend_is_alerted_once_past_its_time_and_again_after_it_was_heard() {
    let t0 = Instant::now();
    let mut m = Monitor::new(cfg(), t0);
    m.link_up();
    m.backend_silent(Some(t0));
    let at = |s| t0 + Duration::from_secs(s);
    assert!(m.check(at(119), 0, &scan()).is_empty(), "not yet");
    assert_eq!(
        kinds(&m.check(at(120), 0, &scan())),
        [AlertKind::BackendSilent]
    );
    assert!(m.check(at(500), 0, &scan()).is_empty(), "once per silence");
    // Still the same silence: the engine reports its start again.
    m.backend_silent(Some(t0));
    assert!(m.check(at(501), 0, &scan()).is_empty());
    m.backend_silent(None);
    assert!(m.check(at(600), 0, &scan()).is_empty(), "heard from");
    m.backend_silent(Some(at(600)));
    assert!(m.check(at(700), 0, &scan()).is_empty());
    assert_eq!(
        kinds(&m.check(at(720), 0, &scan())),
        [AlertKind::BackendSilent]
    );
}
