//! Peer-chosen text as a log line may hold it, and how many lines a peer
//! gets.
//!
//! Topics, client ids, reasons and error texts that a device, the backend
//! or an operator chose can be up to 64 KiB (or 256 MiB) long and contain
//! line breaks. Every such string goes into a log field through [`Clip`]:
//! at most [`MAX`] bytes, then `…(N bytes)` with its real length, control
//! characters escaped, so no peer can grow the log beyond a bound per line
//! or write a line of its own into it. (The embedded broker's own lines do
//! the same with `rumqttd::refusals::Clip`.)
//!
//! [`LogBudget`] bounds how many lines one peer gets: a device sending
//! junk at its full rate would otherwise write a WARN line or two per
//! message, for as long as it likes. Every message is still answered,
//! dead-lettered and counted; the log gets the first [`PER_WINDOW`] lines
//! per peer and [`WINDOW`], then one summary line with how many it left
//! out.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// Longest peer-chosen string written to the log, in bytes.
pub const MAX: usize = 128;

/// A string, clipped for the log (see the module doc).
pub struct Clip<'a>(pub &'a str);

impl fmt::Display for Clip<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        let mut end = s.len().min(MAX);
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

/// [`Clip`] of anything displayable (an error whose text quotes its input).
pub fn display(value: &impl fmt::Display) -> String {
    Clip(&value.to_string()).to_string()
}

/// Lines logged one by one per peer and window.
pub const PER_WINDOW: u32 = 10;
/// How long a window lasts.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Peers tracked at once; lines about further ones share one budget.
pub const MAX_PEERS: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    logged: u32,
    suppressed: u64,
}

/// Per-peer log line budgets (see the module doc). `None` in a summary is
/// every peer past [`MAX_PEERS`].
#[derive(Debug)]
pub struct LogBudget<K> {
    peers: HashMap<Option<K>, Window>,
}

impl<K> Default for LogBudget<K> {
    fn default() -> Self {
        LogBudget {
            peers: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> LogBudget<K> {
    /// Whether a line about `peer` at `now` is logged.
    pub fn admit(&mut self, peer: &K, now: Instant) -> bool {
        let key = Some(peer.clone());
        let key = if self.peers.contains_key(&key) || self.peers.len() < MAX_PEERS {
            key
        } else {
            None
        };
        let w = self.peers.entry(key).or_insert(Window {
            started: now,
            logged: 0,
            suppressed: 0,
        });
        if w.logged < PER_WINDOW {
            w.logged += 1;
            true
        } else {
            w.suppressed += 1;
            false
        }
    }

    /// Ends the windows over at `now`; (peer, lines left out) for each
    /// that left some out.
    pub fn sweep(&mut self, now: Instant) -> Vec<(Option<K>, u64)> {
        let mut out = Vec::new();
        self.peers.retain(|k, w| {
            if now.saturating_duration_since(w.started) < WINDOW {
                return true;
            }
            if w.suppressed > 0 {
                out.push((k.clone(), w.suppressed));
            }
            false
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_first_lines_per_window_then_a_summary() {
        let mut budget = LogBudget::default();
        let t0 = Instant::now();
        let logged = (0..400).filter(|_| budget.admit(&"dev-j", t0)).count();
        assert_eq!(logged, PER_WINDOW as usize);
        assert!(
            budget.admit(&"dev-k", t0),
            "another peer has its own budget"
        );
        assert!(budget.sweep(t0 + WINDOW / 2).is_empty());
        let mut summary = budget.sweep(t0 + WINDOW);
        summary.sort();
        assert_eq!(summary, vec![(Some("dev-j"), 400 - PER_WINDOW as u64)]);
        assert!(budget.admit(&"dev-j", t0 + WINDOW), "a new window");
    }

    #[test]
    fn peers_past_the_limit_share_one_budget() {
        let mut budget = LogBudget::default();
        let t0 = Instant::now();
        for i in 0..MAX_PEERS * 2 {
            budget.admit(&i, t0);
        }
        assert!(budget.peers.len() <= MAX_PEERS + 1);
        let summary = budget.sweep(t0 + WINDOW);
        assert!(
            summary.iter().any(|(k, n)| k.is_none() && *n > 0),
            "{summary:?}"
        );
    }

    #[test]
    fn a_short_string_is_as_it_was() {
        assert_eq!(
            Clip("devices/press-7/up/t").to_string(),
            "devices/press-7/up/t"
        );
    }

    #[test]
    fn a_long_string_is_cut_and_names_its_length() {
        let long = "x".repeat(60_000);
        let shown = Clip(&long).to_string();
        assert!(shown.len() <= MAX + 24, "{}", shown.len());
        assert!(shown.ends_with("…(60000 bytes)"), "{shown}");
        let wide = "é".repeat(100);
        assert!(Clip(&wide).to_string().ends_with("…(200 bytes)"));
    }

    #[test]
    fn a_line_break_cannot_start_a_line_of_its_own() {
        let forged = "x\n2026-12-01T00:00:00Z ERROR forged";
        assert!(!Clip(forged).to_string().contains('\n'));
        assert!(display(&"a\rb").contains("\\r"));
    }
}
