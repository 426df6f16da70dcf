use super::*;
use crate::protocol::ack::Verdict;
use bytes::Bytes;

fn cfg() -> SchedulerConfig {
    SchedulerConfig {
        max_inflight: 2,
        ack_timeout: Duration::from_millis(1000),
        retry: RetryConfig {
            base: Duration::from_millis(100),
            max: Duration::from_millis(400),
            max_attempts: 3,
            jitter: 0.0,
        },
        window: 4,
    }
}

fn dev() -> DeviceId {
    DeviceId::new("d1").unwrap()
}

fn msg(seq: u64) -> PendingMessage {
    msg_of(&dev(), seq)
}

fn msg_of(device: &DeviceId, seq: u64) -> PendingMessage {
    PendingMessage {
        id: seq as i64,
        device: device.clone(),
        msg_id: MsgId::new(format!("m{seq}")).unwrap(),
        seq: Seq(seq),
        stream: "s".into(),
        body: Bytes::from_static(b"{}"),
        expires_ms: None,
        no_retry: false,
        attempts: 0,
    }
}

fn published(actions: &[Action]) -> Vec<u64> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Publish { msg: m, .. } => Some(m.seq.0),
            _ => None,
        })
        .collect()
}

/// The backend acks another message, sent just after `t`: it is there,
/// and has taken what was sent up to then (not behind it).
fn acked_one_sent_after(s: &mut Scheduler, t: Instant) {
    let later = t + Duration::from_millis(1);
    s.on_backend_heard(later);
    s.backend.answered(later);
}

fn id(seq: u64) -> MsgId {
    MsgId::new(format!("m{seq}")).unwrap()
}

#[test]
fn first_attempts_go_in_seq_order_within_max_inflight() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    for i in 1..=4 {
        s.on_stored(msg(i), None, t0, 0);
    }
    assert_eq!(published(&s.poll(t0)), vec![1, 2]);
    assert_eq!(
        published(&s.poll(t0)),
        Vec::<u64>::new(),
        "window full: nothing more"
    );
    let acts = s.on_ack(&dev(), &id(1), Verdict::Ok, t0);
    assert!(matches!(&acts[..], [Action::Deliver { attempts: 1, .. }]));
    assert_eq!(published(&s.poll(t0)), vec![3]);
}

#[test]
fn nothing_goes_north_while_the_link_is_down() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_stored(msg(1), None, t0, 0);
    assert!(s.poll(t0).is_empty());
    s.on_link_up(1);
    assert_eq!(published(&s.poll(t0)), vec![1]);
}

#[test]
fn an_ack_timeout_counts_and_backs_off_then_exhausts() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), None, t0, 0);
    assert_eq!(published(&s.poll(t0)), vec![1]);
    // The backend acks other messages meanwhile: it is there.
    acked_one_sent_after(&mut s, t0);

    let t1 = t0 + Duration::from_millis(1000);
    let acts = s.on_tick(t1);
    assert!(
        matches!(&acts[..], [Action::RecordAttempt { attempts: 1, retry_in, .. }] if *retry_in == Duration::from_millis(100))
    );
    assert!(s.poll(t1).is_empty(), "backing off");
    let t2 = t1 + Duration::from_millis(100);
    assert!(s.on_tick(t2).is_empty());
    assert_eq!(published(&s.poll(t2)), vec![1], "resent after the delay");
    acked_one_sent_after(&mut s, t2);

    let t3 = t2 + Duration::from_millis(1000);
    assert!(
        matches!(&s.on_tick(t3)[..], [Action::RecordAttempt { attempts: 2, retry_in, .. }] if *retry_in == Duration::from_millis(200))
    );
    let t4 = t3 + Duration::from_millis(200);
    s.on_tick(t4);
    assert_eq!(published(&s.poll(t4)), vec![1]);
    acked_one_sent_after(&mut s, t4);
    let t5 = t4 + Duration::from_millis(1000);
    let acts = s.on_tick(t5);
    assert!(
        matches!(&acts[..], [Action::Kill { attempts: 3, reason, .. }] if reason.starts_with("exhausted")),
        "{acts:?}"
    );
    assert_eq!(s.in_memory(), 0);
}

#[test]
fn a_link_drop_does_not_count_an_attempt() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), None, t0, 0);
    s.poll(t0);
    s.on_link_down();
    // Hours pass with the link down: nothing counts, nothing is sent.
    let later = t0 + Duration::from_secs(3 * 3600);
    assert!(s.on_tick(later).is_empty());
    assert!(s.poll(later).is_empty());
    s.on_link_up(2);
    assert_eq!(published(&s.poll(later)), vec![1]);
    // The old epoch's timer firing now changes nothing.
    let acts = s.on_ack(&dev(), &id(1), Verdict::Ok, later);
    assert!(matches!(&acts[..], [Action::Deliver { attempts: 1, .. }]));
}

