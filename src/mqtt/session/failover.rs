//! The session's side of `prefer_first`: the checks of the first endpoint
//! while up on a later one, and the clean leave when it accepts again
//! (`Link::Moving`; `on_error` takes the drop that follows as no failure).

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{info, warn};

use super::super::link::{Link, Stage};
use super::{Tag, Task};

/// A check of the first endpoint gives up after this long.
const FIRST_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl<T: Tag> Task<T> {
    /// A ConnAck came: names the endpoint, and a move if it is one.
    pub(super) fn connected_to_endpoint(&mut self, session_present: bool) {
        let (index, endpoint) = self.endpoints.current();
        info!(event = "link_connected", link = %self.opts.name, endpoint = %endpoint, endpoint_index = index, host = %endpoint.host, port = endpoint.port, session_present, epoch = self.epoch, mqtt_version = self.opts.version.as_str(), "connected");
        if let Some(moved) = self.endpoints.connected(Instant::now()) {
            let (from, to) = (self.endpoints.get(moved.from), self.endpoints.get(moved.to));
            info!(event = "north_endpoint_switched", link = %self.opts.name, from = %from, to = %to, from_index = moved.from, to_index = moved.to, reason = moved.reason.as_str(), "moved to another endpoint");
        }
    }

    /// Starts a check of the first endpoint: a plain TCP connect, bounded
    /// by [`FIRST_CHECK_TIMEOUT`], off the session's loop.
    pub(super) fn check_first(&mut self) {
        let (answer, check) = oneshot::channel();
        let first = self.endpoints.get(0).clone();
        tokio::spawn(async move {
            let _ = answer.send(super::super::link::accepts(first, FIRST_CHECK_TIMEOUT).await);
        });
        self.first_check = Some(check);
    }

    /// The first endpoint answered the check: if it accepts and the link
    /// is still up on a later one, leave for it (DISCONNECT; the drop that
    /// follows is no failure).
    pub(super) fn checked_first(&mut self, accepts: bool, link: Link) -> Link {
        let up = matches!(
            link,
            Link::Connected {
                stage: Stage::Up,
                ..
            }
        );
        let now = Instant::now();
        let (from, _) = self.endpoints.current();
        let leave = accepts && up && from > 0 && self.endpoints.check_at().is_some();
        if leave && !self.client.try_disconnect() {
            warn!(event = "link_disconnect_not_queued", link = %self.opts.name, "disconnect could not be queued; staying on this endpoint");
            self.endpoints.checked(false, now);
            return link;
        }
        if !self.endpoints.checked(leave, now) {
            return link;
        }
        info!(event = "link_leaving_for_first_endpoint", link = %self.opts.name, from = %self.endpoints.get(from), to = %self.endpoints.get(0), "the first endpoint accepts again: closing this session to move there");
        Link::Moving
    }
}
