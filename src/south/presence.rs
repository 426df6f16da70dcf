//! Device presence as the south broker reports it, for the downlink.
//!
//! Embedded mode: the vendored rumqttd reports every accepted CONNECT,
//! every connection that is gone and every granted subscription through
//! its client-event hook (`Router::client_events`, vendor/README.md), in the
//! order its router handled them. [`run`] turns those into [`Presence`]:
//! - a device that subscribes to its inbox is [`Presence::Ready`]: it is
//!   there to take a batch, from its cursor;
//! - a device the broker saw connect that has not subscribed to its inbox
//!   within a short grace is [`Presence::Online`] anyway (it may never
//!   subscribe, and still pull or confirm);
//! - a device whose connection is gone is [`Presence::Offline`].
//!
//! External mode: the site broker tells a client nothing about other
//! clients. Presence there comes from the devices' own `status` messages
//! (`online: true` after connecting, `online: false` as their last will)
//! and from `pull` and `confirm`, which reach the downlink as device
//! controls; no [`Presence`] is ever sent.

use std::time::Duration;

use rumqttd::refusals::{self, RefusalLog};
use rumqttd::ClientEvent;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::info;

use crate::deadlines::{sleep_until, Deadlines};
use crate::ids::{DeviceId, Seq};
use crate::protocol::plain_down::PlainDown;
use crate::protocol::topics::Topics;

/// A device the broker saw connect is taken as online after this, unless it
/// subscribed to its inbox first.
pub const CONNECT_GRACE: Duration = Duration::from_millis(500);

/// What the south broker says about a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    /// Connected, not (yet) subscribed to its inbox.
    Online(DeviceId),
    /// Subscribed to its inbox: ready for a batch from its cursor.
    Ready(DeviceId),
    /// Subscribed to its plain command topic (`south.plain_down`): ready
    /// for its downlinks one by one, bare, from its cursor.
    PlainReady(DeviceId),
    /// It acknowledged (PUBACK) the plain downlink of this seq: its
    /// `delivered`.
    PlainDelivered(DeviceId, Seq),
    Offline(DeviceId),
}

/// Turns the broker's client events into [`Presence`], leaving out clients
/// that are not devices (the gateway's own link). Ends when either side is
/// gone.
pub async fn run(
    mut events: mpsc::UnboundedReceiver<ClientEvent>,
    out: mpsc::UnboundedSender<Presence>,
    topics: Topics,
    plain_down: Option<PlainDown>,
) {
    let mut tracker = Tracker {
        plain_down,
        ..Tracker::default()
    };
    let mut lines = Lines::default();
    loop {
        let next = tracker.grace.next();
        let sleep = sleep_until(next);
        let presence = tokio::select! {
            event = events.recv() => match event {
                Some(event) => {
                    lines.log(&event);
                    tracker.on_event(event, &topics, Instant::now())
                }
                None => return,
            },
            _ = sleep => tracker.due(Instant::now()),
        };
        for p in presence {
            if out.send(p).is_err() {
                return;
            }
        }
    }
}

/// The log lines for devices coming and going, bounded per device: a
/// device that reconnects in a loop gets the first lines of each window
/// and then one summary (the embedded broker's refusals are bounded the
/// same way, vendor/rumqttd/src/refusals.rs).
struct Lines {
    budget: RefusalLog,
    swept: std::time::Instant,
}

impl Default for Lines {
    fn default() -> Self {
        Lines {
            budget: RefusalLog::default(),
            swept: std::time::Instant::now(),
        }
    }
}

impl Lines {
    fn log(&mut self, event: &ClientEvent) {
        let (client_id, connected) = match event {
            ClientEvent::Connected { client_id } => (client_id, true),
            ClientEvent::Disconnected { client_id } => (client_id, false),
            ClientEvent::Subscribed { .. } | ClientEvent::Delivered { .. } => return,
        };
        // The gateway's own link is no device.
        let Ok(device) = DeviceId::new(client_id.as_str()) else {
            return;
        };
        let now = std::time::Instant::now();
        if now.saturating_duration_since(self.swept) >= Duration::from_secs(1) {
            self.swept = now;
            for (device, suppressed) in self.budget.sweep(now) {
                info!(
                    event = "device_presence_suppressed",
                    device = %device,
                    suppressed,
                    window_s = refusals::WINDOW.as_secs(),
                    "the device came and went more often than is logged one by one"
                );
            }
        }
        if !self.budget.admit(device.as_str(), now) {
            return;
        }
        if connected {
            info!(event = "device_connected", device = %device, "device connected");
        } else {
            info!(event = "device_disconnected", device = %device, "device disconnected");
        }
    }
}

/// The pure part: grace timers per connected device.
#[derive(Default)]
struct Tracker {
    grace: Deadlines<DeviceId>,
    /// `south.plain_down`, whose subscriptions say a plain device is ready.
    plain_down: Option<PlainDown>,
}

