//! The session's side of a failed connection: the owner told (`Down`,
//! then `Failed` with what it says of the node), the tracked publishes of
//! the connection forgotten (the owner sends them again on the next), and
//! the poller told how long to back off and which endpoint is next.
//!
//! Who is to blame decides what follows:
//! - one message, a lone probe the broker dropped the link on
//!   (`flow.rs`): a strike against it, and the same node again at once;
//! - the node, for anything else: the next endpoint, behind the backoff;
//! - the node, for taking the session and moving nothing (`stall.rs`):
//!   the same, and more. Nothing it held is suspected (it stalled, the
//!   messages did not), the connection never counts as one that lasted
//!   (the backoff keeps growing while node after node stalls), and a
//!   return to the first endpoint that ends so did not hold.

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::super::failure::{Cause, LinkError};
use super::super::link::{Link, Stage};
use super::super::poll::Resume;
use super::{Event, Tag, Task, Tracked};

impl<T: Tag> Task<T> {
    /// The connection failed; `None` ends the session.
    pub(super) async fn on_error(
        &mut self,
        e: LinkError,
        resume: oneshot::Sender<Resume>,
        link: Link,
    ) -> Option<Link> {
        // What was received on the lost connection the broker sends again;
        // its acks must not go out on the next one.
        self.acks.lost();
        self.unqueued.clear();
        self.subscribe_waiting = false;
        let stalled = matches!(e.cause, Cause::Stalled(_));
        let strike = if stalled {
            self.flow.left();
            None
        } else {
            self.flow.lost(Instant::now())
        };
        let accepted_for = match &link {
            Link::Connected { at, .. } => Some(at.elapsed()),
            _ => None,
        };
        let mut failures = match link {
            Link::Closing => {
                self.closed.notify_waiters();
                return None;
            }
            Link::Moving => {
                // Left on purpose, from a working link: no failure, and no
                // strike against what was in flight (the owner sends it
                // again on the first endpoint). That one is next already.
                self.emit(Event::Down).await?;
                let to = self.endpoints.current().1.clone();
                let _ = resume.send(Resume {
                    delay: std::time::Duration::ZERO,
                    to,
                });
                return Some(Link::Down { failures: 0 });
            }
            // An attempt on settings since replaced: the new ones, at once.
            Link::Down { failures } if self.reaches.stale_attempt() => {
                let to = self.endpoints.current().1.clone();
                let delay = std::time::Duration::ZERO;
                let _ = resume.send(Resume { delay, to });
                return Some(Link::Down { failures });
            }
            Link::Down { failures } => failures,
            Link::Connected {
                at,
                failures,
                stage,
            } => {
                if stage == Stage::Up {
                    self.emit(Event::Down).await?;
                }
                if !stalled && at.elapsed() >= self.opts.reconnect.stable_after {
                    0
                } else {
                    failures
                }
            }
        };
        let (index, endpoint) = self.endpoints.current();
        let endpoint = endpoint.clone();
        let explained = matches!(strike, Some(Tracked::Owner(_)));
        let delay = match strike {
            Some(Tracked::Owner(tag)) => {
                warn!(event = "link_dropped_on_message", link = %self.opts.name, tag = ?tag, error = %e, "the broker dropped the link on this message");
                self.emit(Event::Refused(tag)).await?;
                // A drop explained by one message is no reason to wait
                // longer, nor to leave the node: that message backs off on
                // its own.
                self.endpoints.retry_same(Instant::now());
                self.opts.reconnect.delay(0)
            }
            _ => {
                failures = failures.saturating_add(1);
                if stalled {
                    self.endpoints.stalled(Instant::now());
                } else {
                    self.endpoints.failed(Instant::now());
                }
                self.opts.reconnect.delay(failures - 1)
            }
        };
        let problem = super::super::failure::diagnose(
            &e.cause,
            accepted_for,
            explained,
            self.opts.reconnect.stable_after,
            &mut self.closes,
        );
        self.emit(Event::Failed(super::super::failure::Failure {
            endpoint: endpoint.clone(),
            problem,
            error: e.text.clone(),
            failures,
        }))
        .await?;
        let (next_index, next) = self.endpoints.current();
        // The first failures of an outage are worth a warning; the rest
        // only say the same thing again.
        if failures <= 3 || failures.is_power_of_two() {
            warn!(event = "link_down", link = %self.opts.name, endpoint = %endpoint, endpoint_index = index, host = %endpoint.host, port = endpoint.port, error = %e, failures, retry_in_ms = delay.as_millis() as u64, next = %next, next_index, "link down");
        } else {
            debug!(link = %self.opts.name, endpoint = %endpoint, error = %e, failures, next = %next, "link still down");
        }
        let to = next.clone();
        let _ = resume.send(Resume { delay, to });
        Some(Link::Down { failures })
    }
}
