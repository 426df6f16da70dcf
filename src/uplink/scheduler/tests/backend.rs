//! Ack timeouts and the backend's presence (see `scheduler::backend`).

use super::*;

/// A scheduler with `max_inflight` and room for everything, its link up,
/// holding the device's messages `1..=stored`, stored at `t0`.
fn holding(max_inflight: usize, stored: u64, t0: Instant) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig {
        max_inflight,
        window: 1000,
        ..cfg()
    });
    s.on_link_up(1);
    for i in 1..=stored {
        s.on_stored(msg(i), None, t0, 0);
    }
    s
}

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
    let mut s = holding(1, 4, t0);
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
/// returning backend in any order; and sending them all again each round
/// would give a backend that subscribes mid-round a device's later
/// messages first.
#[test]
fn while_the_backend_is_away_a_device_sends_only_its_oldest_message_again() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig {
        max_inflight: 4,
        window: 1000,
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
    assert_eq!(
        published(&s.poll(t0)),
        vec![1, 2, 3, 4],
        "the backend is taken to be there until a timeout finds it silent"
    );
    let mut rounds = Vec::new();
    for n in 5..=40 {
        let t = s.next_deadline().expect("a timer");
        assert!(s.on_tick(t).is_empty(), "nothing counted");
        // Stored meanwhile: it waits behind the probe too.
        s.on_stored(msg(n), None, t, 0);
        let sent = published(&s.poll(t));
        if !sent.is_empty() {
            rounds.push(sent);
        }
    }
    assert!(rounds.len() >= 10, "{rounds:?}");
    for (k, sent) in rounds.iter().enumerate() {
        // Every max_attempts-th (3rd) silent round carries the next one.
        let want = if (k + 1) % 3 == 0 {
            vec![1, 2]
        } else {
            vec![1]
        };
        assert_eq!(sent, &want, "round {}: {rounds:?}", k + 1);
    }
}

#[test]
fn the_probes_ack_sends_the_devices_window_in_seq_order() {
    let t0 = Instant::now();
    let mut s = holding(3, 1, t0);
    s.poll(t0);
    let t1 = t0 + Duration::from_millis(1000);
    s.on_tick(t1);
    for i in 2..=5 {
        s.on_stored(msg(i), None, t1, 0);
    }
    let t2 = s.next_deadline().expect("a resend");
    s.on_tick(t2);
    assert_eq!(published(&s.poll(t2)), vec![1], "the probe alone");
    // The backend subscribed in time for it and acks it.
    s.on_backend_heard(t2);
    assert!(published(&s.poll(t2)).is_empty(), "its probe is out");
    let acts = s.on_ack(&dev(), &id(1), Verdict::Ok, t2);
    assert!(matches!(&acts[..], [Action::Deliver { attempts: 1, .. }]));
    assert_eq!(
        published(&s.poll(t2)),
        vec![2, 3, 4],
        "the window, in order"
    );
}

/// Another device's ack shows the backend there, but this device's probe
/// may have gone out before it subscribed: its window waits for that
/// probe, which (lost) is counted once and sent again, alone.
#[test]
fn a_backend_heard_while_a_devices_probe_is_out_holds_that_devices_window_for_it() {
    let t0 = Instant::now();
    let mut s = holding(3, 3, t0);
    s.poll(t0);
    let t1 = t0 + Duration::from_millis(1000);
    s.on_tick(t1);
    let t2 = s.next_deadline().expect("a resend");
    s.on_tick(t2);
    assert_eq!(published(&s.poll(t2)), vec![1]);
    let t3 = t2 + Duration::from_millis(10);
    acked_one_sent_after(&mut s, t3);
    assert!(published(&s.poll(t3)).is_empty(), "held behind its probe");
    let t4 = t2 + Duration::from_millis(1000);
    let acts = s.on_tick(t4);
    assert!(
        matches!(&acts[..], [Action::RecordAttempt { attempts: 1, .. }]),
        "the backend was there and did not get it: counted, as any loss: {acts:?}"
    );
    assert!(
        published(&s.poll(t4)).is_empty(),
        "backing off, still alone"
    );
    let t5 = s.next_deadline().expect("its backoff");
    s.on_tick(t5);
    assert_eq!(published(&s.poll(t5)), vec![1], "again, alone");
    s.on_ack(&dev(), &id(1), Verdict::Ok, t5);
    assert_eq!(published(&s.poll(t5)), vec![2, 3]);
}

#[test]
fn a_backend_heard_while_nothing_of_a_device_is_out_gets_its_window_at_once_oldest_first() {
    let t0 = Instant::now();
    let mut s = holding(3, 3, t0);
    s.poll(t0);
    let t1 = t0 + Duration::from_millis(1000);
    s.on_tick(t1);
    assert!(s.poll(t1).is_empty(), "waiting out the backoff");
    s.on_backend_heard(t1 + Duration::from_millis(10));
    assert_eq!(published(&s.poll(t1)), vec![1, 2, 3]);
}

