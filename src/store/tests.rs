use super::clock::Now;
use super::record::uplink::{Duplicate, Intake, IntakeOutcome, Transition, EXPIRED_REASON};
use super::*;
use crate::config::{StoreConfig, SyncMode};
use crate::dead_letter::Direction;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::envelope::parse_uplink;
use crate::state::MessageState;

fn cfg() -> StoreConfig {
    StoreConfig {
        sync: SyncMode::Full,
        max_batch: 64,
        max_db_bytes: 1 << 30,
        retention: std::time::Duration::from_secs(30 * 86_400),
        dead_letter_retention: std::time::Duration::from_secs(90 * 86_400),
        min_dedup: std::time::Duration::from_secs(3600),
        refusals: crate::config::RefusalShares {
            rows: 1000,
            bytes: 1 << 20,
            total_bytes: 16 << 20,
        },
    }
}

/// A budget nothing reaches.
pub(super) fn roomy() -> super::budget::Budget {
    super::budget::Budget::new(u64::MAX / 2)
}

fn intake(device: &str, msg_id: &str) -> Intake {
    let raw = format!(r#"{{"msg_id":"{msg_id}","payload":1}}"#);
    let envelope = parse_uplink(raw.as_bytes(), 1024).unwrap();
    Intake::new(
        "g",
        DeviceId::new(device).unwrap(),
        "s".into(),
        envelope,
        Now::at(1),
    )
}

impl Store {
    /// Drops this handle (the last one) and waits until the writer has
    /// closed the database and let go of its lock.
    pub(crate) async fn exited_when_dropped(self) -> Option<String> {
        let exited = self.exited();
        drop(self);
        exited.await
    }
}

async fn put(store: &Store, device: &str, msg_id: &str) -> IntakeOutcome {
    store.intake(intake(device, msg_id)).await.unwrap()
}

fn seq_of(o: &IntakeOutcome) -> Seq {
    match o {
        IntakeOutcome::Stored(m) => m.seq,
        IntakeOutcome::Duplicate(d) => d.seq,
        IntakeOutcome::AtBudget { .. } => panic!("at the budget"),
    }
}

#[tokio::test]
async fn seqs_count_per_device_from_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let a: Vec<_> = futures_util::future::join_all((0..5).map(|i| {
        let store = store.clone();
        async move { seq_of(&put(&store, "a", &format!("m{i}")).await) }
    }))
    .await;
    let mut a = a;
    a.sort();
    assert_eq!(a, (1..=5).map(Seq).collect::<Vec<_>>());
    assert_eq!(seq_of(&put(&store, "b", "m0").await), Seq(1));
    assert_eq!(seq_of(&put(&store, "a", "m9").await), Seq(6));
}

#[tokio::test]
async fn duplicates_keep_their_seq_and_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let first = put(&store, "a", "m1").await;
    assert!(matches!(first, IntakeOutcome::Stored(_)));
    // The same id twice in one batch, and again later.
    let (x, y) = tokio::join!(put(&store, "a", "m2"), put(&store, "a", "m2"));
    assert_eq!(seq_of(&x), seq_of(&y));
    let again = put(&store, "a", "m1").await;
    assert_eq!(
        again,
        IntakeOutcome::Duplicate(Duplicate {
            msg_id: MsgId::new("m1").unwrap(),
            seq: Seq(1),
            state: MessageState::Stored,
            reason: None
        })
    );
    assert_eq!(
        seq_of(&put(&store, "a", "m3").await),
        Seq(3),
        "a duplicate takes no seq"
    );
}

#[tokio::test]
async fn transitions_only_leave_stored_and_dead_letters_keep_the_body() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    put(&store, "a", "m1").await;
    put(&store, "a", "m2").await;
    let t = |msg: &str, to, reason: Option<&str>| Transition {
        device: DeviceId::new("a").unwrap(),
        msg_id: MsgId::new(msg).unwrap(),
        to,
        attempts: 1,
        reason: reason.map(str::to_string),
        at_ms: 5,
    };
    let moved = store
        .transition(t("m1", MessageState::Delivered, None))
        .await
        .unwrap();
    assert_eq!(moved.map(|m| m.seq), Some(Seq(1)));
    let again = store
        .transition(t("m1", MessageState::Dead, Some("nacked: x")))
        .await
        .unwrap();
    assert_eq!(again, None, "a delivered message cannot die");
    let dead = store
        .transition(t("m2", MessageState::Dead, Some("nacked: x")))
        .await
        .unwrap();
    assert_eq!(dead.map(|m| m.seq), Some(Seq(2)));
    assert_eq!(
        put(&store, "a", "m2").await,
        IntakeOutcome::Duplicate(Duplicate {
            msg_id: MsgId::new("m2").unwrap(),
            seq: Seq(2),
            state: MessageState::Dead,
            reason: Some("nacked: x".into())
        })
    );
    let pending = store
        .pending(DeviceId::new("a").unwrap(), Seq(0), 10)
        .await
        .unwrap();
    assert!(pending.is_empty());
    drop(store);

    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let (reason, raw): (String, Vec<u8>) = conn
        .query_row(
            "SELECT reason, raw FROM dead_letter WHERE msg_id = 'm2'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(reason, "nacked: x");
    assert!(String::from_utf8(raw).unwrap().contains("\"seq\":2"));
    let states: i64 = conn
        .query_row(
            "SELECT count(*) FROM uplink_history WHERE uplink_id = 2",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        states, 1,
        "the dead end is in the history; `stored` is the row's own stored_ms"
    );
}

