//! Downlink queues, cursors and expiry.

use super::*;
use crate::state::DeliveryState;
use crate::store::record::downlink::*;
use bytes::Bytes;

pub(super) fn dev(s: &str) -> DeviceId {
    DeviceId::new(s).unwrap()
}

pub(super) fn msg(id: &str, to: &[&str], cap: u64, expires_ms: Option<i64>) -> DownIntake {
    DownIntake {
        msg_id: MsgId::new(id).unwrap(),
        body: Bytes::from(format!(r#"{{"msg_id":"{id}","payload":1}}"#)),
        received_ms: 1,
        stored_ms: 1,
        expires_ms,
        to: to.iter().map(|d| dev(d)).collect(),
        by_topic: false,
        queue_cap: cap,
    }
}

async fn put(store: &Store, m: DownIntake) -> DownIntakeOutcome {
    store.down_intake(m).await.unwrap()
}

async fn batch(store: &Store, d: &str, after: u64, now_ms: i64) -> BatchRead {
    let device = dev(d);
    store
        .read_batch(device, Seq(after), 10, Now::at(now_ms))
        .await
        .unwrap()
}

async fn advance(store: &Store, d: &str, upto: u64, read: bool) -> CursorMove {
    let device = dev(d);
    store.advance(device, Seq(upto), read, 9).await.unwrap()
}

#[tokio::test]
async fn a_message_is_stored_once_and_queued_per_device_with_its_own_seq() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    put(&store, msg("n-0", &["a"], 100, None)).await;
    let out = put(&store, msg("n-1", &["a", "b"], 100, None)).await;
    let seqs: Vec<_> = out
        .queued
        .iter()
        .map(|(e, new)| (e.device.to_string(), e.seq.0, *new))
        .collect();
    assert_eq!(seqs, vec![("a".into(), 2, true), ("b".into(), 1, true)]);
    // Repeated, with one more device: only c is new.
    let out = put(&store, msg("n-1", &["a", "b", "c"], 100, None)).await;
    let seqs: Vec<_> = out
        .queued
        .iter()
        .map(|(e, new)| (e.device.to_string(), e.seq.0, *new))
        .collect();
    assert_eq!(
        seqs,
        vec![
            ("a".into(), 2, false),
            ("b".into(), 1, false),
            ("c".into(), 1, true)
        ]
    );
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let n: i64 = conn
        .query_row("SELECT count(*) FROM down_message", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2, "content stored once per msg_id");
}

#[tokio::test]
async fn cursors_move_forward_only_and_report_each_delivery_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    for i in 0..5 {
        put(&store, msg(&format!("n-{i}"), &["a"], 100, None)).await;
    }
    let b = batch(&store, "a", 0, 0).await;
    assert_eq!(
        b.entries.iter().map(|e| e.seq.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    assert_eq!(b.head, Seq(5));
    let m = advance(&store, "a", 3, false).await;
    assert_eq!(m.cursors.delivered_upto, Seq(3));
    assert_eq!(
        m.events.iter().map(|e| e.seq.0).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(
        advance(&store, "a", 2, false).await.events.is_empty(),
        "a stale confirm is ignored"
    );
    let m = advance(&store, "a", 99, false).await;
    assert_eq!(m.cursors.delivered_upto, Seq(5), "never past what was sent");
    let m = advance(&store, "a", 2, true).await;
    assert_eq!(
        m.events
            .iter()
            .map(|e| (e.seq.0, e.state))
            .collect::<Vec<_>>(),
        vec![(1, DeliveryState::Read), (2, DeliveryState::Read)]
    );
    assert_eq!(batch(&store, "a", 5, 0).await.entries.len(), 0);
}

#[tokio::test]
async fn the_queue_cap_and_ttl_turn_deliveries_into_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let mut expired = Vec::new();
    for i in 0..5 {
        expired.extend(
            put(&store, msg(&format!("n-{i}"), &["a"], 3, None))
                .await
                .expired,
        );
    }
    assert_eq!(
        expired.iter().map(|e| e.seq.0).collect::<Vec<_>>(),
        vec![1, 2]
    );
    put(&store, msg("t-1", &["a"], 100, Some(50))).await;
    let b = batch(&store, "a", 0, 100).await;
    let kinds: Vec<_> = b
        .entries
        .iter()
        .map(|e| (e.seq.0, e.body.is_some()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (1, false),
            (2, false),
            (3, true),
            (4, true),
            (5, true),
            (6, false)
        ]
    );
    assert_eq!(b.expired.len(), 1, "the ttl expiry is reported once");
    assert!(batch(&store, "a", 5, 100).await.expired.is_empty());
}

#[tokio::test]
async fn a_sweep_expires_deliveries_of_offline_devices() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    put(&store, msg("t-1", &["a", "b"], 100, Some(50))).await;
    let store = &store;
    let sweep = |now_ms| async move { store.sweep_downlinks(Now::at(now_ms)).await.unwrap() };
    assert!(sweep(49).await.events.is_empty());
    assert_eq!(sweep(50).await.events.len(), 2);
    assert!(sweep(60).await.events.is_empty(), "swept once");
}

#[tokio::test]
async fn a_nack_dead_letters_the_delivery_and_moves_the_cursor_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    put(&store, msg("n-1", &["a"], 100, None)).await;
    put(&store, msg("n-2", &["a"], 100, None)).await;
    batch(&store, "a", 0, 0).await;
    let device = dev("a");
    let m = store
        .nack(
            device,
            Seq(1),
            crate::store::record::downlink::reason::nacked("no room"),
            3,
        )
        .await
        .unwrap();
    assert_eq!(m.cursors.delivered_upto, Seq(1));
    assert_eq!(m.events[0].state, DeliveryState::Dead);
    assert_eq!(m.events[0].reason.as_deref(), Some("nacked: no room"));
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    let (dir_, reason): (String, String) = conn
        .query_row("SELECT direction, reason FROM dead_letter", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(
        (dir_.as_str(), reason.as_str()),
        ("down", "nacked: no room")
    );
}

#[tokio::test]
async fn seqs_past_i64_from_a_device_saturate_instead_of_wrapping_around() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    for i in 0..3 {
        put(&store, msg(&format!("n-{i}"), &["a"], 100, None)).await;
    }
    assert_eq!(batch(&store, "a", 0, 0).await.entries.len(), 3);
    for after in [1 << 63, u64::MAX - 1, u64::MAX] {
        let b = batch(&store, "a", after, 0).await;
        assert!(
            b.entries.is_empty(),
            "a pull after {after} is past the head, not before seq 1: {:?}",
            b.entries
        );
        assert_eq!(b.head, Seq(3));
    }
    let device = dev("a");
    let m = store
        .nack(device, Seq(u64::MAX), reason::nacked("x"), 3)
        .await
        .unwrap();
    assert!(m.events.is_empty(), "no delivery has that seq");
    assert_eq!(m.cursors.delivered_upto, Seq(0));
    let m = advance(&store, "a", u64::MAX, true).await;
    assert_eq!(m.cursors.delivered_upto, Seq(3), "never past what was sent");
    assert_eq!(m.cursors.read_upto, Seq(3));
}

