//! Giving memory back to the system after a burst.
//!
//! glibc's malloc keeps what ferry frees in its arenas for reuse, so after
//! ten thousand devices come and go the process would keep their memory
//! for good. Every [`TRIM_EVERY`], [`trim`] hands the free pages back
//! (`malloc_trim`); what is in use is untouched.

use std::time::{Duration, Instant};

use tracing::debug;

/// How often free memory is handed back.
pub const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Hands free heap pages back to the system, off the async workers.
pub async fn trim_periodically() {
    let mut every = tokio::time::interval(TRIM_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let _ = tokio::task::spawn_blocking(trim).await;
    }
}

/// Returns free heap memory to the system (glibc only; elsewhere nothing).
pub fn trim() {
    let started = Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and releases glibc's own free lists.
    let released = unsafe { libc::malloc_trim(0) } == 1;
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let released = false;
    debug!(
        released,
        took_us = started.elapsed().as_micros() as u64,
        "free memory handed back"
    );
}