#[tokio::test]
async fn moves_asked_together_each_get_their_own_answer_and_write_no_history() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    for m in ["m1", "m2", "m3"] {
        put(&store, "a", m).await;
    }
    let t = |msg: &str, to| Transition {
        device: DeviceId::new("a").unwrap(),
        msg_id: MsgId::new(msg).unwrap(),
        to,
        attempts: 1,
        reason: None,
        at_ms: 5,
    };
    let answers = store
        .transitions(vec![
            t("m1", MessageState::Delivered),
            t("gone", MessageState::Delivered),
            t("m3", MessageState::Stored),
            t("m3", MessageState::Delivered),
            t("m1", MessageState::Delivered),
        ])
        .await
        .unwrap();
    let seqs: Vec<_> = answers
        .iter()
        .map(|a| a.as_ref().map(|m| m.as_ref().map(|m| m.seq)))
        .collect();
    assert_eq!(seqs.len(), 5);
    assert_eq!(seqs[0].as_ref().unwrap(), &Some(Seq(1)));
    assert_eq!(
        seqs[1].as_ref().unwrap(),
        &None,
        "an unknown message moves nothing"
    );
    assert!(
        matches!(answers[2], Err(StoreError::IllegalMove(_))),
        "an illegal move is refused alone: {:?}",
        answers[2]
    );
    assert_eq!(
        seqs[3].as_ref().unwrap(),
        &Some(Seq(3)),
        "and the rest go on"
    );
    assert_eq!(seqs[4].as_ref().unwrap(), &None, "delivered once");
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(
        count("SELECT count(*) FROM uplink WHERE state = 'delivered' AND done_ms = 5"),
        2
    );
    assert_eq!(
        count("SELECT count(*) FROM uplink_history"),
        0,
        "a normal life is the row alone"
    );
}

#[tokio::test]
async fn a_reopened_store_resumes_seqs_and_pending_work() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &cfg()).unwrap();
        for i in 0..3 {
            put(&store, "a", &format!("m{i}")).await;
        }
        // One store per database: the next opens once this one closed.
        store.exited_when_dropped().await;
    }
    let store = Store::open(dir.path(), &cfg()).unwrap();
    assert_eq!(
        store.pending_devices().await.unwrap(),
        vec![DeviceId::new("a").unwrap()]
    );
    let pending = store
        .pending(DeviceId::new("a").unwrap(), Seq(1), 10)
        .await
        .unwrap();
    assert_eq!(
        pending.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![Seq(2), Seq(3)]
    );
    assert_eq!(seq_of(&put(&store, "a", "m9").await), Seq(4));
    assert!(matches!(
        put(&store, "a", "m0").await,
        IntakeOutcome::Duplicate(_)
    ));
}

mod checkpoint;
mod clocks;
mod down;
mod errors;
mod files;
mod outbox;
mod prune;
mod user_props;

#[tokio::test]
async fn expired_uplinks_are_swept_by_index_wherever_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let raw = br#"{"msg_id":"t-1","payload":1,"ttl_s":1}"#;
    let ttl = Intake::new(
        "g",
        DeviceId::new("a").unwrap(),
        "s".into(),
        parse_uplink(raw, 1024).unwrap(),
        Now::at(1),
    );
    store.intake(ttl).await.unwrap();
    put(&store, "a", "no-ttl").await;
    assert!(store.expire_due(Now::at(1000)).await.unwrap().is_empty());
    let expired = store.expire_due(Now::at(1001)).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].1.as_str(), "t-1");
    assert!(
        store.expire_due(Now::at(5000)).await.unwrap().is_empty(),
        "once"
    );
    let left = store
        .pending(DeviceId::new("a").unwrap(), Seq(0), 10)
        .await
        .unwrap();
    assert_eq!(
        left.iter().map(|m| m.msg_id.as_str()).collect::<Vec<_>>(),
        vec!["no-ttl"]
    );
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let reason: String = conn
        .query_row(
            "SELECT reason FROM dead_letter WHERE msg_id = 't-1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(reason, EXPIRED_REASON);
    let plan: String = conn
        .query_row(
            "EXPLAIN QUERY PLAN SELECT device FROM uplink WHERE state = 'stored' AND expires_ms IS NOT NULL AND expires_ms <= 5",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(plan.contains("uplink_expiring"), "{plan}");
}

#[tokio::test]
async fn a_damaged_database_is_refused_at_open_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &cfg()).unwrap();
        for i in 0..200 {
            put(&store, "a", &format!("m{i}")).await;
        }
        store.exited_when_dropped().await;
    }
    // Checkpoint the WAL into the main file, then scribble over its pages
    // (not the header, which would only make it "not a database").
    let path = dir.path().join(DB_FILE);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
        .unwrap();
    drop(conn);
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 3 * 4096, "{} bytes", bytes.len());
    for b in &mut bytes[4096 + 100..3 * 4096] {
        *b = 0x5a;
    }
    std::fs::write(&path, bytes).unwrap();
    let err = Store::open(dir.path(), &cfg()).err().expect("refused");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("is corrupt"), "{err}");
}

