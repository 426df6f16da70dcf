use super::*;

type Tag = String;

fn up(device: &str, seq: u64) -> Tag {
    format!("{device}-{seq}")
}

fn out(tag: Tag, epoch: u64) -> Outgoing<Tag> {
    Outgoing {
        topic: "t".into(),
        body: Bytes::from_static(b"{}"),
        retain: false,
        tag,
        epoch,
    }
}

/// A flow on connection 1 that has written `a-1..=a-n` (ids 1..=n).
fn with_written(n: u64, now: Instant) -> (Flow<Tag>, u16) {
    let mut f = Flow::new(100);
    f.connected(1);
    for seq in 1..=n {
        f.submit(out(up("a", seq), 1));
    }
    let mut pkid = 0;
    send_all(&mut f, &mut pkid, now);
    (f, pkid)
}

/// Hands over everything that may go and writes it with consecutive ids.
fn send_all(f: &mut Flow<Tag>, next_pkid: &mut u16, now: Instant) -> Vec<(u16, Tag)> {
    let mut sent = Vec::new();
    while let Some(o) = f.next_to_send() {
        *next_pkid += 1;
        f.written(*next_pkid, now);
        sent.push((*next_pkid, o.tag));
    }
    sent
}

#[test]
fn publishes_flow_in_order_within_the_window_and_are_acked_by_packet_id() {
    let now = Instant::now();
    let mut f = Flow::new(2);
    f.connected(1);
    for seq in 1..=3 {
        f.submit(out(up("a", seq), 1));
    }
    let mut pkid = 0;
    let sent = send_all(&mut f, &mut pkid, now);
    assert_eq!(sent, vec![(1, up("a", 1)), (2, up("a", 2))], "window of 2");
    assert_eq!(f.acked(1), Some(up("a", 1)));
    assert_eq!(send_all(&mut f, &mut pkid, now), vec![(3, up("a", 3))]);
    assert_eq!(f.acked(99), None, "an unknown id is nobody's");
}

#[test]
fn publishes_for_a_gone_connection_are_dropped() {
    let mut f = Flow::new(10);
    f.submit(out(up("a", 1), 1));
    assert!(f.next_to_send().is_none(), "not connected");
    f.connected(2);
    f.submit(out(up("a", 1), 1));
    assert!(f.next_to_send().is_none(), "made for epoch 1");
    f.submit(out(up("a", 2), 2));
    assert_eq!(f.next_to_send().unwrap().tag, up("a", 2));
}

#[test]
fn a_drop_makes_the_unacked_publishes_suspects_probed_alone_next_time() {
    let now = Instant::now();
    let (mut f, mut pkid) = with_written(4, now);
    f.acked(1);
    assert_eq!(f.lost(now), None, "no probe was out: no strike");
    assert!(!f.is_suspect(&up("a", 1)), "acked");
    assert!(f.is_suspect(&up("a", 2)));
    assert!(f.is_suspect(&up("a", 4)));

    f.connected(2);
    f.submit(out(up("b", 1), 2));
    f.submit(out(up("a", 2), 2));
    f.submit(out(up("b", 2), 2));
    assert_eq!(
        send_all(&mut f, &mut pkid, now).len(),
        1,
        "b-1 goes; the suspect waits"
    );
    assert!(
        f.next_to_send().is_none(),
        "the probe waits until nothing else is in flight"
    );
    f.acked(pkid);
    let probe = send_all(&mut f, &mut pkid, now);
    assert_eq!(probe, vec![(pkid, up("a", 2))], "alone");
    assert!(
        f.next_to_send().is_none(),
        "everything else is held behind the probe"
    );
    assert_eq!(f.acked(pkid), Some(up("a", 2)));
    assert!(!f.is_suspect(&up("a", 2)), "an acked probe is cleared");
    assert_eq!(send_all(&mut f, &mut pkid, now).len(), 1, "b-2 flows again");
}

#[test]
fn a_drop_on_a_lone_probe_soon_after_its_write_is_a_strike() {
    let now = Instant::now();
    let (mut f, mut pkid) = with_written(1, now);
    f.lost(now);
    for epoch in 2..=4 {
        f.connected(epoch);
        f.submit(out(up("a", 1), epoch));
        f.submit(out(up("b", 1), epoch));
        assert_eq!(send_all(&mut f, &mut pkid, now).len(), 1);
        assert_eq!(
            f.lost(now + Duration::from_millis(10)),
            Some(up("a", 1)),
            "epoch {epoch}"
        );
        assert!(f.is_suspect(&up("a", 1)), "still suspected after a strike");
    }
}

#[test]
fn a_drop_long_after_the_probe_was_written_is_no_strike() {
    let now = Instant::now();
    let mut f = Flow::new(100);
    f.connected(1);
    f.submit(out("receipts-7".to_string(), 1));
    let mut pkid = 0;
    send_all(&mut f, &mut pkid, now);
    f.lost(now);
    f.connected(2);
    f.submit(out("receipts-7".to_string(), 2));
    send_all(&mut f, &mut pkid, now);
    assert_eq!(f.lost(now + STRIKE_WINDOW + Duration::from_secs(1)), None);
}

#[test]
fn a_probe_neither_acked_nor_dropped_on_is_cleared_after_its_timeout() {
    let now = Instant::now();
    let (mut f, mut pkid) = with_written(1, now);
    f.lost(now);
    f.connected(2);
    f.submit(out(up("a", 1), 2));
    f.submit(out(up("a", 2), 2));
    send_all(&mut f, &mut pkid, now);
    assert_eq!(f.probe_deadline(), Some(now + PROBE_TIMEOUT));
    assert_eq!(f.expire_probe(now), None);
    assert_eq!(f.expire_probe(now + PROBE_TIMEOUT), Some(up("a", 1)));
    assert!(!f.is_suspect(&up("a", 1)));
    assert_eq!(send_all(&mut f, &mut pkid, now).len(), 1, "a-2 flows");
}

#[test]
fn a_collided_publish_keeps_its_tag_until_written() {
    let now = Instant::now();
    let mut f = Flow::new(100);
    f.connected(1);
    f.submit(out(up("a", 1), 1));
    f.submit(out(up("a", 2), 1));
    let first = f.next_to_send().unwrap();
    f.written(1, now);
    let second = f.next_to_send().unwrap();
    assert_eq!((first.tag, second.tag.clone()), (up("a", 1), up("a", 2)));
    f.collision(1);
    assert_eq!(f.acked(1), Some(up("a", 1)));
    f.written(1, now);
    assert_eq!(f.acked(1), Some(up("a", 2)));
}

#[test]
fn a_publish_the_client_could_not_take_goes_first_next_time() {
    let mut f = Flow::new(100);
    f.connected(1);
    f.submit(out(up("a", 1), 1));
    f.submit(out(up("a", 2), 1));
    let o = f.next_to_send().unwrap();
    f.refused_by_client(o);
    assert_eq!(f.next_to_send().unwrap().tag, up("a", 1));
}

#[test]
fn a_drop_makes_at_most_sixteen_suspects() {
    let now = Instant::now();
    let (mut f, _) = with_written(40, now);
    f.lost(now);
    let suspects: Vec<u64> = (1..=40).filter(|s| f.is_suspect(&up("a", *s))).collect();
    assert_eq!(suspects, (1..=16).collect::<Vec<_>>());
}
