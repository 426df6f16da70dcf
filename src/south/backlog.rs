//! External mode: which device messages are the site broker's backlog.
//! Pure: the session's owner reports what happens and when.
//!
//! ferry's session on the site broker is persistent, so while ferry is
//! stopped or its link is down the broker keeps what devices publish, and
//! when ferry is back it delivers all of it as fast as ferry takes it. That
//! burst is not a device sending too fast: it is hours of a device's traffic
//! arriving in seconds, and refusing it (`rate`) would make every device
//! resend what ferry already had in its hands. So a message that is
//! *replayed* — part of that burst — is not held to the per-device limits
//! (`south::door::limits`); everything else is. The burst is:
//!
//! - what arrives before ferry's subscriptions are acknowledged (only a
//!   session the broker kept can deliver anything then), and
//! - once subscribed on a kept session (`session_present`), what arrives
//!   until ferry has waited [`QUIET`] for a message that did not come: the
//!   broker sends its backlog as fast as ferry acknowledges, so a pause that
//!   long means it holds nothing more (a new session, `session_present`
//!   false, had no backlog at all).
//!
//! Bounded: a burst ends at the latest [`MAX_BURST`] after it began, however
//! busy the link stays, and one begins only with a new connection to the
//! site broker. A device flooding right after a reconnect is let through
//! for that long at most, and then refused `rate` as ever; what arrives
//! past the bound meets the limits (retryable refusals, as before). Nothing
//! here drops or delays a message: it only says which limits apply.

use std::time::Duration;

use tokio::time::Instant;

/// A wait this long for the next message, on a connection that is up,
/// ends the burst: the site broker holds nothing more for ferry.
pub const QUIET: Duration = Duration::from_secs(1);

/// The longest a burst lasts, from its first message (or from the
/// subscriptions' acknowledgement, when that came first).
pub const MAX_BURST: Duration = Duration::from_secs(30);

/// Why a burst ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Ferry waited [`QUIET`] for a next message: the backlog is taken.
    Drained,
    /// [`MAX_BURST`] passed with messages still coming.
    TimeUp,
    /// The link dropped; the broker sends again what was not acknowledged,
    /// on the next connection.
    LinkLost,
}

impl End {
    pub fn as_str(self) -> &'static str {
        match self {
            End::Drained => "drained",
            End::TimeUp => "time_up",
            End::LinkLost => "link_lost",
        }
    }
}

/// A burst that ended: what it took and how long it lasted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub messages: u64,
    pub lasted: Duration,
    pub end: End,
}

/// A burst under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Burst {
    since: Instant,
    /// Since when ferry waits for the next message; `None` while it is
    /// handing one on (time spent waiting for room in the pipeline is not
    /// the broker being quiet).
    waiting: Option<Instant>,
    messages: u64,
    /// Subscriptions acknowledged: [`QUIET`] counts from now on.
    up: bool,
}

impl Burst {
    fn taken(&self, now: Instant, end: End) -> Taken {
        Taken {
            messages: self.messages,
            lasted: now.saturating_duration_since(self.since),
            end,
        }
    }

    /// When it ends if nothing else happens.
    fn deadline(&self) -> Instant {
        let time_up = self.since + MAX_BURST;
        match (self.up, self.waiting) {
            (true, Some(waiting)) => time_up.min(waiting + QUIET),
            _ => time_up,
        }
    }
}

/// Where the session to the site broker stands, as far as its backlog goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Not subscribed (yet, or again): a message now is the backlog of a
    /// session the broker kept.
    Connecting,
    Replaying(Burst),
    /// Everything arriving is live traffic.
    Live,
}

#[derive(Debug)]
pub struct Backlog {
    stage: Stage,
}

impl Default for Backlog {
    fn default() -> Self {
        Backlog::new()
    }
}

impl Backlog {
    /// Before the first connection.
    pub fn new() -> Backlog {
        Backlog {
            stage: Stage::Connecting,
        }
    }

    /// Subscribed; `session_present`: the broker kept ferry's session, and
    /// with it whatever devices sent meanwhile.
    pub fn on_up(&mut self, session_present: bool, now: Instant) -> Option<Taken> {
        let (stage, taken) = match self.stage {
            Stage::Replaying(burst) if !session_present => {
                (Stage::Live, Some(burst.taken(now, End::Drained)))
            }
            Stage::Replaying(burst) => (Stage::Replaying(Burst { up: true, ..burst }), None),
            _ if session_present => (
                Stage::Replaying(Burst {
                    since: now,
                    waiting: Some(now),
                    messages: 0,
                    up: true,
                }),
                None,
            ),
            _ => (Stage::Live, None),
        };
        self.stage = stage;
        taken
    }

    /// The link dropped: the next connection may bring a backlog again.
    pub fn on_down(&mut self, now: Instant) -> Option<Taken> {
        let taken = match self.stage {
            Stage::Replaying(burst) => Some(burst.taken(now, End::LinkLost)),
            _ => None,
        };
        self.stage = Stage::Connecting;
        taken
    }

    /// A device message arrived at `now`: whether it is replayed, and the
    /// burst that ended before it, if one did. Call [`Self::waiting`] once
    /// it is handed on.
    pub fn on_message(&mut self, now: Instant) -> (bool, Option<Taken>) {
        let ended = self.expire(now);
        let replayed = match &mut self.stage {
            Stage::Connecting => {
                self.stage = Stage::Replaying(Burst {
                    since: now,
                    waiting: None,
                    messages: 1,
                    up: false,
                });
                true
            }
            Stage::Replaying(burst) => {
                burst.messages += 1;
                burst.waiting = None;
                true
            }
            Stage::Live => false,
        };
        (replayed, ended)
    }

    /// The last message is handed on; from `now` ferry waits for the next.
    pub fn waiting(&mut self, now: Instant) {
        if let Stage::Replaying(burst) = &mut self.stage {
            burst.waiting = Some(now);
        }
    }

    /// When the burst under way ends if no message comes: call
    /// [`Self::expire`] then.
    pub fn deadline(&self) -> Option<Instant> {
        match self.stage {
            Stage::Replaying(burst) => Some(burst.deadline()),
            _ => None,
        }
    }

    /// Ends the burst under way if it is over by `now`.
    pub fn expire(&mut self, now: Instant) -> Option<Taken> {
        let Stage::Replaying(burst) = self.stage else {
            return None;
        };
        if now < burst.deadline() {
            return None;
        }
        self.stage = Stage::Live;
        let end = if now >= burst.since + MAX_BURST {
            End::TimeUp
        } else {
            End::Drained
        };
        Some(burst.taken(now, end))
    }
}

#[cfg(test)]
mod tests;
