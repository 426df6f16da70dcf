//! What north says that decides whether anything is sent: the link (up on
//! a connection, or down: everything in flight back to ready, uncounted),
//! and the Sparkplug hold. Sparkplug uplinks are held while the primary
//! host application ferry follows is not online (docs/PROTOCOL.md,
//! "Sparkplug B edge nodes"): they stay stored and in memory, unsent and
//! uncounted, each device's first attempts still in seq order (a device's
//! messages behind a held one wait with it), and go when it is back.
//! Nothing else waits.

use super::queue::{arm, Status};
use super::{Action, Link, Scheduler};

impl Scheduler {
    pub fn on_link_up(&mut self, epoch: u64) {
        self.link = Link::Up(epoch);
        self.requeue_inflight();
    }

    pub fn on_link_down(&mut self) {
        self.link = Link::Down;
        self.requeue_inflight();
    }

    /// Everything in flight goes back to ready, uncounted.
    fn requeue_inflight(&mut self) {
        for (device, q) in &mut self.devices {
            let mut any = false;
            for e in q.entries.values_mut() {
                if matches!(e.status, Status::InFlight { .. }) {
                    e.status = Status::Ready;
                    arm(&mut self.timers, e);
                    any = true;
                }
            }
            if any || !q.entries.is_empty() {
                self.dirty.insert(device.clone());
            }
        }
    }

    /// Holds Sparkplug uplinks (`held`), or lets them go: every device is
    /// looked at again at the next poll.
    pub fn hold_sparkplug(&mut self, held: bool) -> Vec<Action> {
        self.held = held;
        if !held {
            self.dirty.extend(self.devices.keys().cloned());
        }
        Vec::new()
    }
}