#[tokio::test]
async fn closed_resolves_once_the_last_handle_is_gone_and_what_was_queued_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let closed = store.exited();
    // Queued, never awaited: the writer still commits it before exiting.
    let queued = futures_util::future::join_all(
        (0..100).map(|i| store.intake(intake("a", &format!("m{i}")))),
    )
    .await;
    let other = store.clone();
    drop(store);
    let wait = std::time::Duration::from_millis(100);
    assert!(
        tokio::time::timeout(wait, other.exited()).await.is_err(),
        "a handle is left: the writer runs on"
    );
    drop((other, queued));
    tokio::time::timeout(std::time::Duration::from_secs(10), closed)
        .await
        .expect("the writer exits once every handle is dropped");
    assert!(
        !dir.path().join("ferry.db-wal").exists(),
        "the database was closed (its WAL checkpointed and removed)"
    );
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM uplink", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 100);
}

#[tokio::test]
async fn dead_letter_ids_are_never_reused_after_the_newest_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let dl = || crate::dead_letter::DeadLetter {
        direction: Direction::Up,
        device: Some("a".into()),
        msg_id: None,
        topic: "devices/a/up/t".into(),
        reason: "malformed: x".into(),
        raw: bytes::Bytes::from_static(b"{"),
        at_ms: 1,
    };
    let filed = |r| match r {
        crate::store::refusal::Refusal::Filed { id, .. } => id,
        other => panic!("{other:?}"),
    };
    let first = filed(store.reject(dl()).await.unwrap());
    // A replay or a purge deletes the newest dead letter.
    let conn = rusqlite::Connection::open(dir.path().join(crate::store::DB_FILE)).unwrap();
    conn.execute("DELETE FROM dead_letter WHERE id = ?1", [first])
        .unwrap();
    let second = filed(store.reject(dl()).await.unwrap());
    assert!(second > first, "id {first} handed out again as {second}");
}

/// The engine's refill reads no message whose `stored` receipt intake has
/// not handed on yet, so the engine can never send one north, and answer
/// `delivered` for it, before its `stored` (receipts in state order; the
/// compare bench saw `delivered` first for 36-78 messages of 200,000 in
/// some saturated runs). After a restart, whatever is stored is read.
#[tokio::test]
async fn a_refill_reads_only_messages_whose_stored_receipt_is_out() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let a = DeviceId::new("a").unwrap();
    let stored = |o: IntakeOutcome| match o {
        IntakeOutcome::Stored(m) => m,
        other => panic!("{other:?}"),
    };
    let m1 = stored(put(&store, "a", "m1").await);
    let m2 = stored(put(&store, "a", "m2").await);
    let refill = |store: &Store| {
        let read = store.refill(a.clone(), Seq(0), 10);
        async move {
            read.await
                .unwrap()
                .into_iter()
                .map(|m| m.msg_id.to_string())
                .collect::<Vec<_>>()
        }
    };
    assert!(refill(&store).await.is_empty(), "no receipt out yet");
    store.receipted(m1.id);
    assert_eq!(refill(&store).await, ["m1"]);
    store.receipted(m2.id);
    assert_eq!(refill(&store).await, ["m1", "m2"]);
    stored(put(&store, "a", "m3").await);
    assert_eq!(refill(&store).await, ["m1", "m2"]);
    assert_eq!(
        store.pending(a.clone(), Seq(0), 10).await.unwrap().len(),
        3,
        "what is stored is all there for everyone else"
    );
    store.exited_when_dropped().await;
    let store = Store::open(dir.path(), &cfg()).unwrap();
    assert_eq!(refill(&store).await, ["m1", "m2", "m3"]);
}
