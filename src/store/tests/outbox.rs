//! The receipts outbox: written with the state change it reports, kept
//! until acknowledged, across restarts.

use super::down::{dev, msg};
use super::*;
use crate::dead_letter::{DeadLetter, Direction};
use crate::protocol::receipt::NorthReceipt;

fn outbox_rows(conn: &rusqlite::Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM receipt_outbox", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_receipt_commits_or_rolls_back_with_the_state_change_it_reports() {
    let mut conn = rusqlite::Connection::open_in_memory().unwrap();
    schema::migrate(&mut conn).unwrap();
    let a = dev("a");
    let tx = conn.transaction().unwrap();
    let out = downlink::intake(&tx, &msg("n-1", &["a"], 10, None), &roomy(), 1).unwrap();
    assert_eq!(
        out.receipts.len(),
        1,
        "`stored`, in the intake's transaction"
    );
    downlink::read_batch(&tx, &a, Seq(0), 10, Now::at(1)).unwrap();
    tx.commit().unwrap();

    // A confirm whose transaction is rolled back leaves neither the cursor
    // move nor its receipt.
    let tx = conn.transaction().unwrap();
    let moved = downlink::advance(&tx, &a, Seq(1), false, Now::at(5)).unwrap();
    assert_eq!(moved.receipts.len(), 1);
    assert_eq!(outbox_rows(&tx), 2, "visible inside the transaction");
    drop(tx);
    assert_eq!(outbox_rows(&conn), 1);
    let tx = conn.transaction().unwrap();
    assert_eq!(downlink::cursors(&tx, &a).unwrap().delivered_upto, Seq(0));
    // Committed, both are there, and the receipt says what moved.
    let moved = downlink::advance(&tx, &a, Seq(1), false, Now::at(5)).unwrap();
    tx.commit().unwrap();
    assert_eq!(outbox_rows(&conn), 2);
    let r: serde_json::Value = serde_json::from_slice(&moved.receipts[0].body).unwrap();
    assert_eq!(r["status"], "delivered");
    assert_eq!(r["device"], "a");
    assert_eq!(r["seq"], 1);
    assert_eq!(r["ts"], 5);
}

#[tokio::test]
async fn receipts_stay_in_the_outbox_across_a_restart_until_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let out = store
        .down_intake(msg("n-1", &["a", "b"], 10, None))
        .await
        .unwrap();
    let ids: Vec<i64> = out.receipts.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), 2);
    store.exited_when_dropped().await;

    let store = Store::open(dir.path(), &cfg()).unwrap();
    let page = store.outbox_page(0, 100).await.unwrap();
    assert_eq!(page, out.receipts, "the same rows, in id order");
    assert_eq!(store.outbox_page(ids[1], 100).await.unwrap().len(), 1);
    store.receipts_sent(vec![ids[0]]).unwrap();
    // Queued after the delete, so it sees it.
    let page = store.outbox_page(0, 100).await.unwrap();
    assert_eq!(page.iter().map(|r| r.id).collect::<Vec<_>>(), vec![ids[1]]);
}

#[tokio::test]
async fn a_receipt_given_up_on_leaves_the_outbox_for_the_dead_letters_in_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let out = store
        .down_intake(msg("n-1", &["a"], 10, None))
        .await
        .unwrap();
    let r = &out.receipts[0];
    let dl = DeadLetter {
        direction: Direction::Down,
        device: Some("a".into()),
        msg_id: Some("n-1".into()),
        topic: "ferry/g/receipts".into(),
        reason: "undeliverable".into(),
        raw: r.body.clone(),
        at_ms: 3,
    };
    let dead = store.receipt_dead(r.id, dl).await.unwrap();
    assert!(dead > 0);
    assert!(store.outbox_page(0, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_rejected_downlink_commits_its_dead_letter_and_a_receipt_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let dl = DeadLetter {
        direction: Direction::Down,
        device: None,
        msg_id: Some("n-9".into()),
        topic: "ferry/g/down".into(),
        reason: "malformed: expected JSON object".into(),
        raw: bytes::Bytes::from_static(b"nope"),
        at_ms: 7,
    };
    let receipt = NorthReceipt {
        msg_id: dl.msg_id.clone(),
        device: None,
        status: "rejected",
        seq: None,
        ts: 7,
        reason: None,
    };
    let rejected = store.reject_downlink(dl, receipt).await.unwrap();
    let r: serde_json::Value = serde_json::from_slice(&rejected.receipt.body).unwrap();
    assert_eq!(r["status"], "rejected");
    assert_eq!(
        r["reason"],
        format!(
            "malformed: expected JSON object (dead letter {})",
            match rejected.refusal {
                crate::store::refusal::Refusal::Filed { id, .. } => id,
                other => panic!("{other:?}"),
            }
        )
    );
    assert_eq!(
        store.outbox_page(0, 10).await.unwrap(),
        vec![rejected.receipt]
    );
}
