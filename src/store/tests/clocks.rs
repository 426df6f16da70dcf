//! Retention and the backlog age on both clocks: rows carry a store-clock
//! stamp beside their wall-clock one (schema 13), and a wall-clock step
//! neither prunes them early nor ages them.

use std::time::Duration;

use super::down::{dev, msg};
use super::*;
use crate::store::prune::{Cutoffs, Pruned};
use crate::store::record::downlink::DownIntake;

const DAY: i64 = 86_400_000;
const YEAR: i64 = 365 * DAY;
/// When the rows are written: the wall clock (Nov 2023) and a store that
/// has run ten days.
const THEN: Now = Now {
    wall_ms: 1_700_000_000_000,
    store_ms: 10 * DAY,
};

fn later(wall_ms: i64, store_ms: i64) -> Now {
    Now {
        wall_ms: THEN.wall_ms + wall_ms,
        store_ms: THEN.store_ms + store_ms,
    }
}

fn store() -> rusqlite::Connection {
    let mut conn = rusqlite::Connection::open_in_memory().unwrap();
    schema::migrate(&mut conn).unwrap();
    conn
}

fn up(device: &str, msg_id: &str, at: Now) -> Intake {
    let raw = format!(r#"{{"msg_id":"{msg_id}","payload":1}}"#);
    let envelope = parse_uplink(raw.as_bytes(), 1024).unwrap();
    Intake::new("g", dev(device), "s".into(), envelope, at)
}

fn finish(tx: &rusqlite::Transaction<'_>, msg_id: &str, to: MessageState, at: Now) {
    let t = Transition {
        device: dev("a"),
        msg_id: MsgId::new(msg_id).unwrap(),
        to,
        attempts: 1,
        reason: Some("nack: bad".into()),
        at_ms: at.wall_ms,
    };
    assert!(uplink::transition(tx, &t, at.store_ms).unwrap().is_some());
}

fn down(msg_id: &str, at: Now) -> DownIntake {
    DownIntake {
        stored_ms: at.wall_ms,
        ..msg(msg_id, &["p"], 100, None)
    }
}

/// At `at`: a delivered uplink, a dead-lettered one, a downlink the device
/// confirmed and one it nacked (a dead letter each way); and, waiting, an
/// uplink and a downlink.
fn fill(conn: &mut rusqlite::Connection, at: Now) {
    let tx = conn.transaction().unwrap();
    let mut seqs = uplink::SeqCache::default();
    for m in ["delivered", "dead", "waiting"] {
        uplink::intake(&tx, &mut seqs, &up("a", m, at), &roomy(), at.store_ms).unwrap();
    }
    seqs.flush(&tx).unwrap();
    finish(&tx, "delivered", MessageState::Delivered, at);
    finish(&tx, "dead", MessageState::Dead, at);
    for m in ["confirmed", "nacked", "queued"] {
        downlink::intake(&tx, &down(m, at), &roomy(), at.store_ms).unwrap();
    }
    let p = dev("p");
    downlink::read_batch(&tx, &p, Seq(0), 2, at).unwrap();
    downlink::advance(&tx, &p, Seq(1), false, at).unwrap();
    downlink::nack(&tx, &p, Seq(2), "nacked: no", at).unwrap();
    tx.commit().unwrap();
}

/// A prune at `now` with a day's retention for everything: what is a day
/// old on both clocks goes.
fn prune_at(conn: &mut rusqlite::Connection, now: Now) -> Pruned {
    let day_ago = Now {
        wall_ms: now.wall_ms - DAY,
        store_ms: now.store_ms - DAY,
    };
    let cutoffs = Cutoffs {
        delivered: day_ago,
        dead: day_ago,
        keys: day_ago,
        keep_keys: false,
        limit: 500,
    };
    let tx = conn.transaction().unwrap();
    let pruned = crate::store::prune::prune(&tx, &cutoffs).unwrap();
    tx.commit().unwrap();
    pruned
}

fn rows(conn: &rusqlite::Connection, table: &str) -> i64 {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

/// What is left: uplinks, downlink messages, dead letters.
fn left(conn: &rusqlite::Connection) -> (i64, i64, i64) {
    (
        rows(conn, "uplink"),
        rows(conn, "down_message"),
        rows(conn, "dead_letter"),
    )
}

#[test]
fn rows_stamped_just_now_outlive_a_wall_clock_step_a_year_forward() {
    let mut conn = store();
    fill(&mut conn, THEN);
    // NTP steps the wall clock a year ahead a minute later; retention is
    // a day for everything.
    let p = prune_at(&mut conn, later(YEAR, 60_000));
    assert!(!p.any(), "{p:?}");
    assert_eq!(left(&conn), (3, 3, 2));
}

#[test]
fn rows_old_on_both_clocks_are_pruned_and_what_waits_is_kept() {
    let mut conn = store();
    fill(&mut conn, THEN);
    let p = prune_at(&mut conn, later(YEAR, 2 * DAY));
    // The delivered uplink; both downlinks whose deliveries are finished
    // (confirmed, nacked); both dead letters, the uplink's row with its.
    assert_eq!((p.uplinks, p.downlinks, p.dead_letters), (1, 2, 2));
    // Left: the waiting uplink and the queued downlink.
    assert_eq!(left(&conn), (1, 1, 0));
}

#[test]
fn a_row_old_on_the_store_clock_alone_is_kept() {
    // The wall clock stepped back a week; two days passed in the store.
    let mut conn = store();
    fill(&mut conn, THEN);
    let p = prune_at(&mut conn, later(-7 * DAY, 2 * DAY));
    assert!(!p.any(), "{p:?}");
}

#[test]
fn rows_without_a_store_stamp_are_judged_on_the_wall_clock() {
    let mut conn = store();
    fill(&mut conn, THEN);
    conn.execute_batch(
        "UPDATE uplink SET stored_store_ms = NULL, done_store_ms = NULL;
         UPDATE down_message SET stored_store_ms = NULL;
         UPDATE down_delivery SET at_store_ms = NULL;
         UPDATE dead_letter SET at_store_ms = NULL;",
    )
    .unwrap();
    assert!(!prune_at(&mut conn, later(DAY / 2, 3 * DAY)).any());
    let p = prune_at(&mut conn, later(2 * DAY, 0));
    assert_eq!((p.uplinks, p.downlinks, p.dead_letters), (1, 2, 2));
    assert_eq!(left(&conn), (1, 1, 0));
}

#[test]
fn the_backlog_age_is_counted_on_the_store_clock() {
    let mut conn = store();
    fill(&mut conn, THEN);
    let age = |now| figures::oldest(&conn, now).unwrap();
    // A year forward on the wall clock, 5 s in the store: 5 s old.
    let o = age(later(YEAR, 5_000));
    assert_eq!(o.uplink, Some(Duration::from_secs(5)));
    assert_eq!(o.downlink, Some(Duration::from_secs(5)));
    // An hour back on the wall clock, two hours in the store: two hours.
    let o = age(later(-3_600_000, 7_200_000));
    assert_eq!(o.uplink, Some(Duration::from_secs(7_200)));
    assert_eq!(o.downlink, Some(Duration::from_secs(7_200)));
}

#[test]
fn the_backlog_age_of_a_row_without_a_store_stamp_is_on_the_wall_clock() {
    let mut conn = store();
    fill(&mut conn, THEN);
    conn.execute_batch(
        "UPDATE uplink SET stored_store_ms = NULL; UPDATE down_delivery SET at_store_ms = NULL;",
    )
    .unwrap();
    let o = figures::oldest(&conn, later(60_000, 5_000)).unwrap();
    assert_eq!(o.uplink, Some(Duration::from_secs(60)));
    assert_eq!(o.downlink, Some(Duration::from_secs(60)));
    // Stamped after now (the wall clock went back): no age, not negative.
    let o = figures::oldest(&conn, later(-60_000, 5_000)).unwrap();
    assert_eq!(o.uplink, Some(Duration::ZERO));
}

#[tokio::test]
async fn the_writer_stamps_rows_with_the_store_clock() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    put(&store, "a", "m1").await;
    let at = store.now().store_ms;
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let stamp: Option<i64> = conn
        .query_row(
            "SELECT stored_store_ms FROM uplink WHERE msg_id = 'm1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let stamp = stamp.expect("a store stamp");
    assert!((0..=at).contains(&stamp), "{stamp} vs {at}");
}

#[test]
fn retention_seeks_its_indexes_on_both_clocks_rather_than_scanning() {
    let conn = store();
    for (sql, index) in [
        (
            "SELECT id FROM uplink WHERE state = 'delivered' AND done_store_ms < 1 AND done_ms < 1 ORDER BY done_store_ms",
            "uplink_delivered",
        ),
        (
            "SELECT id FROM uplink WHERE state = 'delivered' AND done_store_ms IS NULL AND done_ms < 1 ORDER BY done_ms",
            "uplink_delivered",
        ),
        (
            "SELECT id FROM down_message WHERE stored_store_ms < 1 AND stored_ms < 1 ORDER BY stored_store_ms",
            "down_message_by_time",
        ),
        (
            "SELECT id FROM dead_letter WHERE at_store_ms IS NULL AND at_ms < 1 ORDER BY at_ms",
            "dead_letter_by_store_time",
        ),
        (
            "SELECT device, msg_id FROM uplink_key WHERE done_store_ms < 1 AND done_ms < 1 ORDER BY done_store_ms",
            "uplink_key_by_time",
        ),
        (
            "SELECT msg_id, device FROM down_key WHERE done_store_ms IS NULL AND done_ms < 1 ORDER BY done_ms",
            "down_key_by_time",
        ),
    ] {
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .unwrap()
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            plan.iter().any(|p| p.contains(index)) && !plan.iter().any(|p| p.contains("TEMP B-TREE")),
            "{sql}: {plan:?}"
        );
    }
}
