//! End-to-end arrivals: what the consumer on the far side of a path got,
//! by message id, and how long each took from its publish.
//!
//! Publishers in this process stamp each payload with the time they sent
//! it ([`stamped_envelope`]: `{"t": ns since the phase's origin, "pad":
//! ...}`), so a consumer in the same process times arrivals on the same
//! clock. [`Arrivals`] counts every id of the phase once, and counts again
//! what came twice, what belongs to no message of the phase, and what had
//! no stamp: a run is good only if every expected id arrived exactly once.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ferry::ids::MsgId;
use ferry::protocol::envelope::WireEnvelope;
use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Message `msg_id`'s envelope, its payload stamped with `sent_ns`.
pub fn stamped_envelope(msg_id: &str, sent_ns: u64, pad: &Value) -> Vec<u8> {
    let msg_id = MsgId::new(msg_id).expect("bench msg_ids are valid");
    WireEnvelope::json(msg_id, json!({"t": sent_ns, "pad": pad})).to_bytes()
}

/// `(msg_id, sent_ns)` of a stamped envelope, or of a backend's uplink
/// (which carries the device's envelope flattened into it).
pub fn parse_stamped(body: &[u8]) -> Option<(String, Option<u64>)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let id = v.get("msg_id")?.as_str()?.to_string();
    Some((id, v.get("payload").and_then(|p| p.get("t")?.as_u64())))
}

/// What arrived in one phase.
pub struct Arrived {
    /// Distinct expected ids.
    pub distinct: u64,
    pub duplicates: u64,
    /// Ids not of this phase (a probe, an earlier phase's late message).
    pub foreign: u64,
    /// The first few foreign ids, clipped (`?` for a body with none).
    pub foreign_ids: Vec<String>,
    /// Messages of the phase without a time stamp.
    pub unstamped: u64,
    /// ns since the phase's origin of the last distinct arrival.
    pub last_ns: u64,
    /// Publish → arrival, µs.
    pub latency_us: Histogram<u64>,
}

/// How many foreign ids [`Arrived`] keeps, and how much of each.
const FOREIGN_KEPT: usize = 3;
const FOREIGN_CLIP: usize = 60;

impl Arrived {
    fn note_foreign(&mut self, id: &str) {
        self.foreign += 1;
        if self.foreign_ids.len() < FOREIGN_KEPT {
            self.foreign_ids
                .push(id.chars().take(FOREIGN_CLIP).collect());
        }
    }
}

struct Phase {
    prefix: String,
    origin: Instant,
    ids: HashSet<String>,
    arrived: Arrived,
}

/// The consumer's tally; [`Arrivals::begin`] starts a phase.
pub struct Arrivals {
    phase: Mutex<Option<Phase>>,
}

impl Default for Arrivals {
    fn default() -> Self {
        Arrivals::new()
    }
}

impl Arrivals {
    pub fn new() -> Arrivals {
        Arrivals {
            phase: Mutex::new(None),
        }
    }

    /// Counts from now on the ids that start with `prefix`, timed against
    /// `origin` (the publishers' clock); forgets the last phase.
    pub fn begin(&self, prefix: &str, origin: Instant) {
        *self.lock() = Some(Phase {
            prefix: prefix.to_string(),
            origin,
            ids: HashSet::new(),
            arrived: Arrived {
                distinct: 0,
                duplicates: 0,
                foreign: 0,
                foreign_ids: Vec::new(),
                unstamped: 0,
                last_ns: 0,
                latency_us: Histogram::new_with_bounds(1, 600_000_000, 3)
                    .expect("static histogram bounds"),
            },
        });
    }

    /// One message's body as the consumer got it.
    pub fn record(&self, body: &[u8]) {
        match parse_stamped(body) {
            Some((id, sent_ns)) => self.record_id(&id, sent_ns),
            None => self.record_foreign(),
        }
    }

    /// Something that is no message of the phase.
    pub fn record_foreign(&self) {
        if let Some(phase) = self.lock().as_mut() {
            phase.arrived.note_foreign("?");
        }
    }

    /// Message `id`, sent at `sent_ns` (if stamped), arrived now.
    pub fn record_id(&self, id: &str, sent_ns: Option<u64>) {
        let mut guard = self.lock();
        let Some(phase) = guard.as_mut() else {
            return;
        };
        let now_ns = phase.origin.elapsed().as_nanos() as u64;
        let a = &mut phase.arrived;
        if !id.starts_with(phase.prefix.as_str()) {
            a.note_foreign(id);
            return;
        }
        if !phase.ids.insert(id.to_string()) {
            a.duplicates += 1;
            return;
        }
        a.distinct += 1;
        a.last_ns = now_ns;
        match sent_ns {
            Some(t) => a
                .latency_us
                .saturating_record(now_ns.saturating_sub(t) / 1000),
            None => a.unstamped += 1,
        }
    }

    /// Distinct ids of the phase so far.
    pub fn distinct(&self) -> u64 {
        self.lock().as_ref().map_or(0, |p| p.arrived.distinct)
    }

    /// Whether anything at all arrived in this phase.
    pub fn any(&self) -> bool {
        self.lock()
            .as_ref()
            .is_some_and(|p| p.arrived.distinct + p.arrived.foreign + p.arrived.duplicates > 0)
    }

    /// Waits (polling) until `expected` distinct ids arrived or `deadline`.
    pub async fn wait_for(&self, expected: u64, deadline: tokio::time::Instant) {
        while self.distinct() < expected && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Ends the phase: what arrived in it.
    pub fn end(&self) -> Option<Arrived> {
        self.lock().take().map(|p| p.arrived)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Phase>> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }
}
