//! Settings changed while running (`systemctl reload`).

use super::*;

#[test]
fn new_settings_take_effect_for_what_is_sent_next() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    for i in 1..=3 {
        s.on_stored(msg(i), None, t0, 0);
    }
    assert_eq!(published(&s.poll(t0)), vec![1, 2], "two in flight at most");
    assert_eq!(s.next_deadline(), Some(t0 + Duration::from_millis(1000)));
    s.set_config(SchedulerConfig {
        max_inflight: 3,
        ack_timeout: Duration::from_millis(5000),
        ..cfg()
    });
    let t1 = t0 + Duration::from_millis(10);
    assert_eq!(published(&s.poll(t1)), vec![3], "room for a third now");
    assert_eq!(
        s.next_deadline(),
        Some(t0 + Duration::from_millis(1000)),
        "those sent before keep their deadline"
    );
    let acts = s.on_ack(&dev(), &id(1), Verdict::Ok, t1);
    assert!(matches!(&acts[..], [Action::Deliver { .. }]));
    let acts = s.on_ack(&dev(), &id(2), Verdict::Ok, t1);
    assert!(matches!(&acts[..], [Action::Deliver { .. }]));
    assert_eq!(
        s.next_deadline(),
        Some(t1 + Duration::from_millis(5000)),
        "the third waits the new ack timeout"
    );
}
