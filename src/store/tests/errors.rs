//! Requests the store refuses on their own, without failing the batch.

use super::*;
use crate::store::record::uplink::Transition;

#[tokio::test]
async fn an_illegal_transition_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    put(&store, "a", "m1").await;
    let back = Transition {
        device: DeviceId::new("a").unwrap(),
        msg_id: MsgId::new("m1").unwrap(),
        to: MessageState::Stored,
        attempts: 1,
        reason: None,
        at_ms: 2,
    };
    // Sent together: the refused one does not take the other down with it.
    let (refused, other) = tokio::join!(store.transition(back), store.intake(intake("a", "m2")));
    let err = refused.unwrap_err();
    assert!(matches!(err, StoreError::IllegalMove(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "refused: illegal message move stored -> stored"
    );
    assert!(matches!(other.unwrap(), IntakeOutcome::Stored(_)));
    let pending = store
        .pending(DeviceId::new("a").unwrap(), Seq(0), 10)
        .await
        .unwrap();
    assert_eq!(pending.len(), 2, "m1 is still stored");
}

#[tokio::test]
async fn an_unknown_state_in_the_database_is_an_error_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    put(&store, "a", "m1").await;
    store.exited_when_dropped().await;
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    conn.execute("UPDATE uplink SET state = 'teleported'", [])
        .unwrap();
    drop(conn);
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let err = store.intake(intake("a", "m1")).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::CorruptRow {
                table: "uplink",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("unknown state \"teleported\""),
        "{err}"
    );
    // Only that request failed: the store goes on.
    assert!(matches!(
        put(&store, "a", "m2").await,
        IntakeOutcome::Stored(_)
    ));
}

#[tokio::test]
async fn an_unknown_delivery_state_fails_the_read_that_meets_it() {
    use crate::store::record::downlink::DownIntake;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let a = DeviceId::new("a").unwrap();
    store
        .down_intake(DownIntake {
            msg_id: MsgId::new("n-1").unwrap(),
            body: bytes::Bytes::from_static(b"{}"),
            received_ms: 1,
            stored_ms: 1,
            expires_ms: None,
            to: vec![a.clone()],
            by_topic: false,
            queue_cap: 10,
        })
        .await
        .unwrap();
    store.exited_when_dropped().await;
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    conn.execute("UPDATE down_delivery SET state = 'lost'", [])
        .unwrap();
    drop(conn);
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let err = store
        .read_batch(a, Seq(0), 10, Now::at(5))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::CorruptRow {
                table: "down_delivery",
                ..
            }
        ),
        "{err}"
    );
}
