//! ferry: a client's session saved when its connection ends and resumed
//! when it connects again (see `router/sessions.rs` for what a session
//! holds and its bounds).

use std::time::{Duration, Instant};

use super::*;
use crate::router::sessions::Saved;

/// Sessions past their end are freed at most this often, as clients come
/// and go.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Router {
    /// Saves the session of `connection`, whose link is `outgoing`, if it
    /// asked for one: its subscriptions and the QoS 1 deliveries it did
    /// not acknowledge.
    pub(super) fn save_session(&mut self, connection: &Connection, outgoing: &mut Outgoing) {
        if !self.config.ephemeral || !connection.holdable || connection.session_expiry == 0 {
            return;
        }
        let filters = connection
            .subscriptions
            .iter()
            .map(|f| {
                let qos = connection.subscription_qos.get(f).copied().unwrap_or(0);
                (
                    f.clone(),
                    protocol::qos(qos.min(1)).unwrap_or(QoS::AtMostOnce),
                )
            })
            .collect();
        let unacked = outgoing.take_unacked_direct();
        let tags: Vec<(u16, u64)> = unacked
            .iter()
            .filter_map(|(p, tag)| Some((p.pkid, (*tag)?)))
            .collect();
        let unacked: Vec<_> = unacked.into_iter().map(|(p, _)| p).collect();
        let expiry = Duration::from_secs(connection.session_expiry.into());
        debug!(
            client_id = %Clip(&connection.client_id),
            expiry_s = connection.session_expiry,
            unacked = unacked.len(),
            "session saved"
        );
        self.sessions.save(
            &connection.client_id,
            filters,
            unacked,
            expiry,
            Instant::now(),
        );
        if !tags.is_empty() {
            self.sessions.tag(&connection.client_id, tags);
        }
    }

    /// The session `client_id` resumes, if it has one and does not start
    /// clean (a clean start discards it).
    pub(super) fn session_to_resume(&mut self, client_id: &str, clean: bool) -> Option<Saved> {
        if !self.config.ephemeral {
            return None;
        }
        self.sweep_sessions();
        if clean {
            self.sessions.discard(client_id);
            return None;
        }
        self.sessions.take(client_id, Instant::now())
    }

    /// Gives connection `id` its saved subscriptions back (the presence
    /// hook learns of each, as of a SUBSCRIBE) and queues what the session
    /// held to be sent again once the CONNACK is out.
    pub(super) fn resume_session(&mut self, id: ConnectionId, saved: Saved) {
        let Saved {
            filters,
            messages,
            tags,
            ..
        } = saved;
        for (path, qos) in filters {
            let filter = protocol::Filter {
                path,
                qos,
                nolocal: false,
                preserve_retain: false,
                retain_forward_rule: protocol::RetainForwardRule::Never,
            };
            let (idx, cursor) = self.datalog.next_native_offset(&filter.path);
            self.prepare_filter(id, cursor, idx, &filter, None, None);
            if let Some(connection) = self.connections.get(id) {
                let client_id = connection.client_id.clone();
                self.client_event(ClientEvent::Subscribed {
                    client_id,
                    filter: filter.path.clone(),
                });
            }
        }
        if let Some(outgoing) = self.obufs.get_mut(id) {
            let mut out = outgoing.lock();
            for publish in messages.into_publishes().into_iter().rev() {
                let tag = tags
                    .iter()
                    .find(|(pkid, _)| publish.pkid != 0 && *pkid == publish.pkid)
                    .map(|(_, tag)| *tag);
                out.direct.push_front((publish, 1, tag));
            }
        }
    }

    /// Frees the sessions past their end (at most every [`SWEEP_EVERY`]).
    pub(super) fn sweep_sessions(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.sessions_swept) >= SWEEP_EVERY {
            self.sessions_swept = now;
            self.sessions.sweep(now);
        }
    }
}
