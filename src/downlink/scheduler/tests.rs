use super::*;

fn cfg() -> DownConfig {
    DownConfig {
        batch_size: 3,
        confirm_timeout: Duration::from_millis(1000),
    }
}

fn dev() -> DeviceId {
    DeviceId::new("panel-1").unwrap()
}

fn cursors(head: u64, delivered: u64) -> Cursors {
    Cursors {
        head: Seq(head),
        delivered_upto: Seq(delivered),
        read_upto: Seq(0),
    }
}

fn read_of(actions: &[DownAction]) -> Option<(u64, usize, u64)> {
    actions.iter().find_map(|a| match a {
        DownAction::Read {
            after, limit, gen, ..
        } => Some((after.0, *limit, *gen)),
        _ => None,
    })
}

/// Brings a device online with `head` queued and `delivered` confirmed.
fn online(s: &mut DownScheduler, head: u64, delivered: u64) -> Vec<DownAction> {
    assert_eq!(s.on_online(&dev()), vec![DownAction::LoadCursors(dev())]);
    s.on_cursors(&dev(), cursors(head, delivered))
}

#[test]
fn an_offline_device_gets_nothing_until_it_comes_online() {
    let mut s = DownScheduler::new(cfg());
    assert!(s.on_queued(&dev(), Seq(1)).is_empty());
    let acts = online(&mut s, 5, 0);
    assert_eq!(read_of(&acts).map(|r| (r.0, r.1)), Some((0, 3)));
}

#[test]
fn one_batch_is_unconfirmed_at_a_time_and_a_confirm_releases_the_next() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 5, 0)).unwrap();
    assert_eq!(
        s.on_read(&dev(), gen, Some((Seq(1), Seq(3), 3)), Seq(5), false, t0),
        Verdict::Send { more: true }
    );
    assert!(
        s.on_queued(&dev(), Seq(6)).is_empty(),
        "a batch is out: wait for its confirm"
    );
    let (released, acts) = s.on_cursor_moved(&dev(), cursors(6, 3), Some(Seq(3)));
    assert_eq!(released.map(|o| (o.first.0, o.last.0)), Some((1, 3)));
    assert_eq!(read_of(&acts).map(|r| r.0), Some(3));
}

#[test]
fn a_partial_confirm_restarts_after_the_new_cursor() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 5, 0)).unwrap();
    s.on_read(&dev(), gen, Some((Seq(1), Seq(3), 3)), Seq(5), false, t0);
    let (released, acts) = s.on_cursor_moved(&dev(), cursors(5, 2), Some(Seq(2)));
    assert!(released.is_some());
    assert_eq!(read_of(&acts).map(|r| r.0), Some(2));
    let (_, acts) = s.on_cursor_moved(&dev(), cursors(5, 1), Some(Seq(1)));
    assert!(acts.is_empty(), "a stale confirm changes nothing");
}

#[test]
fn no_confirm_resends_from_the_cursor_with_a_growing_timeout() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 2, 0)).unwrap();
    s.on_read(&dev(), gen, Some((Seq(1), Seq(2), 2)), Seq(2), false, t0);
    assert!(s.on_tick(t0 + Duration::from_millis(999)).is_empty());
    let t1 = t0 + Duration::from_millis(1000);
    let resent = s.on_tick(t1);
    assert_eq!(resent.len(), 1);
    let (_, _, gen) = read_of(&resent[0].2).unwrap();
    s.on_read(&dev(), gen, Some((Seq(1), Seq(2), 2)), Seq(2), false, t1);
    assert!(
        s.on_tick(t1 + Duration::from_millis(1999)).is_empty(),
        "second wait doubles"
    );
    assert_eq!(s.on_tick(t1 + Duration::from_millis(2000)).len(), 1);
}

#[test]
fn going_offline_stops_resends_and_drops_reads_in_flight() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 2, 0)).unwrap();
    s.on_offline(&dev());
    assert_eq!(
        s.on_read(&dev(), gen, Some((Seq(1), Seq(2), 2)), Seq(2), false, t0),
        Verdict::Drop
    );
    assert!(s.on_tick(t0 + Duration::from_secs(60)).is_empty());
    assert_eq!(s.tracked(), 0, "an offline device is forgotten");
    let acts = online(&mut s, 2, 0);
    let (after, _, new_gen) = read_of(&acts).unwrap();
    assert_eq!(after, 0, "back online: from the cursor again");
    assert_ne!(new_gen, gen, "generations are never reused");
    assert_eq!(
        s.on_read(&dev(), gen, Some((Seq(1), Seq(2), 2)), Seq(2), false, t0),
        Verdict::Drop,
        "a read from before is still dropped"
    );
}

