//! The session's side of its own publishes: tracked ones handed to rumqttc
//! as the flow allows, each PUBACK matched to its publish, and the
//! refusals an MQTT 5 broker states (a PUBACK reason code, or a publish
//! larger than its CONNACK's maximum packet size) reported to the owner as
//! [`Event::Refused`], like a 3.1.1 broker's drop on a message.

use std::sync::atomic::Ordering;

use tracing::warn;

use super::super::link::{Link, Stage};
use super::super::v5;
use super::{Event, Tag, Task, Tracked};
use crate::config::MqttVersion;

impl<T: Tag> Task<T> {
    /// A connection is up: the largest publish it takes. With MQTT 5 that
    /// is what the owner allows and the broker's CONNACK announced
    /// (rumqttc fails the whole connection on a larger one); with 3.1.1
    /// rumqttc checks the owner's own limit.
    pub(super) fn set_max_packet(&mut self, broker: Option<usize>) {
        let limit = match self.opts.version {
            MqttVersion::V311 => usize::MAX,
            MqttVersion::V5 => broker
                .unwrap_or(usize::MAX)
                .min(self.opts.max_outgoing_packet),
        };
        self.max_packet.store(limit, Ordering::Relaxed);
    }

    /// Hands rumqttc every tracked publish that may go now; a publish
    /// larger than the connection takes is refused here instead. `None`
    /// ends the session (the owner is gone).
    pub(super) async fn hand_over(&mut self) -> Option<()> {
        let limit = self.max_packet.load(Ordering::Relaxed);
        while let Some(out) = self.flow.next_to_send() {
            if let Tracked::Owner(tag) = &out.tag {
                let size = v5::publish_size(&out.topic, out.body.len());
                if size > limit {
                    self.flow.withdrawn(&out.tag);
                    self.refused(Some(&out.tag), "packet_too_large", Some(size));
                    self.emit(Event::Refused(tag.clone())).await?;
                    continue;
                }
            }
            let payload = out.body.to_vec();
            if !self
                .client
                .try_publish(out.topic.clone(), out.retain, payload)
            {
                self.flow.refused_by_client(out);
                return Some(());
            }
        }
        Some(())
    }

    /// The broker acknowledged `pkid`, or (MQTT 5) refused it with the
    /// reason code named `refused`. `None` ends the session.
    pub(super) async fn on_puback(
        &mut self,
        pkid: u16,
        refused: Option<&'static str>,
        link: Link,
    ) -> Option<Link> {
        let tracked = self.flow.acked(pkid);
        if let Some(reason) = refused {
            self.refused(tracked.as_ref(), reason, None);
        }
        match (tracked, link) {
            // A refused announce still ends the wait: the link works, and
            // the warning says why the status is not there.
            (
                Some(Tracked::Announce),
                Link::Connected {
                    at,
                    failures,
                    stage:
                        Stage::Announcing {
                            session_present,
                            refused,
                        },
                },
            ) => {
                self.up(session_present, refused).await?;
                Some(Link::Connected {
                    at,
                    failures,
                    stage: Stage::Up,
                })
            }
            (Some(Tracked::Owner(tag)), link) => {
                let event = match refused {
                    None => Event::Published(tag),
                    Some(_) => Event::Refused(tag),
                };
                self.emit(event).await?;
                Some(link)
            }
            (_, link) => Some(link),
        }
    }

    /// One line for a refused publish (the first three, then at every
    /// power of two: a broker refusing a whole stream writes a few lines).
    /// `tracked` is `None` for an untracked [`crate::mqtt::Session::send`].
    fn refused(&mut self, tracked: Option<&Tracked<T>>, reason: &'static str, size: Option<usize>) {
        self.refusals += 1;
        let n = self.refusals;
        if n <= 3 || n.is_power_of_two() {
            warn!(event = "link_publish_refused", link = %self.opts.name, tag = ?tracked, reason, size, refusals = n, "the broker refused a publish (MQTT 5 reason code)");
        }
    }
}