#[test]
fn a_timeout_from_an_earlier_connection_is_not_counted() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), None, t0, 0);
    s.poll(t0);
    s.on_link_down();
    s.on_link_up(2);
    // Resent at t0 + 500 on epoch 2; the epoch-1 deadline at t0 + 1000 is stale.
    let t1 = t0 + Duration::from_millis(500);
    assert_eq!(published(&s.poll(t1)), vec![1]);
    acked_one_sent_after(&mut s, t1);
    assert!(s.on_tick(t0 + Duration::from_millis(1000)).is_empty());
    assert!(matches!(
        &s.on_tick(t1 + Duration::from_millis(1000))[..],
        [Action::RecordAttempt { attempts: 1, .. }]
    ));
}

#[test]
fn nacks_retry_or_kill_as_told() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), None, t0, 0);
    s.on_stored(msg(2), None, t0, 0);
    s.poll(t0);
    let acts = s.on_ack(
        &dev(),
        &id(1),
        Verdict::Nack {
            reason: "busy".into(),
            retry: true,
        },
        t0,
    );
    assert!(matches!(
        &acts[..],
        [Action::RecordAttempt { attempts: 1, .. }]
    ));
    let acts = s.on_ack(
        &dev(),
        &id(2),
        Verdict::Nack {
            reason: "unknown sensor".into(),
            retry: false,
        },
        t0,
    );
    assert!(
        matches!(&acts[..], [Action::Kill { reason, .. }] if reason == "nacked: unknown sensor")
    );
}

#[test]
fn a_no_retry_message_dies_on_its_first_failure() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(
        PendingMessage {
            no_retry: true,
            ..msg(1)
        },
        None,
        t0,
        0,
    );
    s.poll(t0);
    acked_one_sent_after(&mut s, t0);
    let acts = s.on_tick(t0 + Duration::from_millis(1000));
    assert!(
        matches!(&acts[..], [Action::Kill { reason, .. }] if reason.starts_with("no_retry")),
        "{acts:?}"
    );
    s.on_stored(
        PendingMessage {
            no_retry: true,
            ..msg(2)
        },
        None,
        t0,
        0,
    );
    s.poll(t0);
    let acts = s.on_ack(
        &dev(),
        &id(2),
        Verdict::Nack {
            reason: "x".into(),
            retry: true,
        },
        t0,
    );
    assert!(matches!(&acts[..], [Action::Kill { .. }]));
}

#[test]
fn ttl_expires_even_while_the_link_is_down() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_stored(
        PendingMessage {
            expires_ms: Some(10_000 + 5_000),
            ..msg(1)
        },
        None,
        t0,
        10_000,
    );
    assert!(s.on_tick(t0 + Duration::from_millis(4_999)).is_empty());
    let acts = s.on_tick(t0 + Duration::from_millis(5_000));
    assert!(matches!(&acts[..], [Action::Kill { reason, .. }] if reason.starts_with("expired")));
}

#[test]
fn an_ack_for_a_message_not_in_memory_still_reaches_the_store() {
    let mut s = Scheduler::new(cfg());
    let acts = s.on_ack(&dev(), &id(9), Verdict::Ok, Instant::now());
    assert!(matches!(&acts[..], [Action::Deliver { .. }]));
    let acts = s.on_ack(
        &dev(),
        &id(9),
        Verdict::Nack {
            reason: "x".into(),
            retry: true,
        },
        Instant::now(),
    );
    assert!(acts.is_empty());
}

#[test]
fn a_backlog_beyond_the_window_is_refilled_in_order() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    for i in 1..=6 {
        s.on_stored(msg(i), None, t0, 0);
    }
    assert_eq!(s.in_memory(), 4, "window of 4");
    s.on_link_up(1);
    assert_eq!(published(&s.poll(t0)), vec![1, 2]);
    for i in 1..=2 {
        s.on_ack(&dev(), &id(i), Verdict::Ok, t0);
    }
    let acts = s.poll(t0);
    assert_eq!(published(&acts), vec![3, 4]);
    let refill = acts.iter().find_map(|a| match a {
        Action::Refill { after, limit, .. } => Some((*after, *limit)),
        _ => None,
    });
    assert_eq!(refill, Some((Seq(4), 2)));
    // Seq 7 is committed while the refill is being read.
    s.on_stored(msg(7), None, t0, 0);
    s.on_loaded(&dev(), vec![msg(5), msg(6)], 2, t0, 0);
    for i in 3..=4 {
        s.on_ack(&dev(), &id(i), Verdict::Ok, t0);
    }
    let acts = s.poll(t0);
    assert_eq!(published(&acts), vec![5, 6]);
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Refill { after: Seq(6), .. })),
        "7 is read back: {acts:?}"
    );
}

#[test]
fn on_backlog_starts_with_a_refill() {
    let mut s = Scheduler::new(cfg());
    s.on_backlog(dev());
    let acts = s.poll(Instant::now());
    assert_eq!(
        acts,
        vec![Action::Refill {
            device: dev(),
            after: Seq(0),
            limit: 4
        }]
    );
}