#[test]
fn a_pull_replaces_the_outstanding_batch_and_is_always_answered() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 5, 0)).unwrap();
    s.on_read(&dev(), gen, Some((Seq(1), Seq(3), 3)), Seq(5), false, t0);
    let acts = s.on_pull(&dev(), Some(Seq(4)), Some(50), t0);
    let (after, limit, gen) = read_of(&acts).unwrap();
    assert_eq!((after, limit), (4, 3), "limit capped at the batch size");
    assert!(
        s.on_tick(t0 + Duration::from_secs(5)).is_empty(),
        "the replaced batch's timer is void"
    );
    assert_eq!(
        s.on_read(&dev(), gen, None, Seq(5), true, t0),
        Verdict::Send { more: false }
    );
}

#[test]
fn a_pull_before_the_cursors_are_known_waits_for_them() {
    let mut s = DownScheduler::new(cfg());
    assert_eq!(
        s.on_pull(&dev(), None, None, Instant::now()),
        vec![DownAction::LoadCursors(dev())]
    );
    let acts = s.on_cursors(&dev(), cursors(0, 0));
    assert!(matches!(
        &acts[..],
        [DownAction::Read {
            reply_empty: true,
            ..
        }]
    ));
}

#[test]
fn a_read_overtaken_by_a_confirm_is_dropped() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 5, 0)).unwrap();
    let (_, acts) = s.on_cursor_moved(&dev(), cursors(5, 2), Some(Seq(2)));
    assert_eq!(
        s.on_read(&dev(), gen, Some((Seq(1), Seq(3), 3)), Seq(5), false, t0),
        Verdict::Drop
    );
    assert_eq!(read_of(&acts).map(|r| r.0), Some(2));
}

#[test]
fn a_pull_right_after_coming_online_joins_the_read_in_flight() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 2, 0)).unwrap();
    assert!(
        s.on_pull(&dev(), None, None, t0).is_empty(),
        "no second read"
    );
    assert_eq!(
        s.on_read(&dev(), gen, Some((Seq(1), Seq(2), 2)), Seq(2), false, t0),
        Verdict::Send { more: false }
    );
}

#[test]
fn a_joined_pull_is_answered_even_when_empty() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 2, 0)).unwrap();
    s.on_pull(&dev(), Some(Seq(0)), None, t0);
    assert_eq!(
        s.on_read(&dev(), gen, None, Seq(2), false, t0),
        Verdict::Send { more: false }
    );
}

#[test]
fn a_pull_just_after_the_batch_went_out_is_answered_by_it() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 2, 0)).unwrap();
    s.on_read(&dev(), gen, Some((Seq(1), Seq(2), 2)), Seq(2), false, t0);
    assert!(s
        .on_pull(&dev(), None, None, t0 + Duration::from_millis(5))
        .is_empty());
    let acts = s.on_pull(&dev(), None, None, t0 + Duration::from_secs(2));
    assert_eq!(
        read_of(&acts).map(|r| r.0),
        Some(0),
        "a later pull resends from the cursor"
    );
}

#[test]
fn subscribing_again_restarts_from_the_cursor() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    // Taken as online (connect grace) and sent before the subscription...
    let (_, _, gen) = read_of(&online(&mut s, 2, 0)).unwrap();
    s.on_read(&dev(), gen, Some((Seq(1), Seq(2), 2)), Seq(2), false, t0);
    // ...so the subscription resends it.
    let t1 = t0 + Duration::from_millis(10);
    let acts = s.on_subscribed(&dev(), t1);
    let (after, _, gen) = read_of(&acts).unwrap();
    assert_eq!(after, 0);
    s.on_read(&dev(), gen, Some((Seq(1), Seq(2), 2)), Seq(2), false, t1);
    // A pull long after, on the same connection, is answered by that batch.
    assert!(s
        .on_pull(&dev(), None, None, t1 + Duration::from_secs(5))
        .is_empty());
}

