//! An MQTT 5 publish's user properties and message expiry are part of the
//! stored message: its north body holds `props` (and the `ttl_s` the
//! expiry gave), so a restart and every resend send them again, and a
//! duplicate with other properties changes nothing.

use serde_json::{json, Value};

use super::*;
use crate::protocol::envelope::with_publish;

fn v5(msg_id: &str, pairs: &[(&str, &str)], expiry_s: Option<u32>) -> Intake {
    let raw = format!(r#"{{"msg_id":"{msg_id}","payload":1}}"#);
    let envelope = parse_uplink(raw.as_bytes(), 1024).unwrap();
    let pairs = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let envelope = with_publish(envelope, pairs, expiry_s).unwrap();
    Intake::new(
        "g",
        DeviceId::new("a").unwrap(),
        "s".into(),
        envelope,
        Now::at(1),
    )
}

async fn body(store: &Store, msg_id: &str) -> Value {
    let pending = store
        .pending(DeviceId::new("a").unwrap(), Seq(0), 10)
        .await
        .unwrap();
    let m = pending
        .iter()
        .find(|m| m.msg_id.as_str() == msg_id)
        .expect("pending");
    serde_json::from_slice(&m.body).unwrap()
}

#[tokio::test]
async fn user_properties_and_the_expiry_ttl_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), &cfg()).unwrap();
        let first = v5("m1", &[("line", "3"), ("tag", "x"), ("tag", "y")], Some(60));
        assert!(matches!(
            store.intake(first).await.unwrap(),
            IntakeOutcome::Stored(_)
        ));
        store.intake(v5("m2", &[], None)).await.unwrap();
        store.exited_when_dropped().await;
    }
    let store = Store::open(dir.path(), &cfg()).unwrap();
    let m1 = body(&store, "m1").await;
    assert_eq!(m1["props"], json!({"line": "3", "tag": ["x", "y"]}));
    assert_eq!(
        (m1["seq"].as_u64(), m1["ttl_s"].as_u64()),
        (Some(1), Some(60))
    );
    assert_eq!(body(&store, "m2").await.get("props"), None);
    // The expiry counts on the store clock like any ttl_s.
    assert!(store.expire_due(Now::at(60_000)).await.unwrap().is_empty());
    let expired = store.expire_due(Now::at(60_001)).await.unwrap();
    assert_eq!(
        expired.iter().map(|e| e.1.as_str()).collect::<Vec<_>>(),
        ["m1"]
    );
}

#[tokio::test]
async fn a_duplicate_with_other_user_properties_is_stored_once_as_first_sent() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &cfg()).unwrap();
    store
        .intake(v5("m1", &[("k", "first")], None))
        .await
        .unwrap();
    let again = store
        .intake(v5("m1", &[("k", "second"), ("x", "y")], Some(5)))
        .await
        .unwrap();
    assert!(
        matches!(
            again,
            IntakeOutcome::Duplicate(Duplicate { seq: Seq(1), .. })
        ),
        "{again:?}"
    );
    let m1 = body(&store, "m1").await;
    assert_eq!(m1["props"], json!({"k": "first"}));
    assert_eq!(m1.get("ttl_s"), None);
    assert_eq!(
        store
            .pending(DeviceId::new("a").unwrap(), Seq(0), 10)
            .await
            .unwrap()
            .len(),
        1
    );
}
