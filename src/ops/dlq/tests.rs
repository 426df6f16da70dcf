use rusqlite::Connection;

use super::*;
use crate::ops::trace::trace;

/// A store with one uplink nacked dead after two failed attempts, one
/// rejected at the door, and one downlink dead letter.
fn store() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = Connection::open(dir.path().join("ferry.db")).unwrap();
    crate::store::migrate(&mut conn).unwrap();
    conn.execute_batch(
        "INSERT INTO uplink (id, device, msg_id, seq, stream, state, body, stored_ms, expires_ms, attempts, last_error)
           VALUES (7, 'press-7', 'm-1', 3, 't', 'dead', '{\"v\":1}', 1000, 1500, 2, 'nacked: unknown sensor');
         INSERT INTO uplink_history VALUES (7, 1000, 'stored', NULL);
         INSERT INTO uplink_history VALUES (7, 2000, 'stored', 'attempt 1 failed: ack timeout');
         INSERT INTO uplink_history VALUES (7, 3000, 'stored', 'attempt 2 failed: nacked: busy');
         INSERT INTO uplink_history VALUES (7, 4000, 'dead', 'nacked: unknown sensor');
         INSERT INTO dead_letter (id, at_ms, direction, device, msg_id, uplink_id, reason, attempts, last_error, topic, raw)
           VALUES (1, 4000, 'up', 'press-7', 'm-1', 7, 'nacked: unknown sensor', 2, 'nacked: unknown sensor', 't', '{\"v\":1}');
         INSERT INTO dead_letter (id, at_ms, direction, device, msg_id, reason, topic, raw)
           VALUES (2, 5000, 'up', 'press-8', NULL, 'malformed: not JSON', 'x/up', X'FF00');
         INSERT INTO dead_letter (id, at_ms, direction, device, msg_id, reason, topic, raw)
           VALUES (3, 6000, 'down', NULL, 'd-1', 'malformed: no to', 'down', '{}');",
    )
    .unwrap();
    (dir, conn)
}

#[test]
fn list_shows_first_and_last_failure_and_filters() {
    let (_dir, conn) = store();
    let all = list(&conn, &Filter::default()).unwrap();
    assert_eq!(all.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(
        (all[0].first_failure_ms, all[0].last_failure_ms),
        (2000, 4000)
    );
    assert_eq!(
        (all[1].first_failure_ms, all[1].last_failure_ms),
        (5000, 5000)
    );
    assert_eq!(
        all.iter().map(|r| r.replayable).collect::<Vec<_>>(),
        [true, false, false]
    );
    let nacked = Filter {
        reason: Some("nacked".into()),
        ..Filter::default()
    };
    assert_eq!(list(&conn, &nacked).unwrap().len(), 1);
    let down = Filter {
        direction: Some(Direction::Down),
        ..Filter::default()
    };
    assert_eq!(list(&conn, &down).unwrap()[0].id, 3);
    let device = Filter {
        device: Some("press-8".into()),
        ..Filter::default()
    };
    assert_eq!(list(&conn, &device).unwrap()[0].id, 2);
}

#[test]
fn show_gives_text_payloads_as_text_and_bytes_as_base64() {
    let (_dir, conn) = store();
    let d = show(&conn, 1).unwrap().unwrap();
    assert_eq!(
        (d.payload.encoding, d.payload.data.as_str()),
        ("utf8", "{\"v\":1}")
    );
    assert_eq!((d.seq, d.message_state.as_deref()), (Some(3), Some("dead")));
    let d = show(&conn, 2).unwrap().unwrap();
    assert_eq!(
        (d.payload.encoding, d.payload.data.as_str()),
        ("base64", "/wA=")
    );
    assert!(show(&conn, 99).unwrap().is_none());
}

#[test]
fn replay_stores_the_message_again_with_fresh_attempts_once() {
    let (_dir, mut conn) = store();
    let r = replay(&mut conn, 1, 9000).unwrap();
    assert!(r.replayed, "{r:?}");
    assert_eq!(r.seq, Some(3));
    let (state, attempts, expires, seq): (String, u32, Option<i64>, i64) = conn
        .query_row(
            "SELECT state, attempts, expires_ms, seq FROM uplink WHERE id = 7",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap();
    assert_eq!(
        (state.as_str(), attempts, expires, seq),
        ("stored", 0, None, 3)
    );
    let requested: i64 = conn
        .query_row(
            "SELECT count(*) FROM replay_request WHERE uplink_id = 7",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(requested, 1);
    assert!(show(&conn, 1).unwrap().is_none(), "the dead letter is gone");
    let again = replay(&mut conn, 1, 9001).unwrap();
    assert!(!again.replayed);
    let events = trace(&conn, "press-7", "m-1").unwrap();
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        names,
        [
            "stored",
            "attempt failed",
            "attempt failed",
            "dead (backend nack)",
            "replayed"
        ]
    );
    assert_eq!(
        events[2].detail.as_deref(),
        Some("attempt 2 failed: nacked: busy")
    );
}

#[test]
fn a_dead_letter_rejected_at_the_door_is_not_replayed_and_says_why() {
    let (_dir, mut conn) = store();
    let r = replay(&mut conn, 2, 9000).unwrap();
    assert!(!r.replayed);
    assert!(
        r.refused.as_deref().unwrap().contains("never stored"),
        "{r:?}"
    );
    // A backend envelope refused at the door: the backend sends it again.
    let r = replay(&mut conn, 3, 9000).unwrap();
    assert!(!r.replayed);
    assert!(
        r.refused
            .as_deref()
            .unwrap()
            .contains("backend must send it again"),
        "{r:?}"
    );
    assert_eq!(list(&conn, &Filter::default()).unwrap().len(), 3);
}

#[test]
fn purge_removes_only_dead_letters_older_than_the_cut() {
    let (_dir, conn) = store();
    assert_eq!(purge(&conn, 5000).unwrap(), 1);
    let left: Vec<i64> = list(&conn, &Filter::default())
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(left, [2, 3]);
}