#[test]
fn a_confirmed_batch_has_no_deadline_left() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 3, 0)).unwrap();
    s.on_read(&dev(), gen, Some((Seq(1), Seq(3), 3)), Seq(3), false, t0);
    assert!(s.next_deadline().is_some());
    let (released, acts) = s.on_cursor_moved(&dev(), cursors(3, 3), Some(Seq(3)));
    assert!(released.is_some());
    assert!(acts.is_empty(), "caught up: idle");
    assert_eq!(s.next_deadline(), None);
    assert!(s.on_tick(t0 + Duration::from_secs(60)).is_empty());
}

#[test]
fn cursors_arriving_while_online_only_move_forward() {
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 5, 2)).unwrap();
    // A late answer of an older load: nothing goes back, the read stands.
    assert!(s.on_cursors(&dev(), cursors(1, 0)).is_empty());
    assert_eq!(
        s.on_read(
            &dev(),
            gen,
            Some((Seq(3), Seq(5), 3)),
            Seq(5),
            false,
            Instant::now()
        ),
        Verdict::Send { more: false }
    );
}

#[test]
fn a_second_online_while_loading_asks_for_the_cursors_once() {
    let mut s = DownScheduler::new(cfg());
    assert_eq!(s.on_online(&dev()), vec![DownAction::LoadCursors(dev())]);
    assert!(s.on_online(&dev()).is_empty());
    assert!(s.on_subscribed(&dev(), Instant::now()).is_empty());
    assert!(s.on_queued(&dev(), Seq(4)).is_empty(), "no cursors yet");
    let acts = s.on_cursors(&dev(), cursors(4, 0));
    assert_eq!(read_of(&acts).map(|r| r.0), Some(0));
    assert_eq!(s.tracked(), 1);
    s.on_offline(&dev());
    assert_eq!(s.tracked(), 0);
}

/// A caught-up device (`head` = `delivered`) that pulls `after: 0` and is
/// sent the replay `1..=head`, unconfirmed, at `Instant::now()`.
fn replayed(s: &mut DownScheduler, head: u64) {
    assert!(read_of(&online(s, head, head)).is_none(), "caught up");
    let (after, _, gen) = read_of(&s.on_pull(&dev(), Some(Seq(0)), None, Instant::now())).unwrap();
    assert_eq!(after, 0);
    let span = Some((Seq(1), Seq(head), head as usize));
    assert_eq!(
        s.on_read(&dev(), gen, span, Seq(head), true, Instant::now()),
        Verdict::Send { more: false }
    );
}