#[test]
fn a_message_the_store_expired_is_forgotten() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_stored(msg(1), None, t0, 0);
    s.on_stored(msg(2), None, t0, 0);
    s.forget(&dev(), &id(1));
    s.on_link_up(1);
    assert_eq!(published(&s.poll(t0)), vec![2]);
}

#[test]
fn a_refusal_by_the_upstream_counts_as_an_attempt_while_other_messages_flow() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), None, t0, 0);
    s.on_stored(msg(2), None, t0, 0);
    assert_eq!(published(&s.poll(t0)), vec![1, 2]);
    let acts = s.on_refused(&dev(), Seq(1), t0);
    assert!(
        matches!(&acts[..], [Action::RecordAttempt { attempts: 1, error, .. }] if error == REFUSED),
        "{acts:?}"
    );
    s.on_link_down();
    s.on_link_up(2);
    assert_eq!(published(&s.poll(t0)), vec![2], "the refused one backs off");
    let mut t = t0;
    let mut killed = None;
    for _ in 0..10 {
        t += Duration::from_secs(1);
        s.on_tick(t);
        if published(&s.poll(t)).contains(&1) {
            let acts = s.on_refused(&dev(), Seq(1), t);
            if let Some(Action::Kill {
                attempts, reason, ..
            }) = acts.first()
            {
                killed = Some((*attempts, reason.clone()));
                break;
            }
        }
    }
    let (attempts, reason) = killed.expect("dead-lettered after max_attempts refusals");
    assert_eq!(attempts, 3);
    assert!(
        reason.starts_with("exhausted: 3 attempts") && reason.contains(REFUSED),
        "{reason}"
    );
    assert!(
        s.on_refused(&dev(), Seq(1), t).is_empty(),
        "gone: no more counting"
    );
}

fn refills(actions: &[Action]) -> Vec<(u64, usize)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Refill { after, limit, .. } => Some((after.0, *limit)),
            _ => None,
        })
        .collect()
}

#[test]
fn one_refill_is_out_at_a_time_and_a_short_one_means_all_is_in_memory() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_backlog(dev());
    assert_eq!(refills(&s.poll(t0)), vec![(0, 4)]);
    s.on_backlog(dev());
    assert!(refills(&s.poll(t0)).is_empty(), "a read is out already");
    // Two of four asked for: nothing more waits, except what the second
    // backlog notice said might.
    s.on_loaded(&dev(), vec![msg(1), msg(2)], 4, t0, 0);
    assert_eq!(refills(&s.poll(t0)), vec![(2, 2)]);
    s.on_loaded(&dev(), vec![], 2, t0, 0);
    assert!(refills(&s.poll(t0)).is_empty());
    // All in memory again: the next message goes straight in.
    s.on_stored(msg(3), None, t0, 0);
    s.on_link_up(1);
    assert_eq!(published(&s.poll(t0)), vec![1, 2]);
}

#[test]
fn a_failed_refill_is_read_again() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_backlog(dev());
    assert_eq!(refills(&s.poll(t0)), vec![(0, 4)]);
    s.on_store_failed(&dev());
    assert_eq!(refills(&s.poll(t0)), vec![(0, 4)]);
}

#[test]
fn a_device_with_nothing_left_is_forgotten() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), None, t0, 0);
    assert_eq!(published(&s.poll(t0)), vec![1]);
    s.on_ack(&dev(), &id(1), Verdict::Ok, t0);
    s.poll(t0);
    assert_eq!(s.in_memory(), 0);
    assert!(s.devices.is_empty());
}

#[test]
fn a_replayed_message_behind_the_loaded_seqs_is_sent_again_and_only_once() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), None, t0, 0);
    s.on_stored(msg(2), None, t0, 0);
    assert_eq!(published(&s.poll(t0)), vec![1, 2]);
    let acts = s.on_ack(
        &dev(),
        &id(1),
        Verdict::Nack {
            reason: "no".into(),
            retry: false,
        },
        t0,
    );
    assert!(matches!(&acts[..], [Action::Kill { .. }]), "{acts:?}");
    s.on_ack(&dev(), &id(2), Verdict::Ok, t0);
    s.poll(t0);
    // The operator replays seq 1: no refill reads seqs already loaded.
    s.on_replayed(msg(1), t0, 0);
    s.on_replayed(msg(1), t0, 0);
    assert_eq!(published(&s.poll(t0)), vec![1]);
    assert!(published(&s.poll(t0)).is_empty());
}

#[test]
fn a_replayed_message_past_a_backlog_in_the_store_is_left_to_the_refill() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_backlog(dev());
    s.on_replayed(msg(9), t0, 0);
    assert_eq!(s.in_memory(), 0);
    s.on_link_up(1);
    let acts = s.poll(t0);
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Refill { after: Seq(0), .. })),
        "{acts:?}"
    );
}

mod backend;
mod forgotten;
mod settings;
mod sparkplug;
mod stages;
