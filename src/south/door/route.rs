//! Where a device publish goes, read from its topic and, in embedded mode,
//! the publisher the broker marked it with: the one reading of a device
//! topic intake and its limits share.

use super::limits::Sender;
use crate::ids::DeviceId;
use crate::protocol::control::ControlKind;
use crate::protocol::topics::{DeviceTopic, TopicError, Topics};
use crate::south::SouthMessage;

/// Where a device publish goes, read from its topic and publisher.
pub(super) enum Route {
    /// Outside its sender's own topics (embedded mode): routed nowhere
    /// else, answered `unauthorized` to the sender.
    Unauthorized {
        publisher: String,
        sender: Sender,
    },
    Up {
        device: DeviceId,
        stream: String,
    },
    /// On a plain device's topic (`south.plain_topics`): a plain uplink.
    Plain {
        device: DeviceId,
    },
    /// On a Sparkplug B edge node's topic (`[south.sparkplug]`): a plain
    /// uplink of the edge node.
    Sparkplug {
        device: DeviceId,
    },
    Control {
        device: DeviceId,
        kind: ControlKind,
    },
    /// A device's uplink topic without a valid stream: answered `bad_topic`.
    BadStream {
        device: DeviceId,
        error: TopicError,
    },
    /// No device to answer: dead-lettered only.
    BadTopic {
        error: TopicError,
    },
}

impl Route {
    pub(super) fn of(topics: &Topics, msg: &SouthMessage) -> Route {
        if let Some(publisher) = &msg.publisher {
            return Route::Unauthorized {
                sender: DeviceId::new(publisher.as_str()).ok(),
                publisher: publisher.clone(),
            };
        }
        if let Some((device, _)) = topics.sparkplug().and_then(|s| s.edge_node(&msg.topic)) {
            return Route::Sparkplug { device };
        }
        if let Some(device) = topics.plain().device(&msg.topic) {
            return Route::Plain { device };
        }
        match topics.parse_device(&msg.topic) {
            Ok((device, DeviceTopic::Up { stream })) => Route::Up { device, stream },
            Ok((device, kind)) => {
                let kind = match kind {
                    DeviceTopic::Confirm => ControlKind::Confirm,
                    DeviceTopic::Pull => ControlKind::Pull,
                    DeviceTopic::Read => ControlKind::Read,
                    DeviceTopic::Nack => ControlKind::Nack,
                    DeviceTopic::Status => ControlKind::Status,
                    DeviceTopic::Up { .. } => unreachable!("matched above"),
                };
                Route::Control { device, kind }
            }
            Err(error @ (TopicError::NoStream(_) | TopicError::BadStream(..))) => {
                let device = match &error {
                    TopicError::NoStream(d) | TopicError::BadStream(d, _) => d.clone(),
                    _ => unreachable!("matched above"),
                };
                Route::BadStream { device, error }
            }
            Err(error) => Route::BadTopic { error },
        }
    }

    /// Whom the limits count it against.
    pub(super) fn sender(&self) -> Sender {
        match self {
            Route::Unauthorized { sender, .. } => sender.clone(),
            Route::Up { device, .. }
            | Route::Plain { device }
            | Route::Sparkplug { device }
            | Route::Control { device, .. }
            | Route::BadStream { device, .. } => Some(device.clone()),
            Route::BadTopic { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(topic: &str, publisher: Option<&str>) -> (Route, Sender) {
        let msg = SouthMessage {
            topic: topic.into(),
            payload: Default::default(),
            oversize: None,
            publisher: publisher.map(str::to_string),
            received_ms: 0,
            replayed: false,
            v5: Default::default(),
            number: None,
            qos: None,
            retain: false,
            ack: Default::default(),
        };
        let route = Route::of(&Topics::new("devices", "ferry/gw"), &msg);
        let sender = route.sender();
        (route, sender)
    }

    fn dev(id: &str) -> Sender {
        Some(DeviceId::new(id).unwrap())
    }

    #[test]
    fn each_publish_is_counted_against_whoever_sent_it() {
        let (r, s) = route("devices/a/up/t", None);
        assert!(matches!(r, Route::Up { ref stream, .. } if stream == "t"));
        assert_eq!(s, dev("a"));
        let (r, s) = route("devices/a/confirm", None);
        assert!(matches!(
            r,
            Route::Control {
                kind: ControlKind::Confirm,
                ..
            }
        ));
        assert_eq!(s, dev("a"));
        let (r, s) = route("devices/b/up/t", Some("a"));
        assert!(matches!(r, Route::Unauthorized { .. }));
        assert_eq!(s, dev("a"), "the publisher, not the device it posed as");
        let (r, s) = route("devices/a/up", None);
        assert!(matches!(r, Route::BadStream { .. }));
        assert_eq!(s, dev("a"));
        let (r, s) = route("elsewhere/x", None);
        assert!(matches!(r, Route::BadTopic { .. }));
        assert_eq!(s, None);
        let (_, s) = route("devices/b/up/t", Some("not a device id"));
        assert_eq!(s, None, "shares the bucket of the unnamed");
    }
}
