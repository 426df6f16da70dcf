//! The Sparkplug hold (see `scheduler::link`): while the primary host is
//! not online, Sparkplug uplinks (stream `spb`) wait, and what a device
//! sent after one waits with it; other devices go on.

use super::*;

fn spb(device: &DeviceId, seq: u64) -> PendingMessage {
    PendingMessage {
        stream: crate::protocol::sparkplug::edge::STREAM.into(),
        ..msg_of(device, seq)
    }
}

#[test]
fn held_sparkplug_uplinks_wait_in_order_and_others_go_on() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig {
        max_inflight: 8,
        window: 64,
        ..cfg()
    });
    let node = DeviceId::new("node-1").unwrap();
    let other = DeviceId::new("press-7").unwrap();
    s.hold_sparkplug(true);
    s.on_link_up(1);
    s.on_stored(spb(&node, 1), None, t0, 0);
    s.on_stored(spb(&node, 2), None, t0, 0);
    // An envelope uplink of the node behind them waits too: seq order.
    s.on_stored(msg_of(&node, 3), None, t0, 0);
    s.on_stored(msg_of(&other, 1), None, t0, 0);
    let sent: Vec<(String, u64)> = s
        .poll(t0)
        .iter()
        .filter_map(|a| match a {
            Action::Publish { msg, .. } => Some((msg.device.to_string(), msg.seq.0)),
            _ => None,
        })
        .collect();
    assert_eq!(sent, vec![("press-7".to_string(), 1)]);
    assert!(published(&s.poll(t0)).is_empty(), "still held");
    // Released: every held message goes, in seq order, uncounted.
    assert!(s.hold_sparkplug(false).is_empty());
    assert_eq!(published(&s.poll(t0)), vec![1, 2, 3]);
    // Held again: what is in flight stays in flight; new ones wait.
    s.hold_sparkplug(true);
    s.on_stored(spb(&node, 4), None, t0, 0);
    assert!(published(&s.poll(t0)).is_empty());
    s.hold_sparkplug(false);
    assert_eq!(published(&s.poll(t0)), vec![4]);
}
