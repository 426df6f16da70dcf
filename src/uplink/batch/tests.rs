use super::*;
use crate::ids::MsgId;

fn msg(device: &str, seq: u64, body: &str) -> PendingMessage {
    PendingMessage {
        id: seq as i64,
        device: DeviceId::new(device).unwrap(),
        msg_id: MsgId::new(format!("m-{seq}")).unwrap(),
        seq: Seq(seq),
        stream: "s".into(),
        body: Bytes::from(body.to_string()),
        expires_ms: None,
        no_retry: false,
        attempts: 0,
    }
}

fn cfg(max: usize, max_bytes: usize) -> BatchConfig {
    BatchConfig {
        max,
        linger: Duration::from_millis(5),
        max_bytes,
    }
}

fn gathered(a: Added) -> Option<Batch> {
    match a {
        Added::Gathered { full } => full,
        Added::Alone(m) => panic!("alone: {m:?}"),
    }
}

fn order(b: &Batch) -> Vec<(String, u64)> {
    b.entries
        .iter()
        .map(|e| (e.device.to_string(), e.seq.0))
        .collect()
}

#[test]
fn batches_off_publish_every_message_alone() {
    let mut b = Batcher::new(BatchConfig::OFF);
    let now = Instant::now();
    assert!(matches!(
        b.add(msg("d", 1, "{}"), None, now),
        Added::Alone(_)
    ));
    assert!(b.due().is_none() && b.take().is_none());
}

#[test]
fn a_batch_is_the_bodies_as_a_json_array_and_goes_when_full() {
    let mut b = Batcher::new(cfg(3, 1 << 20));
    let now = Instant::now();
    assert!(gathered(b.add(msg("d", 1, r#"{"a":1}"#), None, now)).is_none());
    assert_eq!(b.due(), Some(now + Duration::from_millis(5)));
    assert!(gathered(b.add(msg("d", 2, r#"{"a":2}"#), None, now)).is_none());
    let full = gathered(b.add(msg("e", 1, r#"{"b":1}"#), None, now)).expect("full at 3");
    assert_eq!(&full.payload[..], br#"[{"a":1},{"a":2},{"b":1}]"#);
    let parsed: serde_json::Value = serde_json::from_slice(&full.payload).unwrap();
    assert_eq!(parsed.as_array().unwrap().len(), 3);
    assert!(b.due().is_none() && b.take().is_none(), "nothing left open");
}

#[test]
fn a_devices_bodies_go_in_seq_order_whatever_order_they_came_in() {
    let mut b = Batcher::new(cfg(10, 1 << 20));
    let now = Instant::now();
    for (d, s) in [("d", 5), ("e", 2), ("d", 3), ("e", 1), ("d", 4)] {
        gathered(b.add(msg(d, s, "1"), None, now));
    }
    let batch = b.take().unwrap();
    let want: Vec<(String, u64)> = [("d", 3), ("d", 4), ("d", 5), ("e", 1), ("e", 2)]
        .iter()
        .map(|(d, s)| (d.to_string(), *s))
        .collect();
    assert_eq!(order(&batch), want);
    assert_eq!(&batch.payload[..], b"[1,1,1,1,1]");
}

#[test]
fn a_batch_never_passes_its_byte_bound_and_a_body_too_large_to_share_goes_alone() {
    // "[" + 4 bodies of 4 bytes + 3 commas + "]" = 21 bytes: the fifth would
    // make 26 > 24.
    let mut b = Batcher::new(cfg(100, 24));
    let now = Instant::now();
    for s in 1..=4 {
        assert!(gathered(b.add(msg("d", s, "1234"), None, now)).is_none());
    }
    let full = gathered(b.add(msg("d", 5, "1234"), None, now)).expect("made room");
    assert_eq!(&full.payload[..], b"[1234,1234,1234,1234]");
    assert!(full.payload.len() <= 24);
    let rest = b.take().unwrap();
    assert_eq!(order(&rest), vec![("d".to_string(), 5)]);
    // 23 bytes and its brackets: over 24.
    let big = "x".repeat(23);
    assert!(matches!(
        b.add(msg("d", 6, &big), None, now),
        Added::Alone(_)
    ));
}

#[test]
fn a_link_change_drops_the_open_batch() {
    let mut b = Batcher::new(cfg(10, 1 << 20));
    let now = Instant::now();
    gathered(b.add(msg("d", 1, "1"), None, now));
    b.drop_open();
    assert!(b.due().is_none() && b.take().is_none());
    // And the next batch starts clean.
    gathered(b.add(msg("d", 2, "2"), None, now));
    assert_eq!(&b.take().unwrap().payload[..], b"[2]");
}

#[test]
fn a_message_of_a_refused_batch_goes_alone_once() {
    let mut b = Batcher::new(cfg(10, 1 << 20));
    let now = Instant::now();
    let d = DeviceId::new("d").unwrap();
    b.refused([(d.clone(), Seq(1)), (d.clone(), Seq(2))]);
    assert!(matches!(
        b.add(msg("d", 1, "1"), None, now),
        Added::Alone(_)
    ));
    assert!(matches!(
        b.add(msg("d", 2, "2"), None, now),
        Added::Alone(_)
    ));
    // Once alone is enough: the next send batches again.
    assert!(gathered(b.add(msg("d", 1, "1"), None, now)).is_none());
}
