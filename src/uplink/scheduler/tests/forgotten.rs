//! A device forgotten with nothing left, and the store notices that come
//! after it.

use super::*;

#[test]
fn a_store_notice_that_comes_after_its_device_was_forgotten_sends_nothing_again() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(cfg());
    s.on_link_up(1);
    // A backlog: the refill reads seqs 1 and 2 before their notices come.
    s.on_backlog(dev());
    let refill = s.poll(t0);
    assert!(matches!(&refill[..], [Action::Refill { .. }]), "{refill:?}");
    s.on_loaded(&dev(), vec![msg(1), msg(2)], 4, t0, 0);
    assert_eq!(published(&s.poll(t0)), vec![1, 2]);
    s.on_ack(&dev(), &id(1), Verdict::Ok, t0);
    s.on_ack(&dev(), &id(2), Verdict::Ok, t0);
    s.poll(t0);
    assert!(s.devices.is_empty(), "forgotten with nothing left");
    // Their notices, late (they come through intake): nothing goes again.
    s.on_stored(msg(1), None, t0, 0);
    s.on_stored(msg(2), None, t0, 0);
    assert_eq!(published(&s.poll(t0)), Vec::<u64>::new());
    // A new message of the device goes as usual.
    s.on_stored(msg(3), None, t0, 0);
    assert_eq!(published(&s.poll(t0)), vec![3]);
}
