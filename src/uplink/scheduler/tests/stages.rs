//! The instants the actions carry for the uplink stage histograms
//! (`crate::metrics::Stage`).

use super::*;

#[test]
fn only_the_first_publish_carries_the_commit_time_and_an_ack_its_send_time() {
    let t0 = Instant::now();
    let committed = t0 - Duration::from_millis(3);
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    s.on_stored(msg(1), Some(committed), t0, 0);
    let first = s.poll(t0);
    assert!(
        matches!(&first[..], [Action::Publish { committed: Some(c), .. }] if *c == committed),
        "{first:?}"
    );
    // The link drops and comes back: the resend is no first publish.
    s.on_link_up(2);
    let t1 = t0 + Duration::from_millis(5);
    let again = s.poll(t1);
    assert!(
        matches!(
            &again[..],
            [Action::Publish {
                committed: None,
                ..
            }]
        ),
        "{again:?}"
    );
    let acts = s.on_ack(&dev(), &id(1), Verdict::Ok, t1);
    assert!(
        matches!(&acts[..], [Action::Deliver { sent: Some(at), .. }] if *at == t1),
        "{acts:?}"
    );
}
