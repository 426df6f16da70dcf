//! The process signals `ferry run` answers, from its first instruction.
//!
//! SIGHUP's default action ends a process, and SIGTERM's ends it without
//! the graceful shutdown. tokio's handlers exist only once the runtime runs
//! and the part that listens has started: a `systemctl reload` right after
//! a start (or a logrotate postrotate) killed the gateway while its store
//! opened. [`install`], called before anything else, replaces both default
//! actions with a counter, so a signal that comes early is remembered, not
//! fatal:
//! - an early SIGTERM or SIGINT shuts the gateway down gracefully as soon as
//!   it listens for shutdown ([`terminated`]);
//! - an early SIGHUP is applied once the part it reloads is up
//!   ([`hangups`]: the count before the file was read, compared after).
//!
//! The counters are bumped by an async-signal-safe action (one atomic add)
//! beside tokio's own handlers, which are registered through the same
//! registry later and see every signal after that.

use std::sync::atomic::{AtomicU64, Ordering};

static HANGUPS: AtomicU64 = AtomicU64::new(0);
static TERMINATIONS: AtomicU64 = AtomicU64::new(0);

/// Counts SIGHUP, SIGTERM and SIGINT instead of letting them end the
/// process. For `ferry run` only (a CLI command should die on them).
pub fn install() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let count = |signal: libc::c_int, counter: &'static AtomicU64| {
            // SAFETY: the action is one atomic add: async-signal-safe, no
            // allocation, no lock.
            unsafe {
                signal_hook_registry::register(signal, move || {
                    counter.fetch_add(1, Ordering::Relaxed);
                })
            }
        };
        count(libc::SIGHUP, &HANGUPS)?;
        count(libc::SIGTERM, &TERMINATIONS)?;
        count(libc::SIGINT, &TERMINATIONS)?;
    }
    Ok(())
}

/// SIGHUPs received since [`install`].
pub fn hangups() -> u64 {
    HANGUPS.load(Ordering::Relaxed)
}

/// Whether a SIGTERM or SIGINT came since [`install`].
pub fn terminated() -> bool {
    TERMINATIONS.load(Ordering::Relaxed) > 0
}
