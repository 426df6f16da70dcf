//! Retention and the alerts' scan through the store: what a prune deletes,
//! and what it never does; what the alerts see.

use super::down::{dev, msg};
use super::*;
use crate::dead_letter::Direction;
use crate::state::DeliveryState;
use crate::store::prune::Cutoffs;

/// A cutoff at `wall_ms` on the wall clock and past anything on the store
/// clock.
fn wall(wall_ms: i64) -> Now {
    Now {
        wall_ms,
        store_ms: i64::MAX,
    }
}

fn count(dir: &std::path::Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(dir.join(DB_FILE)).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[tokio::test]
async fn a_prune_deletes_delivered_and_old_dead_rows_and_keeps_what_is_undelivered() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    for m in ["old", "new", "waiting", "dead"] {
        put(&store, "a", m).await;
    }
    let t = |m: &str, to, at_ms| Transition {
        device: DeviceId::new("a").unwrap(),
        msg_id: MsgId::new(m).unwrap(),
        to,
        attempts: 1,
        reason: None,
        at_ms,
    };
    store
        .transition(t("old", MessageState::Delivered, 100))
        .await
        .unwrap();
    store
        .transition(t("new", MessageState::Delivered, 900))
        .await
        .unwrap();
    store
        .transition(t("dead", MessageState::Dead, 100))
        .await
        .unwrap();
    // A downlink for two devices, one of which confirmed it; another that
    // both confirmed.
    store
        .down_intake(msg("d-half", &["p", "q"], 100, None))
        .await
        .unwrap();
    store
        .down_intake(msg("d-done", &["p", "q"], 100, None))
        .await
        .unwrap();
    for d in ["p", "q"] {
        store
            .read_batch(dev(d), Seq(0), 10, Now::at(5))
            .await
            .unwrap();
    }
    store.advance(dev("p"), Seq(2), false, 5).await.unwrap();
    store.advance(dev("q"), Seq(2), true, 5).await.unwrap();
    // "d-half" is p's 1 and q's 1; q's cursor is past both, p's too; make
    // d-half wait for q again by putting its delivery back.
    {
        let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
        conn.execute(
            "UPDATE down_delivery SET state = 'stored' WHERE device = 'q' AND seq = 1",
            [],
        )
        .unwrap();
        // A delivered message with a history line (a failed attempt): the
        // prune takes the line with the row.
        conn.execute(
            "INSERT INTO uplink_history VALUES (1, 50, 'stored', 'attempt 1 failed: ack timeout')",
            [],
        )
        .unwrap();
    }

    // Old by the store clock whatever it reads: the wall stamps decide.
    let cutoffs = Cutoffs {
        delivered: wall(500),
        dead: wall(50),
        keys: wall(500),
        keep_keys: false,
        limit: 1,
    };
    let first = store.prune(cutoffs).await.unwrap();
    assert_eq!(
        (first.uplinks, first.downlinks, first.dead_letters),
        (1, 1, 0)
    );
    assert!(first.more(1));
    let second = store.prune(cutoffs).await.unwrap();
    assert!(!second.any(), "{second:?}");

    let d = dir.path();
    assert_eq!(
        count(d, "SELECT count(*) FROM uplink WHERE msg_id = 'old'"),
        0
    );
    assert_eq!(
        count(d, "SELECT count(*) FROM uplink_history WHERE uplink_id = 1"),
        0
    );
    assert_eq!(
        count(
            d,
            "SELECT count(*) FROM uplink WHERE msg_id IN ('new', 'waiting', 'dead')"
        ),
        3
    );
    assert_eq!(
        count(
            d,
            "SELECT count(*) FROM down_message WHERE msg_id = 'd-done'"
        ),
        0
    );
    assert_eq!(
        count(
            d,
            "SELECT count(*) FROM down_message WHERE msg_id = 'd-half'"
        ),
        1
    );
    assert_eq!(count(d, "SELECT count(*) FROM down_delivery"), 2);
    // The pruned deliveries' history went with them; the kept ones' stays.
    assert_eq!(
        count(
            d,
            "SELECT count(*) FROM down_history h WHERE NOT EXISTS
                 (SELECT 1 FROM down_delivery x WHERE x.device = h.device AND x.seq = h.seq)"
        ),
        0
    );
    assert!(count(d, "SELECT count(*) FROM down_history") > 0);
    assert_eq!(count(d, "SELECT count(*) FROM devices"), 3);

    // Dead letters past their own retention go with their uplink row.
    let later = Cutoffs {
        delivered: wall(500),
        dead: wall(1000),
        keys: wall(500),
        keep_keys: false,
        limit: 500,
    };
    let third = store.prune(later).await.unwrap();
    assert_eq!(third.dead_letters, 1);
    assert_eq!(count(d, "SELECT count(*) FROM dead_letter"), 0);
    assert_eq!(
        count(d, "SELECT count(*) FROM uplink WHERE msg_id = 'dead'"),
        0
    );
    assert_eq!(
        count(d, "SELECT count(*) FROM uplink WHERE state = 'stored'"),
        1
    );
}

/// Under the disk budget: everything delivered, keys kept, the keys done
/// before `keys_before` (wall ms) deleted.
fn pressure(keys_before: i64) -> Cutoffs {
    Cutoffs {
        delivered: Now {
            wall_ms: i64::MAX,
            store_ms: i64::MAX,
        },
        dead: wall(0),
        keys: wall(keys_before),
        keep_keys: true,
        limit: 500,
    }
}

