//! ferry: last wills, kept by the connection they belong to.
//!
//! A will stays in its [`Connection`] while it is connected, so nothing
//! another connection does (a takeover under the same client id, a
//! DISCONNECT racing a reconnect) can publish or delete it: upstream kept
//! wills by client id only, and the old connection's late will event
//! published the new connection's will, or its DISCONNECT deleted it.
//! - A DISCONNECT deletes the connection's will.
//! - Any other end (network closed or failed, keep-alive, protocol
//!   violation, takeover) publishes it: at once when its will delay is 0
//!   (always in MQTT 3.1.1), so a takeover's old will is published before
//!   the new connection is registered; else it waits, by client id, for
//!   [`Event::PublishWill`] naming its incarnation, which the connection's
//!   task sends when the delay is over. A new connection under that client
//!   id before then publishes it if the new one starts clean (the old
//!   session ends), and deletes it if not (MQTT 5 §3.1.3.2.2).
//! - What topics a will may name is checked at CONNECT (`server/broker.rs`),
//!   with the rules of the client's publishes.

use super::*;

/// The will of a connection that is gone.
pub(super) struct GoneWill {
    client_id: String,
    delay: u32,
    delayed: DelayedWill,
}

impl GoneWill {
    /// `connection`'s will, if it still has one (a DISCONNECT takes it).
    pub(super) fn take(connection: &mut Connection) -> Option<GoneWill> {
        let will = connection.last_will.take()?;
        Some(GoneWill {
            client_id: connection.client_id.clone(),
            delay: connection.will_delay,
            delayed: DelayedWill {
                incarnation: connection.incarnation,
                will,
                props: connection.last_will_properties.take(),
                tenant_prefix: connection.tenant_prefix.clone(),
            },
        })
    }
}

/// A will whose connection is gone, waiting for its delay.
pub(super) struct DelayedWill {
    incarnation: Incarnation,
    will: LastWill,
    props: Option<LastWillProperties>,
    tenant_prefix: Option<String>,
}

impl Router {
    /// A connection has ended without a DISCONNECT: its will is published,
    /// or kept for its delay.
    pub(super) fn will_of_gone(&mut self, gone: GoneWill) {
        let GoneWill {
            client_id,
            delay,
            delayed,
        } = gone;
        if delay == 0 {
            self.publish_will(delayed.will, delayed.props, delayed.tenant_prefix);
            return;
        }
        // A connection settles its client id's earlier delayed will at
        // CONNECT (`resolve_delayed_will`), so there is never one here.
        self.last_wills.insert(client_id, delayed);
    }

    /// A new connection for `client_id`: its earlier connection's delayed
    /// will is published if the new one starts clean, deleted if not.
    pub(super) fn resolve_delayed_will(&mut self, client_id: &str, clean: bool) {
        let Some(delayed) = self.last_wills.remove(client_id) else {
            return;
        };
        if clean {
            self.publish_will(delayed.will, delayed.props, delayed.tenant_prefix);
        }
    }

    /// The delay of the will of `client_id`'s connection `incarnation` is
    /// over: published, if it still waits (nothing took it meanwhile).
    pub fn handle_last_will(&mut self, client_id: String, incarnation: Incarnation) {
        use std::collections::hash_map::Entry;
        if let Entry::Occupied(waiting) = self.last_wills.entry(client_id) {
            if waiting.get().incarnation == incarnation {
                let delayed = waiting.remove();
                self.publish_will(delayed.will, delayed.props, delayed.tenant_prefix);
            }
        }
    }

    fn publish_will(
        &mut self,
        will: LastWill,
        will_props: Option<LastWillProperties>,
        #[allow(unused_variables)] tenant_prefix: Option<String>,
    ) {
        let publish = Publish {
            dup: false,
            qos: will.qos,
            retain: will.retain,
            topic: will.topic,
            pkid: 0,
            payload: will.message,
        };

        let properties = will_props.map(|props| PublishProperties {
            payload_format_indicator: props.payload_format_indicator,
            message_expiry_interval: props.message_expiry_interval,
            response_topic: props.response_topic,
            correlation_data: props.correlation_data,
            user_properties: props.user_properties,
            content_type: props.content_type,
            ..Default::default()
        });

        match append_will_message(
            publish,
            properties,
            &mut self.datalog,
            &mut self.notifications,
            #[cfg(feature = "validate-tenant-prefix")]
            tenant_prefix,
        ) {
            Ok(_offset) => {
                // Prepare all the consumers which are waiting for new data
                while let Some((id, request)) = self.notifications.pop_front() {
                    self.scheduler.track(id, request);
                    self.scheduler.reschedule(id, ScheduleReason::FreshData);
                }
            }
            Err(e) => {
                warn!(event = "will_not_published", reason = ?e, "will not published");
                self.router_meters.failed_publishes += 1;
            }
        };
    }
}
