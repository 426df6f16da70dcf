use super::*;

fn batch(json: &str) -> InboxBatch {
    serde_json::from_str(json).unwrap()
}

fn seqs(event: &DeviceEvent) -> (Vec<u64>, usize) {
    match event {
        DeviceEvent::Inbox {
            messages,
            duplicates,
            ..
        } => (messages.iter().map(|m| m.seq).collect(), *duplicates),
        other => panic!("not an inbox event: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_rate_rejection_keeps_the_message_for_a_resend_and_any_other_answer_ends_it() {
    let mut outbox: Resends<()> = Resends::new(Duration::from_secs(5));
    let id = MsgId::new("m-1").unwrap();
    outbox.insert(
        id.to_string(),
        "devices/d/up/t".into(),
        Bytes::from_static(b"{}"),
        (),
    );
    settle(
        &mut outbox,
        &Receipt::refused(Some(&id), "rate: over 1 publishes per second, burst 1"),
    );
    tokio::time::advance(Duration::from_secs(4)).await;
    assert!(
        outbox.due(false).is_empty(),
        "not before the receipt timeout"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        outbox.due(false),
        vec![("devices/d/up/t".to_string(), Bytes::from_static(b"{}"))],
        "sent again after it"
    );
    settle(
        &mut outbox,
        &Receipt::rejected(Some(&id), "malformed: nested deeper than 32", 7),
    );
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(outbox.due(true).is_empty(), "any other rejection is final");
    outbox.insert(id.to_string(), "t".into(), Bytes::new(), ());
    settle(&mut outbox, &Receipt::stored(&id, Seq(1)));
    assert!(outbox.due(true).is_empty());
}

#[test]
fn entries_at_or_below_the_cursor_are_dropped_as_duplicates() {
    let mut cursor = Cursor::new(41);
    let (event, again) = cursor.take(batch(
        r#"{"messages": [{"seq": 41, "msg_id": "n-8", "payload": 1},
                         {"seq": 42, "msg_id": "n-9", "ts": 5, "payload": "shift B"},
                         {"seq": 43, "msg_id": "n-12", "status": "expired"}],
            "more": true}"#,
    ));
    assert_eq!(seqs(&event), (vec![42, 43], 1));
    assert_eq!(again, None);
    let DeviceEvent::Inbox { messages, more, .. } = event else {
        unreachable!()
    };
    assert!(more);
    assert_eq!(
        messages[0].body,
        Some(serde_json::json!({"seq": 42, "msg_id": "n-9", "ts": 5, "payload": "shift B"}))
    );
    assert_eq!(
        (messages[1].body.as_ref(), messages[1].status.as_deref()),
        (None, Some("expired"))
    );
}

#[test]
fn a_batch_seen_before_is_confirmed_again() {
    let mut cursor = Cursor::new(0);
    let once = r#"{"messages": [{"seq": 1, "msg_id": "n-1", "payload": 1}], "more": false}"#;
    assert_eq!(cursor.take(batch(once)).1, None);
    assert_eq!(cursor.take(batch(once)).1, None, "not confirmed yet");
    cursor.confirmed(Seq(1));
    let (event, again) = cursor.take(batch(once));
    assert_eq!(seqs(&event), (vec![], 1));
    assert_eq!(again, Some(Seq(1)), "our confirm was lost");
    let empty = r#"{"messages": [], "more": false}"#;
    assert_eq!(cursor.take(batch(empty)).1, None);
}
