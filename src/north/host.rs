//! The Sparkplug B primary host application, followed on the north broker
//! (docs/PROTOCOL.md, "Sparkplug B edge nodes"): with
//! `south.sparkplug.host_id` set, north subscribes to its retained
//! `spBv1.0/STATE/{host_id}` (Sparkplug 3.0 JSON, `{"online", "timestamp"}`)
//! and Sparkplug uplinks are held, stored, while the host is not online.
//!
//! - Not online: a STATE saying `online: false`, none seen yet, or none
//!   seen since the north link came back (the retained STATE comes with
//!   the subscription, so an online host releases them at once). An
//!   absent host is no failure: its uplinks wait, uncounted, however long.
//! - A STATE older (by its `timestamp`) than the last one taken is
//!   ignored, as Sparkplug 3.0 has edge nodes do; a malformed one too,
//!   with a WARN.
//! - The gauge `ferry_sparkplug_host_online` says it: 1 online, 0 not,
//!   -1 when no host is followed.
//! - [`Host::live`] is what intake reads: a Sparkplug uplink stored while
//!   it is false (the link down, or the host held) is stored historical.

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::clip::Clip;
use crate::protocol::sparkplug::edge::SparkplugTopics;
use crate::protocol::sparkplug::parse_state;

pub(super) struct Host {
    /// `spBv1.0/STATE/{host_id}`, when a host is followed.
    topic: Option<String>,
    link_up: bool,
    /// The host's word since the link came up (None: none yet).
    online: Option<bool>,
    /// The `timestamp` of the last STATE taken.
    last_ts: Option<u64>,
    /// The state last logged.
    logged: Option<bool>,
    /// What the uplink engine was last told (it starts not holding).
    held: bool,
    live: watch::Sender<bool>,
}

impl Host {
    /// Follows the host `sparkplug` names, if any; the receiver says
    /// whether a Sparkplug uplink stored now goes north at once.
    pub(super) fn new(sparkplug: Option<&SparkplugTopics>) -> (Host, watch::Receiver<bool>) {
        let (live, rx) = watch::channel(false);
        let host = Host {
            topic: sparkplug.and_then(SparkplugTopics::state_topic),
            link_up: false,
            online: None,
            last_ts: None,
            logged: None,
            held: false,
            live,
        };
        (host, rx)
    }

    /// The subscription north, when a host is followed.
    pub(super) fn subscription(&self) -> Option<String> {
        self.topic.clone()
    }

    pub(super) fn is_state(&self, topic: &str) -> bool {
        self.topic.as_deref() == Some(topic)
    }

    /// The link came `up` or went down. Returns whether Sparkplug uplinks
    /// are now held, when that changed (tell the engine before the link
    /// itself).
    pub(super) fn on_link(&mut self, up: bool) -> Option<bool> {
        self.link_up = up;
        if !self.link_up {
            // The retained STATE comes again with the subscription.
            self.online = None;
        }
        self.update()
    }

    /// A STATE message arrived. Returns the new hold, when it changed.
    pub(super) fn on_state(&mut self, payload: &[u8]) -> Option<bool> {
        let host = self.topic.as_deref().unwrap_or_default();
        let state = match parse_state(payload) {
            Ok(state) => state,
            Err(e) => {
                warn!(event = "sparkplug_state_malformed", topic = %Clip(host), error = %Clip(&e.to_string()), "Sparkplug host STATE that is not Sparkplug 3.0 JSON ignored");
                return None;
            }
        };
        if let (Some(last), Some(ts)) = (self.last_ts, state.timestamp) {
            if ts < last {
                debug!(topic = %Clip(host), ts, last, "Sparkplug host STATE older than the last one ignored");
                return None;
            }
        }
        self.last_ts = state.timestamp.or(self.last_ts);
        self.online = Some(state.online);
        if self.logged != Some(state.online) {
            self.logged = Some(state.online);
            let timestamp = state.timestamp;
            if state.online {
                info!(event = "sparkplug_host_online", topic = %Clip(host), timestamp, "Sparkplug primary host online: Sparkplug uplinks go north");
            } else {
                info!(event = "sparkplug_host_offline", topic = %Clip(host), timestamp, "Sparkplug primary host offline: Sparkplug uplinks are held, stored, until it is back");
            }
        }
        self.update()
    }

    fn update(&mut self) -> Option<bool> {
        let held = self.topic.is_some() && self.online != Some(true);
        if self.topic.is_some() {
            crate::metrics::set_sparkplug_host_online(Some(!held));
        }
        self.live.send_replace(self.link_up && !held);
        (held != self.held).then(|| {
            self.held = held;
            held
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn followed() -> (Host, watch::Receiver<bool>) {
        Host::new(Some(&SparkplugTopics {
            host_id: Some("scada".into()),
        }))
    }

    #[test]
    fn without_a_host_only_the_link_decides() {
        let (mut host, live) = Host::new(Some(&SparkplugTopics::default()));
        assert_eq!(host.subscription(), None);
        assert_eq!(host.on_link(true), None, "never held");
        assert!(*live.borrow());
        assert_eq!(host.on_link(false), None);
        assert!(!*live.borrow());
    }

    #[test]
    fn a_followed_host_holds_until_it_says_online_and_again_after_each_reconnect() {
        let (mut host, live) = followed();
        assert!(host.is_state("spBv1.0/STATE/scada"));
        assert_eq!(host.on_link(true), Some(true), "none seen: held");
        assert!(!*live.borrow());
        let online = br#"{"online": true, "timestamp": 10}"#;
        assert_eq!(host.on_state(online), Some(false));
        assert!(*live.borrow());
        assert_eq!(
            host.on_state(br#"{"online": false, "timestamp": 9}"#),
            None,
            "older: ignored"
        );
        assert_eq!(host.on_state(b"{nope"), None, "malformed: ignored");
        assert!(*live.borrow());
        assert_eq!(
            host.on_state(br#"{"online": false, "timestamp": 11}"#),
            Some(true)
        );
        assert!(!*live.borrow());
        assert_eq!(
            host.on_state(br#"{"online": true, "timestamp": 12}"#),
            Some(false)
        );
        // A reconnect forgets the host's word until its retained STATE.
        assert_eq!(host.on_link(false), Some(true));
        assert_eq!(host.on_link(true), None);
        assert!(!*live.borrow());
        assert_eq!(
            host.on_state(br#"{"online": true, "timestamp": 12}"#),
            Some(false)
        );
        assert!(*live.borrow());
        // No timestamp: taken.
        assert_eq!(host.on_state(br#"{"online": false}"#), Some(true));
    }
}
