//! ferry: what the log says about refused connections, bounded.
//!
//! A client that is refused comes back: a misconfigured device every few
//! seconds for weeks, a scanner thousands of times a second. Each refusal
//! is counted where it happens (`counters`), in full; the log gets the
//! first [`PER_WINDOW`] refusals of each peer address in a [`WINDOW`], then
//! one summary line per address and window with how many it left out.
//! What a connected client does wrong (refused subscriptions, acks out of
//! order, packets it may not send) is budgeted the same way per client id
//! ([`admit_client`]). At most [`MAX_PEERS`] addresses and clients are
//! tracked per window; refusals from further ones share one budget,
//! summarised as `others`.
//!
//! Every client-chosen string in a log line goes through [`Clip`].

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals logged one by one per address and window.
pub const PER_WINDOW: u32 = 10;
/// How long a window lasts.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Addresses tracked at once.
pub const MAX_PEERS: usize = 1024;
/// Longest client-chosen string written to the log, in bytes.
pub const CLIP: usize = 128;

/// Where refusals from untracked peers are counted.
const OTHERS: &str = "others";

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    logged: u32,
    suppressed: u64,
}

/// The pure part: per-peer windows (a peer is an address, or a client id
/// prefixed `client `).
#[derive(Debug, Default)]
pub struct RefusalLog {
    peers: HashMap<String, Window>,
}

impl RefusalLog {
    /// Whether a refusal from `peer` at `now` is logged on its own line.
    pub fn admit(&mut self, peer: &str, now: Instant) -> bool {
        let key = if self.peers.contains_key(peer) || self.peers.len() < MAX_PEERS {
            peer.to_owned()
        } else {
            OTHERS.to_owned()
        };
        let window = self.peers.entry(key).or_insert(Window {
            started: now,
            logged: 0,
            suppressed: 0,
        });
        if window.logged < PER_WINDOW {
            window.logged += 1;
            true
        } else {
            window.suppressed += 1;
            false
        }
    }

    /// Ends the windows that are over at `now`: for each that left
    /// refusals out, (address, how many).
    pub fn sweep(&mut self, now: Instant) -> Vec<(String, u64)> {
        let mut summaries = Vec::new();
        self.peers.retain(|peer, w| {
            if now.saturating_duration_since(w.started) < WINDOW {
                return true;
            }
            if w.suppressed > 0 {
                summaries.push((peer.clone(), w.suppressed));
            }
            false
        });
        summaries
    }
}

static LOG: Mutex<Option<(RefusalLog, Instant)>> = Mutex::new(None);

/// Whether this refusal from address `ip` gets its own log line. Windows
/// that are over are summarised first (checked at most once a second).
pub fn admit(ip: IpAddr) -> bool {
    admit_peer(&ip.to_string())
}

/// Whether this line about what connected client `client_id` did wrong
/// gets logged (see [`admit`]).
pub fn admit_client(client_id: &str) -> bool {
    admit_peer(&format!("client {}", Clip(client_id)))
}

fn admit_peer(peer: &str) -> bool {
    let now = Instant::now();
    let mut guard = LOG.lock().unwrap_or_else(|e| e.into_inner());
    let (log, swept) = guard.get_or_insert_with(|| (RefusalLog::default(), now));
    if now.saturating_duration_since(*swept) >= Duration::from_secs(1) {
        *swept = now;
        summarise(log.sweep(now));
    }
    log.admit(peer, now)
}

/// Summarises the windows that are over; the listener calls it every few
/// seconds, so a peer that stops is summarised too.
pub fn flush() {
    let now = Instant::now();
    let mut guard = LOG.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((log, swept)) = guard.as_mut() {
        *swept = now;
        summarise(log.sweep(now));
    }
}

fn summarise(summaries: Vec<(String, u64)>) {
    for (peer, suppressed) in summaries {
        tracing::warn!(
            event = "refusals_suppressed",
            from = %peer,
            suppressed,
            window_s = WINDOW.as_secs(),
            "more refusals from this peer than are logged one by one; all are counted"
        );
    }
}

/// A client-chosen string as a log line may hold it: at most [`CLIP`]
/// bytes, then `…(N bytes)` with its real length; control characters
/// escaped, so no client can write a line of its own into the log.
pub struct Clip<'a>(pub &'a str);

impl fmt::Display for Clip<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        let mut end = s.len().min(CLIP);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        for c in s[..end].chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        if end < s.len() {
            write!(f, "…({} bytes)", s.len())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Clip<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// [`Clip`] for bytes that may not be UTF-8 (a topic as it came).
pub fn clip_bytes(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(CLIP)];
    let mut s = Clip(&String::from_utf8_lossy(head)).to_string();
    if head.len() < bytes.len() {
        s.push_str(&format!("…({} bytes)", bytes.len()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_first_lines_then_one_summary_per_window() {
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        let ip = "10.0.0.7";
        let logged = (0..2000).filter(|_| log.admit(ip, t0)).count();
        assert_eq!(logged, PER_WINDOW as usize);
        assert!(
            log.sweep(t0 + Duration::from_secs(1)).is_empty(),
            "window not over"
        );
        assert_eq!(
            log.sweep(t0 + WINDOW),
            vec![(ip.to_string(), 2000 - PER_WINDOW as u64)]
        );
        assert!(log.admit(ip, t0 + WINDOW), "a new window logs again");
    }

    #[test]
    fn addresses_are_limited_apart_and_untracked_ones_share_a_budget() {
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        let (a, b) = ("10.0.0.1", "client b");
        for _ in 0..PER_WINDOW {
            assert!(log.admit(a, t0));
        }
        assert!(!log.admit(a, t0));
        assert!(log.admit(b, t0), "b has its own budget");
        for i in 0..MAX_PEERS * 2 {
            log.admit(&format!("11.0.{}.{}", i / 256, i % 256), t0);
        }
        assert!(log.peers.len() <= MAX_PEERS + 1, "{}", log.peers.len());
        let others = log.sweep(t0 + WINDOW);
        let o = others.iter().find(|(p, _)| p == OTHERS).map(|(_, n)| *n);
        assert!(o.is_some_and(|n| n > 0), "{others:?}");
    }

    #[test]
    fn a_clipped_string_is_bounded_names_its_length_and_escapes_controls() {
        assert_eq!(Clip("dev-1").to_string(), "dev-1");
        let long = "x".repeat(60_000);
        let shown = Clip(&long).to_string();
        assert!(shown.len() < CLIP + 32, "{}", shown.len());
        assert!(shown.ends_with("…(60000 bytes)"), "{shown}");
        assert_eq!(Clip("a\nb").to_string(), "a\\nb");
        let wide = "é".repeat(100);
        assert!(Clip(&wide).to_string().ends_with("…(200 bytes)"));
        assert_eq!(clip_bytes(b"a/\xffb"), "a/\u{fffd}b");
    }
}
