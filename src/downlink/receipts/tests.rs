use super::*;

fn row(n: i64) -> OutboxReceipt {
    OutboxReceipt {
        id: n,
        body: Bytes::from(format!(
            r#"{{"msg_id":"m-{n}","status":"stored","seq":{n},"ts":1}}"#
        )),
    }
}

fn seqs(body: &Bytes) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    match v {
        serde_json::Value::Array(items) => {
            items.iter().map(|i| i["seq"].as_u64().unwrap()).collect()
        }
        one => vec![one["seq"].as_u64().unwrap()],
    }
}

/// A window that has read the (empty) table at start.
fn started(max_held: usize) -> Receipts {
    let mut r = Receipts::new(max_held);
    let (from, limit) = r.next_page().expect("the table is read first");
    assert_eq!(from, 0);
    r.loaded(Vec::new(), limit);
    r
}

#[test]
fn receipts_go_in_bounded_messages_and_stay_until_acknowledged() {
    let mut r = started(10_000);
    r.extend((1..=1200).map(row));
    let (a, body_a) = r.next_message().unwrap();
    let (b, _) = r.next_message().unwrap();
    let (c, body_c) = r.next_message().unwrap();
    assert_eq!(seqs(&body_a).len(), PER_MESSAGE);
    assert_eq!(seqs(&body_c), (1001..=1200).collect::<Vec<_>>());
    assert!(r.next_message().is_none());
    assert_eq!(
        r.published(b),
        (501..=1000).collect::<Vec<_>>(),
        "rows to delete"
    );
    assert_eq!(r.held(), 1200 - PER_MESSAGE);
    r.link_down();
    assert_eq!(
        r.next_message().map(|(id, _)| id),
        Some(a),
        "resent first, same id"
    );
    assert_eq!(r.next_message().map(|(id, _)| id), Some(c));
    r.published(a);
    r.published(c);
    assert_eq!(r.held(), 0);
    assert!(r.published(c).is_empty(), "acknowledged once");
}

#[test]
fn a_message_is_closed_at_its_byte_budget() {
    let mut r = started(10_000);
    let big = |id| OutboxReceipt {
        id,
        body: Bytes::from(format!(
            r#"{{"seq":1,"reason":"{}"}}"#,
            "x".repeat(MESSAGE_BYTES / 3)
        )),
    };
    r.extend([big(1), big(2), big(3), row(4)]);
    let (_, first) = r.next_message().unwrap();
    assert_eq!(seqs(&first), vec![1, 1]);
}

#[test]
fn a_refused_message_is_split_and_a_lone_refused_receipt_is_given_up() {
    let mut r = started(10_000);
    r.extend((1..=3).map(row));
    let (id, _) = r.next_message().unwrap();
    r.extend([row(4)]);
    assert_eq!(r.refused(id, 2), None);
    let singles: Vec<_> = (0..3).map(|_| r.next_message().unwrap()).collect();
    assert_eq!(
        singles.iter().map(|(_, b)| seqs(b)).collect::<Vec<_>>(),
        vec![vec![1], vec![2], vec![3]],
        "one per receipt, ahead of the new one"
    );
    let (lone, _) = singles[1].clone();
    assert_eq!(r.refused(lone, 2), None, "first strike");
    r.link_down();
    assert_eq!(r.refused(lone, 2).unwrap().id, 2, "given up");
    assert_eq!(r.held(), 3);
}

#[test]
fn past_the_window_receipts_wait_in_the_table_and_none_is_dropped() {
    let max = PER_MESSAGE * 2;
    let mut r = started(max);
    r.extend((1..=(max as i64 + 700)).map(row));
    assert_eq!(r.held(), max, "the window is full");
    assert_eq!(r.next_page(), None, "no room yet");
    let (a, _) = r.next_message().unwrap();
    r.published(a);
    let (from, limit) = r.next_page().expect("room for a page");
    assert_eq!((from, limit), (max as i64 + 1, PER_MESSAGE));
    // The table holds what was not kept, oldest first.
    let page: Vec<_> = (from..from + limit as i64).map(row).collect();
    r.loaded(page, limit);
    let (b, _) = r.next_message().unwrap();
    r.published(b);
    let (c, body) = r.next_message().unwrap();
    assert_eq!(
        seqs(&body)[0],
        max as u64 + 1,
        "paged rows follow in id order"
    );
    r.published(c);
    let (from, limit) = r.next_page().expect("the rest");
    assert_eq!(from, max as i64 + 1 + PER_MESSAGE as i64);
    r.loaded((from..=(max as i64 + 700)).map(row).collect(), limit);
    assert_eq!(r.next_page(), None, "all read");
    let mut all = Vec::new();
    while let Some((id, body)) = r.next_message() {
        all.extend(seqs(&body));
        r.published(id);
    }
    assert_eq!(all.last(), Some(&(max as u64 + 700)));
    assert_eq!(r.held(), 0);
}

#[test]
fn receipts_committed_while_a_page_is_read_come_after_it() {
    let mut r = Receipts::new(10_000);
    let (from, limit) = r.next_page().unwrap();
    // Committed after the page was asked for: not queued ahead of it.
    r.extend([row(8), row(9)]);
    assert!(r.next_message().is_none());
    r.loaded((1..=7).map(row).collect(), limit);
    assert_eq!(from, 0);
    let (from, limit) = r.next_page().expect("the rows met while loading");
    assert_eq!(from, 8);
    // The page may meet rows already held; they are not queued twice.
    r.loaded(vec![row(8), row(9)], limit);
    let (_, body) = r.next_message().unwrap();
    assert_eq!(seqs(&body), (1..=9).collect::<Vec<_>>());
    assert!(r.next_message().is_none());
}

#[test]
fn a_failed_page_is_asked_for_again() {
    let mut r = Receipts::new(10_000);
    let (from, _) = r.next_page().unwrap();
    assert_eq!(r.next_page(), None, "one at a time");
    r.load_failed(from);
    assert_eq!(r.next_page().map(|(f, _)| f), Some(0));
}