#[tokio::test]
async fn a_confirm_read_or_nack_reaches_no_further_than_what_was_sent() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    for i in 0..5 {
        put(&store, msg(&format!("n-{i}"), &["a"], 100, None)).await;
    }
    let m = advance(&store, "a", 5, false).await;
    assert_eq!(m.cursors.delivered_upto, Seq(0), "nothing was sent yet");
    assert!(m.events.is_empty());
    assert_eq!(m.confirmed, Some(Seq(0)));
    let sent = store
        .read_batch(dev("a"), Seq(0), 2, Now::at(0))
        .await
        .unwrap();
    assert_eq!(sent.entries.len(), 2);
    let m = advance(&store, "a", u64::MAX, false).await;
    assert_eq!(m.cursors.delivered_upto, Seq(2), "seqs 1 and 2 were sent");
    assert_eq!(
        m.events.iter().map(|e| e.seq.0).collect::<Vec<_>>(),
        vec![1, 2],
        "`delivered` only for what the device was sent"
    );
    assert_eq!(m.confirmed, Some(Seq(2)));
    let m = store
        .nack(dev("a"), Seq(4), reason::nacked("never seen"), 3)
        .await
        .unwrap();
    assert!(
        m.events.is_empty(),
        "seq 4 was never sent: not the device's to refuse"
    );
    // A replay from behind the cursor sends nothing new; the next batch does.
    store
        .read_batch(dev("a"), Seq(0), 2, Now::at(0))
        .await
        .unwrap();
    assert_eq!(
        advance(&store, "a", 9, true).await.cursors.read_upto,
        Seq(2)
    );
    store
        .read_batch(dev("a"), Seq(2), 10, Now::at(0))
        .await
        .unwrap();
    let m = advance(&store, "a", 9, true).await;
    assert_eq!(
        (m.cursors.delivered_upto, m.cursors.read_upto),
        (Seq(5), Seq(5))
    );
    let m = store
        .nack(dev("a"), Seq(4), reason::nacked("late"), 3)
        .await
        .unwrap();
    assert!(m.events.is_empty(), "4 is read: no longer nackable");
}
