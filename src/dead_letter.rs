//! A message given up on at the door: why, where it came from, and its raw
//! bytes, for the `dead_letter` table. Both pipelines make these; the store
//! persists them.

use bytes::Bytes;

/// A message that was never accepted (malformed, too large, bad topic), or
/// a receipt north the upstream would never take.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// `"up"` or `"down"`.
    pub direction: &'static str,
    pub device: Option<String>,
    pub msg_id: Option<String>,
    pub topic: String,
    pub reason: String,
    pub raw: Bytes,
    pub at_ms: i64,
}