impl Tracker {
    fn on_event(&mut self, event: ClientEvent, topics: &Topics, now: Instant) -> Vec<Presence> {
        match event {
            ClientEvent::Connected { client_id } => {
                if let Ok(device) = DeviceId::new(client_id) {
                    // One grace per device, for its latest connection.
                    self.grace.insert(device, now + CONNECT_GRACE);
                }
                Vec::new()
            }
            ClientEvent::Disconnected { client_id } => match DeviceId::new(client_id) {
                Ok(device) => {
                    self.grace.remove(&device);
                    vec![Presence::Offline(device)]
                }
                Err(_) => Vec::new(),
            },
            ClientEvent::Subscribed { client_id, filter } => match DeviceId::new(client_id) {
                Ok(device) if filter == topics.device_inbox(&device) => {
                    self.grace.remove(&device);
                    vec![Presence::Ready(device)]
                }
                Ok(device)
                    if self
                        .plain_down
                        .as_ref()
                        .is_some_and(|d| d.is_of(device.as_str(), &filter)) =>
                {
                    self.grace.remove(&device);
                    vec![Presence::PlainReady(device)]
                }
                _ => Vec::new(),
            },
            ClientEvent::Delivered { client_id, tag } => match DeviceId::new(client_id) {
                Ok(device) => vec![Presence::PlainDelivered(device, Seq(tag))],
                Err(_) => Vec::new(),
            },
        }
    }

    /// Devices whose grace ran out without a subscription.
    fn due(&mut self, now: Instant) -> Vec<Presence> {
        std::iter::from_fn(|| self.grace.pop_due(now))
            .map(|(device, _)| Presence::Online(device))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics() -> Topics {
        Topics::new("devices", "ferry/gw")
    }

    fn connected(id: &str) -> ClientEvent {
        ClientEvent::Connected {
            client_id: id.into(),
        }
    }

    fn dev(id: &str) -> DeviceId {
        DeviceId::new(id).unwrap()
    }

    #[test]
    fn a_device_subscribing_to_its_inbox_is_ready_and_its_grace_is_dropped() {
        let (mut t, now) = (Tracker::default(), Instant::now());
        assert!(t.on_event(connected("a"), &topics(), now).is_empty());
        let sub = ClientEvent::Subscribed {
            client_id: "a".into(),
            filter: "devices/a/inbox".into(),
        };
        assert_eq!(
            t.on_event(sub, &topics(), now),
            vec![Presence::Ready(dev("a"))]
        );
        assert!(t.due(now + CONNECT_GRACE * 2).is_empty());
    }

    #[test]
    fn a_device_that_never_subscribes_is_online_after_the_grace() {
        let (mut t, now) = (Tracker::default(), Instant::now());
        t.on_event(connected("a"), &topics(), now);
        let ack = ClientEvent::Subscribed {
            client_id: "a".into(),
            filter: "devices/a/ack".into(),
        };
        assert!(t.on_event(ack, &topics(), now).is_empty());
        assert!(t.due(now).is_empty(), "not before the grace");
        assert_eq!(t.due(now + CONNECT_GRACE), vec![Presence::Online(dev("a"))]);
        assert!(t.due(now + CONNECT_GRACE * 2).is_empty(), "once");
    }

    #[test]
    fn a_subscription_to_its_plain_command_topic_makes_a_device_plain_ready() {
        let plain_down = PlainDown::parse("cmd/{device}", &["devices"]).unwrap();
        let (mut t, now) = (
            Tracker {
                plain_down: Some(plain_down),
                ..Tracker::default()
            },
            Instant::now(),
        );
        t.on_event(connected("a"), &topics(), now);
        let other = ClientEvent::Subscribed {
            client_id: "a".into(),
            filter: "cmd/b".into(),
        };
        assert!(t.on_event(other, &topics(), now).is_empty(), "not its own");
        let own = ClientEvent::Subscribed {
            client_id: "a".into(),
            filter: "cmd/a".into(),
        };
        assert_eq!(
            t.on_event(own, &topics(), now),
            vec![Presence::PlainReady(dev("a"))]
        );
        assert!(t.due(now + CONNECT_GRACE).is_empty(), "grace dropped");
        let acked = ClientEvent::Delivered {
            client_id: "a".into(),
            tag: 7,
        };
        assert_eq!(
            t.on_event(acked, &topics(), now),
            vec![Presence::PlainDelivered(dev("a"), Seq(7))]
        );
    }

    #[test]
    fn a_disconnect_is_offline_and_cancels_the_grace() {
        let (mut t, now) = (Tracker::default(), Instant::now());
        t.on_event(connected("a"), &topics(), now);
        let gone = ClientEvent::Disconnected {
            client_id: "a".into(),
        };
        assert_eq!(
            t.on_event(gone, &topics(), now),
            vec![Presence::Offline(dev("a"))]
        );
        assert!(t.due(now + CONNECT_GRACE).is_empty());
    }

    #[test]
    fn clients_that_are_not_devices_say_nothing() {
        let (mut t, now) = (Tracker::default(), Instant::now());
        assert!(t.on_event(connected(""), &topics(), now).is_empty());
        let gone = ClientEvent::Disconnected {
            client_id: String::new(),
        };
        assert!(t.on_event(gone, &topics(), now).is_empty());
        assert!(t.due(now + CONNECT_GRACE).is_empty());
    }
}
