use super::*;

async fn pass(d: Duration) {
    tokio::time::advance(d).await;
}

/// One message arriving now and handed on at once; whether it is replayed.
fn message(b: &mut Backlog) -> bool {
    let (replayed, _) = b.on_message(Instant::now());
    b.waiting(Instant::now());
    replayed
}

#[tokio::test(start_paused = true)]
async fn what_comes_before_the_subscriptions_are_acknowledged_is_replayed() {
    let mut b = Backlog::new();
    assert!(
        message(&mut b),
        "only a kept session delivers before SUBACK"
    );
    assert!(message(&mut b));
    assert_eq!(b.on_up(true, Instant::now()), None, "the burst goes on");
    assert!(message(&mut b));
}

#[tokio::test(start_paused = true)]
async fn a_new_session_has_no_backlog() {
    let mut b = Backlog::new();
    assert_eq!(b.on_up(false, Instant::now()), None);
    assert!(!message(&mut b), "live from the first message");
    assert_eq!(b.deadline(), None);
}

#[tokio::test(start_paused = true)]
async fn on_a_kept_session_the_burst_lasts_until_a_quiet_second() {
    let mut b = Backlog::new();
    b.on_up(true, Instant::now());
    for _ in 0..1000 {
        pass(Duration::from_millis(5)).await;
        assert!(message(&mut b));
    }
    pass(QUIET - Duration::from_millis(1)).await;
    assert!(
        message(&mut b),
        "a pause shorter than QUIET is still the backlog"
    );
    pass(QUIET).await;
    let (replayed, taken) = b.on_message(Instant::now());
    assert!(!replayed, "after a quiet second, what comes is live");
    let taken = taken.expect("the burst ended");
    assert_eq!((taken.messages, taken.end), (1001, End::Drained));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_a_drained_burst_without_a_message() {
    let mut b = Backlog::new();
    b.on_up(true, Instant::now());
    message(&mut b);
    let at = b.deadline().expect("a burst is under way");
    assert_eq!(at, Instant::now() + QUIET);
    assert_eq!(b.expire(at - Duration::from_millis(1)), None);
    let taken = b.expire(at).expect("over");
    assert_eq!((taken.messages, taken.end), (1, End::Drained));
    assert_eq!(b.deadline(), None);
    assert!(!message(&mut b));
}

#[tokio::test(start_paused = true)]
async fn time_handing_a_message_on_is_not_a_quiet_broker() {
    let mut b = Backlog::new();
    b.on_up(true, Instant::now());
    b.on_message(Instant::now());
    // The pipeline is full: handing this one on takes long.
    pass(QUIET * 5).await;
    assert_eq!(b.expire(Instant::now()), None, "ferry was not waiting");
    b.waiting(Instant::now());
    assert!(
        message(&mut b),
        "the next one, there at once, is the backlog"
    );
}

#[tokio::test(start_paused = true)]
async fn a_flood_that_never_pauses_is_let_through_for_max_burst_at_most() {
    let mut b = Backlog::new();
    b.on_up(true, Instant::now());
    let start = Instant::now();
    let mut replayed = 0u64;
    let mut ended = None;
    while Instant::now() < start + MAX_BURST * 2 {
        pass(Duration::from_millis(10)).await;
        let (r, taken) = b.on_message(Instant::now());
        b.waiting(Instant::now());
        replayed += r as u64;
        ended = ended.or(taken);
    }
    let ended = ended.expect("the burst ended");
    assert_eq!(ended.end, End::TimeUp);
    assert_eq!(ended.lasted, MAX_BURST);
    assert_eq!(replayed, ended.messages);
    assert!(replayed <= MAX_BURST.as_millis() as u64 / 10, "{replayed}");
    assert!(!message(&mut b), "and live from then on");
}

#[tokio::test(start_paused = true)]
async fn messages_before_a_subscription_never_acknowledged_are_bounded_too() {
    let mut b = Backlog::new();
    assert!(message(&mut b));
    assert_eq!(
        b.deadline(),
        Some(Instant::now() + MAX_BURST),
        "no QUIET before Up"
    );
    pass(MAX_BURST).await;
    let (replayed, taken) = b.on_message(Instant::now());
    assert!(!replayed);
    assert_eq!(taken.map(|t| t.end), Some(End::TimeUp));
}

#[tokio::test(start_paused = true)]
async fn a_burst_begins_only_with_a_new_connection() {
    let mut b = Backlog::new();
    b.on_up(true, Instant::now());
    message(&mut b);
    pass(QUIET).await;
    assert!(b.expire(Instant::now()).is_some());
    pass(Duration::from_secs(3600)).await;
    assert!(!message(&mut b), "live until the link drops");
    assert_eq!(b.on_down(Instant::now()), None, "no burst was under way");
    assert!(message(&mut b), "the next connection's first message");
    let taken = b.on_down(Instant::now()).expect("cut short");
    assert_eq!((taken.messages, taken.end), (1, End::LinkLost));
    assert_eq!(b.on_up(false, Instant::now()), None);
    assert!(!message(&mut b), "a session the broker lost has no backlog");
}