#[tokio::test(start_paused = true)]
async fn a_confirm_of_a_batch_replayed_from_behind_the_cursor_releases_it_at_once() {
    let mut s = DownScheduler::new(cfg());
    replayed(&mut s, 3);
    assert!(
        s.next_deadline().is_some(),
        "the replay waits for its confirm"
    );
    tokio::time::advance(Duration::from_millis(20)).await;
    let (released, acts) = s.on_cursor_moved(&dev(), cursors(3, 3), Some(Seq(3)));
    assert_eq!(
        released.map(|o| (o.first.0, o.last.0)),
        Some((1, 3)),
        "the cursor did not move, but the confirm covers the batch"
    );
    assert!(acts.is_empty(), "caught up: nothing more to read");
    assert_eq!(s.next_deadline(), None, "no confirm timeout left");
    let acts = s.on_queued(&dev(), Seq(4));
    assert_eq!(
        read_of(&acts).map(|r| r.0),
        Some(3),
        "a new downlink goes out at once, after the cursor"
    );
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(
        s.on_tick(Instant::now()).is_empty(),
        "nothing is resent as unconfirmed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_partial_confirm_of_a_replay_releases_it_and_reads_from_the_cursor() {
    let mut s = DownScheduler::new(cfg());
    replayed(&mut s, 3);
    s.on_queued(&dev(), Seq(5));
    let (released, acts) = s.on_cursor_moved(&dev(), cursors(5, 3), Some(Seq(1)));
    assert!(released.is_some(), "seq 1 is in the replay");
    assert_eq!(
        read_of(&acts).map(|r| r.0),
        Some(3),
        "what was confirmed before stays confirmed: the next batch starts after the cursor"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stale_confirm_below_the_outstanding_batch_releases_nothing() {
    let mut s = DownScheduler::new(cfg());
    let (_, _, gen) = read_of(&online(&mut s, 6, 3)).unwrap();
    s.on_read(
        &dev(),
        gen,
        Some((Seq(4), Seq(6), 3)),
        Seq(6),
        false,
        Instant::now(),
    );
    let (released, acts) = s.on_cursor_moved(&dev(), cursors(6, 3), Some(Seq(3)));
    assert_eq!(
        released, None,
        "a repeated confirm up to 3 says nothing of 4..6"
    );
    assert!(acts.is_empty());
    tokio::time::advance(cfg().confirm_timeout).await;
    assert_eq!(s.on_tick(Instant::now()).len(), 1, "4..6 is resent in time");
}

#[tokio::test(start_paused = true)]
async fn a_nack_that_leaves_the_cursor_releases_no_replay() {
    let mut s = DownScheduler::new(cfg());
    replayed(&mut s, 3);
    let (released, acts) = s.on_cursor_moved(&dev(), cursors(3, 3), None);
    assert_eq!(released, None, "a nack is not a confirm");
    assert!(acts.is_empty());
    assert!(s.next_deadline().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_pull_past_the_head_is_answered_empty_and_leaves_the_cursor_alone() {
    let mut s = DownScheduler::new(cfg());
    assert!(read_of(&online(&mut s, 3, 3)).is_none());
    for after in [1 << 63, u64::MAX] {
        let acts = s.on_pull(&dev(), Some(Seq(after)), None, Instant::now());
        let (from, _, gen) = read_of(&acts).unwrap();
        assert_eq!(from, after, "read after what the device said, no `+ 1`");
        assert_eq!(
            s.on_read(&dev(), gen, None, Seq(3), true, Instant::now()),
            Verdict::Send { more: false }
        );
        assert_eq!(
            s.next_deadline(),
            None,
            "an empty batch waits for no confirm"
        );
    }
    let acts = s.on_queued(&dev(), Seq(4));
    assert_eq!(
        read_of(&acts).map(|r| r.0),
        Some(3),
        "new messages go from the cursor"
    );
}

#[test]
fn a_plain_device_is_sent_one_at_a_time_and_never_resent_on_an_open_connection() {
    let t0 = Instant::now();
    let mut s = DownScheduler::new(cfg());
    assert_eq!(
        s.on_subscribed_plain(&dev(), t0),
        vec![DownAction::LoadCursors(dev())]
    );
    assert!(s.is_plain(&dev()));
    let (after, limit, gen) = read_of(&s.on_cursors(&dev(), cursors(5, 0))).unwrap();
    assert_eq!((after, limit), (0, 1), "one message, not a batch of 3");
    assert_eq!(
        s.on_read(&dev(), gen, Some((Seq(1), Seq(1), 1)), Seq(5), false, t0),
        Verdict::Send { more: true }
    );
    assert_eq!(
        s.next_deadline(),
        None,
        "its PUBACK is waited for, not timed"
    );
    assert!(s.on_tick(t0 + Duration::from_secs(3600)).is_empty());
    let (released, acts) = s.on_cursor_moved(&dev(), cursors(5, 1), Some(Seq(1)));
    assert_eq!(released.map(|o| o.first.0), Some(1));
    assert_eq!(
        read_of(&acts).map(|r| (r.0, r.1)),
        Some((1, 1)),
        "then the next"
    );
    // Subscribing to its inbox makes it an envelope device again.
    s.on_subscribed(&dev(), t0);
    assert!(!s.is_plain(&dev()));
}

#[test]
fn a_new_batch_size_holds_for_the_next_batch() {
    let mut s = DownScheduler::new(cfg());
    let acts = online(&mut s, 5, 0);
    assert_eq!(
        read_of(&acts).map(|r| r.1),
        Some(3),
        "the start's batch size"
    );
    s.set_config(DownConfig {
        batch_size: 1,
        confirm_timeout: Duration::from_millis(1000),
    });
    s.on_offline(&dev());
    let acts = online(&mut s, 5, 0);
    assert_eq!(read_of(&acts).map(|r| r.1), Some(1), "the new one");
}
