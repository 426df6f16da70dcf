//! The session's side of a new way to reach the broker
//! ([`crate::mqtt::Session::reach`], from `systemctl reload`): nodes,
//! login, keep-alive, stall bound, TLS.
//!
//! - The connection up now stays if its node is still listed (it keeps
//!   its place in the new list); the new settings are used from the next
//!   connection on. If its node is gone from the list, the session leaves
//!   it cleanly (DISCONNECT, as for a return to the first endpoint:
//!   `Link::Moving`, no failure) for the new list's first.
//! - While down, the poller's wait between attempts ends at once: the
//!   next attempt is made where the new settings say. An attempt already
//!   under way on the old ones is not cut (a connect is not safe to cancel
//!   in rumqttc); if it fails, that is no failure of the new node, and if
//!   it reaches a node no longer listed, the poller leaves it before the
//!   session hears of it (`poll.rs`).

use tokio::time::Instant;
use tracing::{info, warn};

use super::super::link::{Link, Stage};
use super::super::options::Reach;
use super::{Tag, Task};

impl<T: Tag> Task<T> {
    /// Takes `reach` (see the module doc); returns the link as it is now.
    pub(super) fn reach(&mut self, reach: Reach, link: Link) -> Link {
        reach.apply(&mut self.opts);
        // The connection up keeps its keep-alive: answer probes by the longer.
        self.link_keep_alive = self.link_keep_alive.max(self.opts.keep_alive);
        let up = matches!(
            link,
            Link::Connected {
                stage: Stage::Up,
                ..
            }
        )
        .then(Instant::now);
        // A check of the old list's first answers for a node that may not
        // lead the new one: dropped (the new list's first is checked anew).
        self.first_check = None;
        let from = self.endpoints.current().1.clone();
        let kept = self
            .endpoints
            .replace(self.opts.endpoints.clone(), self.opts.prefer_first, up);
        let to = self.endpoints.current().1.clone();
        self.reaches.hand(&self.opts, to.clone());
        match link {
            Link::Down { .. } => {
                self.reaches.down();
                link
            }
            Link::Connected { .. } if !kept => {
                if !self.client.try_disconnect() {
                    warn!(event = "link_disconnect_not_queued", link = %self.opts.name, "disconnect could not be queued; staying on a node no longer listed until the link drops");
                    return link;
                }
                info!(event = "link_leaving_for_new_endpoints", link = %self.opts.name, from = %from, to = %to, "the node this session is on is no longer among the endpoints: closing it to move to the first of the new list");
                Link::Moving
            }
            link => link,
        }
    }
}
