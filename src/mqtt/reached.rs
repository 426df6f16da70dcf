//! What the session hands its poller when the way to reach the broker
//! changes (`session/reach.rs`), read by the poller at its next connect
//! (`poll.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use super::options::Options;
use crate::config::Endpoint;

/// What the poller is handed: the options to connect with, numbered, and
/// the node to go to when it takes them.
#[derive(Clone)]
pub(super) struct Reached {
    pub number: u64,
    pub opts: Options,
    pub to: Endpoint,
}

/// The poller's end: the latest [`Reached`], and where it says which
/// number it connects with.
pub(super) struct PollerReach {
    pub latest: watch::Receiver<Reached>,
    pub taken: Arc<AtomicU64>,
}

impl PollerReach {
    /// Settings that never change (the poller's own tests).
    #[cfg(test)]
    pub fn fixed(opts: &Options) -> PollerReach {
        let (_, latest) = watch::channel(Reached {
            number: 0,
            opts: opts.clone(),
            to: opts.endpoints[0].clone(),
        });
        PollerReach {
            latest,
            taken: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Whether the latest settings list `node`.
    pub fn lists(&self, node: &Endpoint) -> bool {
        self.latest.borrow().opts.endpoints.contains(node)
    }

    /// Puts the latest settings into `opts` if they are newer than what
    /// it has (true), and says they are the ones connected with.
    pub fn take(&mut self, opts: &mut Options) -> bool {
        let latest = self.latest.borrow_and_update();
        if latest.number == self.taken.load(Ordering::Relaxed) {
            return false;
        }
        *opts = latest.opts.clone();
        self.taken.store(latest.number, Ordering::Relaxed);
        true
    }
}

/// The session's end.
pub(super) struct Reaches {
    latest: watch::Sender<Reached>,
    taken: Arc<AtomicU64>,
    /// A reach came while the link was down: the attempt under way (if
    /// any) may be on the old settings.
    while_down: bool,
}

impl Reaches {
    pub(super) fn new(opts: &Options) -> Reaches {
        Reaches {
            latest: watch::Sender::new(Reached {
                number: 0,
                opts: opts.clone(),
                to: opts.endpoints[0].clone(),
            }),
            taken: Arc::new(AtomicU64::new(0)),
            while_down: false,
        }
    }

    pub(super) fn poller(&self) -> PollerReach {
        PollerReach {
            latest: self.latest.subscribe(),
            taken: self.taken.clone(),
        }
    }

    pub(super) fn hand(&mut self, opts: &Options, to: Endpoint) {
        let number = self.latest.borrow().number + 1;
        self.latest.send_replace(Reached {
            number,
            opts: opts.clone(),
            to,
        });
    }

    /// The link is down: an attempt under way may be on the old settings.
    pub(super) fn down(&mut self) {
        self.while_down = true;
    }

    /// A CONNACK came: whether its connection was made with the latest
    /// settings.
    pub(super) fn connected(&mut self) -> bool {
        self.while_down = false;
        self.taken.load(Ordering::Relaxed) == self.latest.borrow().number
    }

    /// An attempt failed: whether it was one made on settings a reach
    /// while down replaced (then it is no failure of the new nodes).
    pub(super) fn stale_attempt(&mut self) -> bool {
        std::mem::take(&mut self.while_down)
            && self.taken.load(Ordering::Relaxed) != self.latest.borrow().number
    }
}
