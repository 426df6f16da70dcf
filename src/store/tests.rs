use std::sync::Arc;

use super::*;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::protocol::envelope::parse_uplink;
use crate::state::MessageState;

fn cfg() -> StoreConfig {
    StoreConfig { sync: SyncMode::Full, max_batch: 64 }
}

fn intake(device: &str, msg_id: &str) -> Intake {
    let raw = format!(r#"{{"msg_id":"{msg_id}","payload":1}}"#);
    Intake {
        gateway: Arc::from("g"),
        device: DeviceId::new(device).unwrap(),
        stream: "s".into(),
        envelope: parse_uplink(raw.as_bytes(), 1024).unwrap(),
        stored_ms: 1,
    }
}

async fn put(store: &Store, device: &str, msg_id: &str) -> IntakeOutcome {
    store.intake(intake(device, msg_id)).await.unwrap().await.unwrap().unwrap()
}

fn seq_of(o: &IntakeOutcome) -> Seq {
    match o {
        IntakeOutcome::Stored(m) => m.seq,
        IntakeOutcome::Duplicate(d) => d.seq,
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
    assert_eq!(again, IntakeOutcome::Duplicate(Duplicate { msg_id: MsgId::new("m1").unwrap(), seq: Seq(1), state: MessageState::Stored, reason: None }));
    assert_eq!(seq_of(&put(&store, "a", "m3").await), Seq(3), "a duplicate takes no seq");
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
    let moved = store.transition(t("m1", MessageState::Delivered, None)).await.unwrap().await.unwrap().unwrap();
    assert_eq!(moved.map(|m| m.seq), Some(Seq(1)));
    let again = store.transition(t("m1", MessageState::Dead, Some("nacked: x"))).await.unwrap().await.unwrap().unwrap();
    assert_eq!(again, None, "a delivered message cannot die");
    let dead = store.transition(t("m2", MessageState::Dead, Some("nacked: x"))).await.unwrap().await.unwrap().unwrap();
    assert_eq!(dead.map(|m| m.seq), Some(Seq(2)));
    assert_eq!(
        put(&store, "a", "m2").await,
        IntakeOutcome::Duplicate(Duplicate { msg_id: MsgId::new("m2").unwrap(), seq: Seq(2), state: MessageState::Dead, reason: Some("nacked: x".into()) })
    );
    let pending = store.pending(DeviceId::new("a").unwrap(), Seq(0), 10).await.unwrap();
    assert!(pending.is_empty());
    drop(store);

    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let (reason, raw): (String, Vec<u8>) = conn
        .query_row("SELECT reason, raw FROM dead_letter WHERE msg_id = 'm2'", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!(reason, "nacked: x");
    assert!(String::from_utf8(raw).unwrap().contains("\"seq\":2"));
    let states: i64 =
        conn.query_row("SELECT count(*) FROM uplink_history WHERE uplink_id = 2", [], |r| r.get(0)).unwrap();
    assert_eq!(states, 2, "stored and dead are both in the history");
}

#[tokio::test]
async fn a_reopened_store_resumes_seqs_and_pending_work() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &cfg()).unwrap();
        for i in 0..3 {
            put(&store, "a", &format!("m{i}")).await;
        }
    }
    let store = Store::open(dir.path(), &cfg()).unwrap();
    assert_eq!(store.pending_devices().await.unwrap(), vec![DeviceId::new("a").unwrap()]);
    let pending = store.pending(DeviceId::new("a").unwrap(), Seq(1), 10).await.unwrap();
    assert_eq!(pending.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![Seq(2), Seq(3)]);
    assert_eq!(seq_of(&put(&store, "a", "m9").await), Seq(4));
    assert!(matches!(put(&store, "a", "m0").await, IntakeOutcome::Duplicate(_)));
}