/// A backend that subscribes before any one of the scheduler's turns
/// (each turn's publishes leave together, within microseconds) and acks
/// what it gets at once: it gets each device's messages from its oldest
/// on, each once, and they are delivered in seq order.
#[test]
fn a_backend_that_subscribes_at_any_turn_gets_each_devices_messages_in_seq_order_once() {
    let devices = ["d1", "d2", "d3"].map(|d| DeviceId::new(d).unwrap());
    for subscribe_at in 0..60 {
        let t0 = Instant::now();
        let mut s = Scheduler::new(SchedulerConfig {
            max_inflight: 4,
            window: 1000,
            retry: RetryConfig {
                jitter: 0.5,
                max_attempts: 3,
                ..cfg().retry
            },
            ..cfg()
        });
        s.on_link_up(1);
        for (k, d) in devices.iter().enumerate() {
            for seq in 1..=6 {
                s.on_stored(msg_of(d, seq + k as u64), None, t0, 0);
            }
        }
        let mut t = t0;
        let mut turn = 0;
        let mut arrived: Vec<(DeviceId, u64)> = Vec::new();
        let mut delivered: Vec<(DeviceId, u64)> = Vec::new();
        for _ in 0..1000 {
            let mut acts = s.poll(t);
            turn += 1;
            let subscribed = turn > subscribe_at;
            let mut heard = Vec::new();
            for a in &acts {
                if let Action::Publish { msg: m, .. } = a {
                    if subscribed {
                        arrived.push((m.device.clone(), m.seq.0));
                        heard.push(m.clone());
                    }
                }
            }
            acts.clear();
            let acked = !heard.is_empty();
            for m in heard {
                s.on_backend_heard(t);
                acts.extend(s.on_ack(&m.device, &m.msg_id, Verdict::Ok, t));
            }
            for a in acts {
                match a {
                    Action::Deliver { device, msg_id, .. } => {
                        let seq = msg_id.as_str()[1..].parse().unwrap();
                        delivered.push((device, seq));
                    }
                    other => panic!("subscribe at turn {subscribe_at}: {other:?}"),
                }
            }
            if s.in_memory() == 0 {
                break;
            }
            if acked {
                // Its acks may let more go now.
                continue;
            }
            t = s.next_deadline().expect("a timer");
            for a in s.on_tick(t) {
                assert!(
                    !matches!(a, Action::Kill { .. }),
                    "subscribe at turn {subscribe_at}: {a:?}"
                );
            }
        }
        assert_eq!(
            s.in_memory(),
            0,
            "subscribe at turn {subscribe_at}: all delivered"
        );
        for d in &devices {
            let mine = |v: &[(DeviceId, u64)]| -> Vec<u64> {
                v.iter().filter(|(x, _)| x == d).map(|(_, q)| *q).collect()
            };
            let got = mine(&arrived);
            assert!(
                got.windows(2).all(|w| w[0] < w[1]),
                "subscribe at turn {subscribe_at}: {d} arrived once each, in order: {got:?}"
            );
            let done = mine(&delivered);
            assert_eq!(
                done.len(),
                6,
                "subscribe at turn {subscribe_at}: {d}: {done:?}"
            );
            assert!(done.windows(2).all(|w| w[0] < w[1]), "{d}: {done:?}");
        }
    }
}

/// A backend that is there but behind: it works through what was sent
/// before, in order, slower than the ack timeout. Its acks of older
/// messages are no sign that it skipped the newer ones: their timeouts
/// are not counted (more than `max_attempts` of them), they are sent again
/// with the retry backoff, and each is delivered on its first counted
/// attempt once the backend reaches it. The backend is not taken for away.
#[test]
fn a_backend_behind_acking_older_sends_counts_no_timeout_of_newer_ones() {
    let t0 = Instant::now();
    let mut s = holding(2, 2, t0);
    assert_eq!(published(&s.poll(t0)), vec![1, 2]);
    let mut t = t0;
    let mut delays = Vec::new();
    for _ in 0..6 {
        // Heard all along: a verdict on a message sent before 1 and 2
        // (another device's, at t0 - 1 s).
        s.on_backend_heard(t);
        s.backend.answered(t0 - Duration::from_secs(1));
        t += Duration::from_millis(1000);
        assert!(s.on_tick(t).is_empty(), "nothing counted, nothing killed");
        assert_eq!(s.take_behind(), 2, "both timeouts found it behind");
        assert_eq!(s.backend_silent_since(), None, "there, not away");
        assert!(s.poll(t).is_empty(), "backing off");
        let next = s.next_deadline().expect("a resend is due");
        delays.push((next - t).as_millis());
        t = next;
        s.on_tick(t);
        assert_eq!(published(&s.poll(t)), vec![1, 2], "both again, in order");
    }
    assert_eq!(delays[..4], [100, 200, 400, 400]);
    // It reaches them: the first copies' acks.
    let acts = s.on_ack(&dev(), &id(1), Verdict::Ok, t);
    assert!(
        matches!(&acts[..], [Action::Deliver { attempts: 1, .. }]),
        "{acts:?}"
    );
    let acts = s.on_ack(&dev(), &id(2), Verdict::Ok, t);
    assert!(
        matches!(&acts[..], [Action::Deliver { attempts: 1, .. }]),
        "{acts:?}"
    );
}

/// Behind, until it acks something sent after the message: then it passed
/// it by, and the message's next timeout counts.
#[test]
fn a_backend_that_acks_what_came_after_a_message_and_not_it_has_its_timeout_counted() {
    let t0 = Instant::now();
    let mut s = holding(1, 2, t0);
    assert_eq!(published(&s.poll(t0)), vec![1]);
    s.on_backend_heard(t0);
    s.backend.answered(t0 - Duration::from_secs(1));
    let t1 = t0 + Duration::from_millis(1000);
    assert!(s.on_tick(t1).is_empty(), "behind: uncounted");
    let t2 = s.next_deadline().expect("a resend");
    s.on_tick(t2);
    assert_eq!(published(&s.poll(t2)), vec![1]);
    // A verdict on a message sent after 1's first send (another device's).
    acked_one_sent_after(&mut s, t0 + Duration::from_millis(10));
    assert_eq!(s.take_behind(), 1, "the first timeout found it behind");
    let acts = s.on_tick(t2 + Duration::from_millis(1000));
    assert!(
        matches!(&acts[..], [Action::RecordAttempt { attempts: 1, .. }]),
        "{acts:?}"
    );
    assert_eq!(s.take_behind(), 0, "a counted timeout is not behind");
}
