//! A refusal at the door as the store keeps it ([`Kept`]: heads, sizes
//! and a hash instead of everything that was sent) and what became of it
//! ([`Refusal`]). Plain data; `store::refusal` files them.

use bytes::Bytes;

use crate::dead_letter::{DeadLetter, Direction};

/// Payload bytes a refusal's dead letter keeps.
pub const HEAD: usize = 4096;
/// Topic bytes it keeps.
pub const TOPIC_HEAD: usize = 1024;
/// Reason bytes it keeps.
pub const REASON_HEAD: usize = 1024;
/// Bytes of a device name as written that it keeps.
pub const DEVICE_HEAD: usize = 128;

/// A dead letter as it is kept: heads, sizes and a hash instead of
/// everything that was sent. Made on the caller's thread (hashing a large
/// payload is not the writer's work).
#[derive(Debug, Clone)]
pub struct Kept {
    pub direction: Direction,
    pub device: Option<String>,
    pub msg_id: Option<String>,
    pub topic: String,
    pub topic_bytes: usize,
    pub reason: String,
    pub raw: Bytes,
    pub raw_bytes: usize,
    pub raw_sha256: String,
    pub at_ms: i64,
}

impl Kept {
    pub fn of(dl: DeadLetter) -> Kept {
        let digest = ring::digest::digest(&ring::digest::SHA256, &dl.raw);
        let raw_sha256 = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        Kept {
            direction: dl.direction,
            device: dl.device.map(|d| head(&d, DEVICE_HEAD).to_string()),
            msg_id: dl.msg_id,
            topic_bytes: dl.topic.len(),
            topic: head(&dl.topic, TOPIC_HEAD).to_string(),
            reason: head(&dl.reason, REASON_HEAD).to_string(),
            raw_bytes: dl.raw.len(),
            raw: dl.raw.slice(..dl.raw.len().min(HEAD)),
            raw_sha256,
            at_ms: dl.at_ms,
        }
    }

    /// Its text and bytes, as its share counts them (with a row's
    /// overhead).
    pub fn size(&self) -> u64 {
        (self.raw.len() + self.topic.len() + self.reason.len()) as u64
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
fn head(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// What became of a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Kept in dead letter `id`: its own row, or (`summary`) a summary.
    Filed { id: i64, summary: Option<Summary> },
    /// Nothing written: the store is at its disk budget (`detail`: the
    /// reason's words after its code).
    AtBudget { detail: String },
}

/// A refusal summed in a summary row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The share that is full (`*`: all of them together).
    pub share: String,
    /// Whether this refusal wrote the summary (the first past the share).
    pub opened: bool,
    /// Refusals the summary holds now.
    pub refusals: i64,
}