#[tokio::test]
async fn a_message_pruned_at_the_disk_budget_is_still_answered_as_a_duplicate_until_its_key_goes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    for m in ["m1", "m2"] {
        put(&store, "a", m).await;
        let done = Transition {
            device: DeviceId::new("a").unwrap(),
            msg_id: MsgId::new(m).unwrap(),
            to: MessageState::Delivered,
            attempts: 1,
            reason: None,
            at_ms: 100,
        };
        store.transition(done).await.unwrap();
    }
    // A downlink both its devices confirmed, p also read.
    let first = store
        .down_intake(msg("d1", &["p", "q"], 100, None))
        .await
        .unwrap();
    assert!(first.queued.iter().all(|(_, new)| *new));
    for d in ["p", "q"] {
        store
            .read_batch(dev(d), Seq(0), 10, Now::at(5))
            .await
            .unwrap();
    }
    store.advance(dev("p"), Seq(1), true, 100).await.unwrap();
    store.advance(dev("q"), Seq(1), false, 100).await.unwrap();

    let p = store.prune(pressure(50)).await.unwrap();
    assert_eq!((p.uplinks, p.downlinks, p.keys), (2, 1, 0), "{p:?}");
    let d = dir.path();
    assert_eq!(count(d, "SELECT count(*) FROM uplink"), 0);
    assert_eq!(count(d, "SELECT count(*) FROM down_message"), 0);
    assert_eq!(count(d, "SELECT count(*) FROM uplink_key"), 2);
    assert_eq!(count(d, "SELECT count(*) FROM down_key"), 2);

    // The resends are answered from the keys: the original seq, delivered;
    // nothing is stored or queued again. A new message takes the next seq.
    match put(&store, "a", "m2").await {
        IntakeOutcome::Duplicate(dup) => {
            assert_eq!((dup.seq, dup.state), (Seq(2), MessageState::Delivered));
        }
        other => panic!("stored again: {other:?}"),
    }
    assert_eq!(seq_of(&put(&store, "a", "m3").await), Seq(3));
    let again = store
        .down_intake(msg("d1", &["p", "q"], 100, None))
        .await
        .unwrap();
    let states: Vec<_> = again
        .queued
        .iter()
        .map(|(e, new)| (e.device.as_str().to_owned(), e.seq, e.state, *new))
        .collect();
    assert_eq!(
        states,
        [
            ("p".into(), Seq(1), DeliveryState::Read, false),
            ("q".into(), Seq(1), DeliveryState::Delivered, false)
        ]
    );
    assert_eq!(count(d, "SELECT count(*) FROM down_message"), 0);
    assert_eq!(count(d, "SELECT count(*) FROM down_delivery"), 0);
    // A recipient the first send did not name is queued it, once.
    let wider = store
        .down_intake(msg("d1", &["p", "r"], 100, None))
        .await
        .unwrap();
    assert_eq!(
        wider
            .queued
            .iter()
            .map(|(e, new)| (e.device.as_str(), *new))
            .collect::<Vec<_>>(),
        [("p", false), ("r", true)]
    );
    assert_eq!(count(d, "SELECT count(*) FROM down_message"), 1);

    // Past its cutoff a key goes (and a resend would be new).
    let p = store.prune(pressure(101)).await.unwrap();
    assert_eq!(p.keys, 4, "{p:?}");
    assert_eq!(count(d, "SELECT count(*) FROM uplink_key"), 0);
    assert_eq!(count(d, "SELECT count(*) FROM down_key"), 0);
}

#[tokio::test]
async fn the_alert_scan_finds_new_dead_letters_and_the_oldest_waiting_message() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    put(&store, "a", "m1").await;
    put(&store, "b", "m2").await;
    let dead = |m: &str| Transition {
        device: DeviceId::new("a").unwrap(),
        msg_id: MsgId::new(m).unwrap(),
        to: MessageState::Dead,
        attempts: 1,
        reason: Some("nack: bad".into()),
        at_ms: 9,
    };
    store.transition(dead("m1")).await.unwrap();
    store
        .down_intake(msg("d1", &["p"], 100, None))
        .await
        .unwrap();

    let scan = store.alert_scan(0, 10).await.unwrap();
    // Both uplinks were stamped 1 ms after the epoch on the wall clock
    // (the test intake's time), and just now on the store clock, which
    // the age is counted on; m2 waits.
    let age = scan.oldest_uplink_age.unwrap();
    assert!(age < std::time::Duration::from_secs(60), "{age:?}");
    assert_eq!(scan.backlog.uplinks, 1);
    assert_eq!(scan.backlog.downlinks, 1);
    assert!(scan.oldest_downlink_age.is_some());
    assert_eq!(scan.dead.len(), 1);
    assert_eq!(scan.dead[0].msg_id.as_deref(), Some("m1"));
    assert_eq!(scan.dead[0].direction, Direction::Up);
    assert_eq!(scan.more_dead, 0);
    assert_eq!(scan.max_dead_id, scan.dead[0].id);
    assert!(!scan.over_budget);

    let later = store.alert_scan(scan.max_dead_id, 10).await.unwrap();
    assert!(later.dead.is_empty());
}
