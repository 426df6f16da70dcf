//! Ack timeouts and the backend's presence (see `scheduler::backend`).

use super::*;

#[test]
fn ack_timeouts_with_no_sign_of_the_backend_wait_uncounted_and_resend_with_backoff() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), None, t0, 0);
    assert_eq!(published(&s.poll(t0)), vec![1]);
    // Far more timeouts than max_attempts (3): none counts.
    let mut t = t0;
    let mut delays = Vec::new();
    for _ in 0..10 {
        t += Duration::from_millis(1000);
        assert!(s.on_tick(t).is_empty(), "nothing counted, nothing killed");
        assert_eq!(
            s.backend_silent_since(),
            Some(t0 + Duration::from_millis(1000))
        );
        assert!(s.poll(t).is_empty(), "waiting");
        let next = s.next_deadline().expect("a resend is due");
        delays.push((next - t).as_millis());
        t = next;
        assert!(s.on_tick(t).is_empty());
        assert_eq!(published(&s.poll(t)), vec![1], "sent again");
    }
    // The retry backoff, capped at retry.max (400 ms).
    assert_eq!(delays[..4], [100, 200, 400, 400]);
    assert_eq!(s.in_memory(), 1);
    // The backend comes back: the message is acked on its first attempt.
    s.on_backend_heard(t);
    assert_eq!(s.backend_silent_since(), None);
    let acts = s.on_ack(&dev(), &id(1), Verdict::Ok, t);
    assert!(
        matches!(&acts[..], [Action::Deliver { attempts: 1, .. }]),
        "{acts:?}"
    );
}

#[test]
fn the_backend_heard_from_again_releases_what_waited_at_once() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), None, t0, 0);
    s.poll(t0);
    let t1 = t0 + Duration::from_millis(1000);
    assert!(s.on_tick(t1).is_empty());
    assert!(s.poll(t1).is_empty(), "waiting out its backoff");
    s.on_backend_heard(t1 + Duration::from_millis(10));
    assert_eq!(
        published(&s.poll(t1 + Duration::from_millis(10))),
        vec![1],
        "sent again without waiting for the backoff"
    );
}

/// One message the backend never acks, alone in flight each time
/// (`max_inflight` 1), while it acks the device's others, which keep
/// coming.
#[test]
fn a_message_the_backend_ignores_while_it_acks_others_is_counted_and_dies() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig {
        max_inflight: 1,
        window: 1000,
        ..cfg()
    });
    s.on_link_up(1);
    for i in 1..=4 {
        s.on_stored(msg(i), None, t0, 0);
    }
    let mut t = t0;
    let mut killed = None;
    let mut next_ok = 2;
    let mut stored = 4;
    for _ in 0..100 {
        let sent = published(&s.poll(t));
        for &m in &sent {
            if m != 1 {
                s.on_backend_heard(t);
                let acts = s.on_ack(&dev(), &id(m), Verdict::Ok, t);
                assert!(matches!(&acts[..], [Action::Deliver { .. }]));
                assert_eq!(m, next_ok, "the rest flow in order");
                next_ok += 1;
            }
        }
        if !sent.is_empty() {
            // The loop's next turn, at once.
            continue;
        }
        let Some(next) = s.next_deadline() else {
            break;
        };
        t = next;
        for a in s.on_tick(t) {
            if let Action::Kill {
                msg_id,
                attempts,
                reason,
                ..
            } = a
            {
                killed = Some((msg_id, attempts, reason));
            }
        }
        if killed.is_some() {
            break;
        }
        stored += 1;
        s.on_stored(msg(stored), None, t, 0);
    }
    assert!(next_ok > 5, "the others delivered meanwhile: {next_ok}");
    let (msg_id, attempts, reason) = killed.expect("message 1 dead-lettered");
    assert_eq!((msg_id, attempts), (id(1), 3));
    assert!(reason.starts_with("exhausted"), "{reason}");
}

/// Without this, each message's own jittered backoff would send them to a
/// returning backend in any order.
#[test]
fn a_devices_messages_waiting_on_the_backend_go_again_together_in_seq_order() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig {
        max_inflight: 4,
        retry: RetryConfig {
            jitter: 1.0,
            ..cfg().retry
        },
        ..cfg()
    });
    s.on_link_up(1);
    for i in 1..=4 {
        s.on_stored(msg(i), None, t0, 0);
    }
    assert_eq!(published(&s.poll(t0)), vec![1, 2, 3, 4]);
    for _ in 0..20 {
        let t = s.next_deadline().expect("a timer");
        assert!(s.on_tick(t).is_empty());
        let sent = published(&s.poll(t));
        if !sent.is_empty() {
            assert_eq!(sent, vec![1, 2, 3, 4], "all again, in order");
        }
    }
    assert_eq!(s.in_memory(), 4);
}
