use bytes::Bytes;
use rusqlite::Connection;

use super::*;
use crate::dead_letter::DeadLetter;
use crate::store::migrate;

fn store() -> Connection {
    let mut conn = Connection::open_in_memory().unwrap();
    migrate(&mut conn).unwrap();
    conn
}

fn refused(device: Option<&str>, payload: usize) -> Kept {
    Kept::of(DeadLetter {
        direction: Direction::Up,
        device: device.map(str::to_string),
        msg_id: Some("m".into()),
        topic: format!("devices/{}/up/x", device.unwrap_or("?")),
        reason: "malformed: expected JSON object".into(),
        raw: Bytes::from(vec![b'x'; payload]),
        at_ms: 1,
    })
}

const SHARES: RefusalShares = RefusalShares {
    rows: 3,
    bytes: 1 << 20,
    total_bytes: 1 << 20,
};

fn file_one(conn: &mut Connection, dl: &Kept, shares: &RefusalShares, budget: &Budget) -> Refusal {
    let tx = conn.transaction().unwrap();
    let r = file(&tx, dl, shares, budget, 1).unwrap();
    tx.commit().unwrap();
    r
}

fn rows(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM dead_letter", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_dead_letter_keeps_the_head_size_and_hash_of_what_was_sent() {
    let big = "é".repeat(40_000); // 80,000 bytes, two per character
    let dl = Kept::of(DeadLetter {
        direction: Direction::Up,
        device: Some("d".repeat(500)),
        msg_id: None,
        topic: format!("devices/{big}"),
        reason: format!("bad_topic: {big}"),
        raw: Bytes::from(vec![7u8; 60_000]),
        at_ms: 1,
    });
    assert_eq!(dl.raw.len(), HEAD);
    assert_eq!(dl.raw_bytes, 60_000);
    assert_eq!(dl.topic_bytes, 80_008);
    assert!(dl.topic.len() <= TOPIC_HEAD && dl.topic.len() > TOPIC_HEAD - 2);
    assert!(dl.reason.len() <= REASON_HEAD);
    assert_eq!(dl.device.as_deref().map(str::len), Some(DEVICE_HEAD));
    // The SHA-256 of all 60,000 bytes, as `sha256sum` prints it.
    let digest = ring::digest::digest(&ring::digest::SHA256, &[7u8; 60_000]);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(dl.raw_sha256, hex);
    assert_eq!(dl.raw_sha256.len(), 64);
}

#[test]
fn past_its_share_a_peers_refusals_are_summed_in_one_row_and_others_keep_theirs() {
    let mut conn = store();
    let budget = Budget::new(1 << 40);
    let flood = refused(Some("flooder"), 100);
    for _ in 0..3 {
        let r = file_one(&mut conn, &flood, &SHARES, &budget);
        assert!(matches!(r, Refusal::Filed { summary: None, .. }), "{r:?}");
    }
    // The fourth and every one after: one summary row, opened once.
    let Refusal::Filed {
        id,
        summary: Some(first),
    } = file_one(&mut conn, &flood, &SHARES, &budget)
    else {
        panic!("not summed")
    };
    assert!(first.opened);
    assert_eq!(first.share, "device:flooder");
    for n in 2..=50 {
        let r = file_one(&mut conn, &flood, &SHARES, &budget);
        let Refusal::Filed {
            id: again,
            summary: Some(s),
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!((again, s.opened, s.refusals), (id, false, n));
    }
    assert_eq!(rows(&conn), 4, "three of its own and one summary");
    let (refusals, reason, last): (i64, String, String) = conn
        .query_row(
            "SELECT refusals, reason, last_error FROM dead_letter WHERE id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(refusals, 50);
    assert!(reason.starts_with("summarised: device:flooder"), "{reason}");
    assert_eq!(last, "malformed: expected JSON object");
    // Another device still gets rows of its own.
    let r = file_one(&mut conn, &refused(Some("other"), 100), &SHARES, &budget);
    assert!(matches!(r, Refusal::Filed { summary: None, .. }), "{r:?}");
}

#[test]
fn a_share_is_counted_in_bytes_too_and_a_purge_gives_the_room_back() {
    let mut conn = store();
    let budget = Budget::new(1 << 40);
    let shares = RefusalShares {
        rows: 1000,
        bytes: 10_000,
        total_bytes: 1 << 20,
    };
    let big = refused(Some("d"), 4000);
    for _ in 0..2 {
        assert!(matches!(
            file_one(&mut conn, &big, &shares, &budget),
            Refusal::Filed { summary: None, .. }
        ));
    }
    assert!(matches!(
        file_one(&mut conn, &big, &shares, &budget),
        Refusal::Filed {
            summary: Some(_),
            ..
        }
    ));
    // `ferry dlq purge` (or the retention) deletes its rows: room again.
    conn.execute("DELETE FROM dead_letter WHERE share = 'device:d'", [])
        .unwrap();
    let (n, bytes): (i64, i64) = conn
        .query_row(
            "SELECT rows, bytes FROM dead_letter_share WHERE share = 'device:d'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((n, bytes), (0, 0));
    assert!(matches!(
        file_one(&mut conn, &big, &shares, &budget),
        Refusal::Filed { summary: None, .. }
    ));
}

#[test]
fn past_the_total_every_peers_refusals_go_to_one_row_for_all_whatever_names_they_use() {
    let mut conn = store();
    let budget = Budget::new(1 << 40);
    let shares = RefusalShares {
        rows: 1000,
        bytes: 1 << 20,
        total_bytes: 20_000,
    };
    // A publisher spraying device names: each a share of its own, the
    // total bounds them all.
    let mut summaries = std::collections::BTreeSet::new();
    for i in 0..200 {
        match file_one(
            &mut conn,
            &refused(Some(&format!("d{i}")), 1000),
            &shares,
            &budget,
        ) {
            Refusal::Filed {
                id,
                summary: Some(s),
            } => {
                assert_eq!(s.share, "*");
                summaries.insert(id);
            }
            Refusal::Filed { summary: None, .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(summaries.len(), 1, "one row for all");
    let total: i64 = conn
        .query_row(
            "SELECT sum(octet_length(raw) + octet_length(topic) + octet_length(reason)) FROM dead_letter",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(total < 20_000 + 6_000, "{total}");
}

#[test]
fn publishers_naming_no_valid_device_share_one_share_and_the_backend_has_its_own() {
    assert_eq!(share_of(Direction::Up, Some("press-7")), "device:press-7");
    assert_eq!(share_of(Direction::Up, Some("not a/device")), "device:?");
    assert_eq!(share_of(Direction::Up, None), "device:?");
    assert_eq!(share_of(Direction::Down, Some("press-7")), "backend");
}

#[test]
fn at_the_disk_budget_no_new_row_is_written_but_a_summary_still_counts() {
    let mut conn = store();
    let roomy = Budget::new(1 << 40);
    let flood = refused(Some("f"), 10);
    for _ in 0..4 {
        file_one(&mut conn, &flood, &SHARES, &roomy);
    }
    let full = Budget::new(1 << 20);
    assert!(!full.admit(2 << 20), "puts it over");
    let r = file_one(&mut conn, &refused(Some("g"), 10), &SHARES, &full);
    assert!(matches!(r, Refusal::AtBudget { .. }), "{r:?}");
    let r = file_one(&mut conn, &flood, &SHARES, &full);
    assert!(
        matches!(r, Refusal::Filed { summary: Some(ref s), .. } if s.refusals == 2),
        "{r:?}"
    );
    assert_eq!(rows(&conn), 4);
}
