//! Per-device input limits, applied by intake to every device publish in
//! both south modes (issue 8, "Input limits"; docs/SECURITY.md, "Limits"):
//!
//! - [`RateLimiter`]: a token bucket per device (`south.rate_per_s`,
//!   `south.burst`) over everything it publishes, uplinks and controls.
//! - [`InFlight`]: a device's uplinks sent to the store and not yet
//!   answered (`south.max_inflight_per_device`).
//!
//! Both are pure (the clock is passed in) and report when a device *starts*
//! being limited and when it is back, so that [`Limits`], the thin shell
//! intake holds, writes one line for each and never one per refused
//! message: a line per message would itself be a flood.
//!
//! Memory follows the devices that are sending, not every device that ever
//! did: a bucket that is full again is the same as a new one, and
//! [`RateLimiter::sweep`] removes it; a device with nothing in flight has
//! no entry.

use std::collections::HashMap;

use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::RateLimit;
use crate::ids::DeviceId;
use crate::metrics;

/// Whom a limit is kept for: a device, or `None` for every publisher
/// without a valid device id. Those share one bucket: nothing can be
/// answered to them, and one of them must not get a fresh bucket per topic.
pub type Sender = Option<DeviceId>;

/// Log lines about device publishes, per sender (see
/// [`LogBudget`](crate::clip::LogBudget)).
pub(super) type Lines = crate::clip::LogBudget<Sender>;

/// A token bucket's answer to one publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// Within its rate. `recovered`: how many it had refused since it went
    /// over, when this publish finds its bucket full again. `status`: a
    /// device status held back while it was over (see
    /// [`RateLimiter::hold_status`]), to pass on now, before this publish.
    Pass {
        recovered: Option<u64>,
        status: Option<bool>,
    },
    /// Over its rate; `first` when this one starts a run of refusals.
    Limited { first: bool },
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    /// Publishes refused since it went over; 0 while within its rate.
    limited: u64,
    /// The latest `online` it said while over its rate, not yet passed on.
    status: Option<bool>,
}

impl Bucket {
    fn refill(&mut self, now: Instant, limit: RateLimit) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * limit.per_s).min(limit.burst as f64);
        self.at = now;
    }

    fn full(&self, limit: RateLimit) -> bool {
        self.tokens >= limit.burst as f64
    }
}

/// A device whose bucket [`RateLimiter::sweep`] found full again and
/// removed, with what it still had to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    pub sender: Sender,
    /// Publishes refused since it went over (0: it never was).
    pub limited: u64,
    /// A status held back while it was over, to pass on now.
    pub status: Option<bool>,
}

/// A token bucket per sender: `burst` tokens, `per_s` back per second,
/// one per publish.
#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    buckets: HashMap<Sender, Bucket>,
}

impl RateLimiter {
    pub fn new(limit: RateLimit) -> RateLimiter {
        RateLimiter {
            limit,
            buckets: HashMap::new(),
        }
    }

    /// One publish from `sender` at `now`.
    pub fn take(&mut self, sender: &Sender, now: Instant) -> Take {
        let limit = self.limit;
        let bucket = match self.buckets.get_mut(sender) {
            Some(b) => b,
            None => self.buckets.entry(sender.clone()).or_insert(Bucket {
                tokens: limit.burst as f64,
                at: now,
                limited: 0,
                status: None,
            }),
        };
        bucket.refill(now, limit);
        let recovered =
            (bucket.limited > 0 && bucket.full(limit)).then(|| std::mem::take(&mut bucket.limited));
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Take::Pass {
                recovered,
                status: bucket.status.take(),
            };
        }
        bucket.limited += 1;
        Take::Limited {
            first: bucket.limited == 1,
        }
    }

    /// Keeps `online`, from a status `sender` sent over its rate, to pass
    /// on with its next publish within the rate or when its bucket is full
    /// again ([`Self::sweep`]); a later one replaces it. A status is the
    /// device's presence (in external mode the only word of it), so the
    /// latest one must arrive; holding one flag per device bounds what a
    /// device flapping its status can cost.
    pub fn hold_status(&mut self, sender: &Sender, online: bool) {
        if let Some(bucket) = self.buckets.get_mut(sender) {
            bucket.status = Some(online);
        }
    }

    /// Removes every bucket that is full again at `now` (it is the same as
    /// a new one); returns those that had refused anything or hold a status.
    pub fn sweep(&mut self, now: Instant) -> Vec<Swept> {
        let limit = self.limit;
        let mut swept = Vec::new();
        self.buckets.retain(|sender, bucket| {
            bucket.refill(now, limit);
            if !bucket.full(limit) {
                return true;
            }
            if bucket.limited > 0 || bucket.status.is_some() {
                swept.push(Swept {
                    sender: sender.clone(),
                    limited: bucket.limited,
                    status: bucket.status,
                });
            }
            false
        });
        swept
    }

    /// Buckets held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.len()
    }
}

/// Whether one more uplink from a device may go to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Counted in flight until [`InFlight::answered`].
    Pass,
    /// Past the limit; `first` when this one starts a run of refusals.
    Limited { first: bool },
}

#[derive(Debug, Default)]
struct Count {
    in_flight: usize,
    limited: u64,
}

/// Uplinks per sender sent to the store and not yet answered.
#[derive(Debug)]
pub struct InFlight {
    max: usize,
    senders: HashMap<Sender, Count>,
}

impl InFlight {
    pub fn new(max: usize) -> InFlight {
        InFlight {
            max,
            senders: HashMap::new(),
        }
    }

    /// One more uplink from `sender` for the store, if it is under the limit.
    pub fn admit(&mut self, sender: &Sender) -> Admit {
        let count = match self.senders.get_mut(sender) {
            Some(c) => c,
            None => self.senders.entry(sender.clone()).or_default(),
        };
        if count.in_flight < self.max {
            count.in_flight += 1;
            return Admit::Pass;
        }
        count.limited += 1;
        Admit::Limited {
            first: count.limited == 1,
        }
    }

    /// The store answered one of `sender`'s uplinks. When it has none left
    /// in flight its entry goes, and if it had been refused any the count
    /// is returned: it is back under the limit.
    pub fn answered(&mut self, sender: &Sender) -> Option<u64> {
        let count = self.senders.get_mut(sender)?;
        count.in_flight = count.in_flight.saturating_sub(1);
        if count.in_flight > 0 {
            return None;
        }
        let limited = self.senders.remove(sender).map_or(0, |c| c.limited);
        (limited > 0).then_some(limited)
    }

    /// Senders with an entry.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.senders.len()
    }
}

/// [`Limits::rate`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// Within its rate; `held`, a status held while it was over, is to be
    /// passed on before this publish.
    Within {
        held: Option<bool>,
    },
    Over,
}

/// The limits as intake holds them: the two above, their counters and
/// their log lines.
pub struct Limits {
    rate: RateLimiter,
    in_flight: InFlight,
    limit: RateLimit,
    max_in_flight: usize,
    seen: SeenThisSecond,
}

/// The devices already reported seen (`LiveEvent::DeviceSeen`) in the
/// current second: a device sending thousands a second is reported once a
/// second, not once per message, and the set holds only one second's
/// senders.
struct SeenThisSecond {
    /// When the current second began: at the first report after the last
    /// one ended (none yet: the first report begins it).
    second: Option<Instant>,
    devices: std::collections::HashSet<DeviceId>,
}

/// A device's name in a log line.
fn name(sender: &Sender) -> &str {
    sender
        .as_ref()
        .map_or("(no valid device id)", DeviceId::as_str)
}

impl Limits {
    /// New bounds, from now on: buckets keep their tokens (held to the new
    /// burst at their next refill), counts in flight stay.
    pub fn set(&mut self, limit: RateLimit, max_in_flight: usize) {
        self.limit = limit;
        self.rate.limit = limit;
        self.max_in_flight = max_in_flight;
        self.in_flight.max = max_in_flight;
    }

    pub fn new(limit: RateLimit, max_in_flight: usize) -> Limits {
        Limits {
            rate: RateLimiter::new(limit),
            in_flight: InFlight::new(max_in_flight),
            limit,
            max_in_flight,
            seen: SeenThisSecond {
                second: None,
                devices: Default::default(),
            },
        }
    }

    /// Whether `device`'s last-seen time is to be reported at `now`: the
    /// first time in each second.
    pub fn report_seen(&mut self, device: &DeviceId, now: Instant) -> bool {
        let seen = &mut self.seen;
        let over = seen.second.is_none_or(|second| {
            now.saturating_duration_since(second) >= std::time::Duration::from_secs(1)
        });
        if over {
            seen.second = Some(now);
            seen.devices.clear();
        }
        if seen.devices.contains(device) {
            return false;
        }
        seen.devices.insert(device.clone());
        true
    }

    /// Whether a publish from `sender` is within its rate, counted and
    /// logged when it is not.
    pub fn rate(&mut self, sender: &Sender, now: Instant) -> Rate {
        match self.rate.take(sender, now) {
            Take::Pass { recovered, status } => {
                if let Some(limited) = recovered {
                    info!(
                        event = "device_rate_recovered",
                        device = %name(sender),
                        limited, "device back within south.rate_per_s"
                    );
                }
                Rate::Within { held: status }
            }
            Take::Limited { first } => {
                let total = metrics::count(metrics::Count::RateLimitedFromDevices);
                if first {
                    warn!(
                        event = "device_rate_exceeded",
                        device = %name(sender),
                        rate_per_s = self.limit.per_s,
                        burst = self.limit.burst,
                        total,
                        "device over south.rate_per_s: its envelope uplinks are refused (rate) and its plain publishes withheld (no PUBACK, connection closed), its status held and its confirm, pull and read dropped until it slows down"
                    );
                }
                Rate::Over
            }
        }
    }

    /// See [`RateLimiter::hold_status`].
    pub fn hold_status(&mut self, sender: &Sender, online: bool) {
        self.rate.hold_status(sender, online);
    }

    /// The receipt reason for a publish over the rate.
    pub fn rate_detail(&self) -> String {
        format!(
            "over {} publishes per second, burst {}",
            self.limit.per_s, self.limit.burst
        )
    }

    /// Whether one more uplink from `sender` may go to the store, counted
    /// and logged when it may not.
    pub fn admit(&mut self, sender: &Sender) -> bool {
        match self.in_flight.admit(sender) {
            Admit::Pass => true,
            Admit::Limited { first } => {
                let total = metrics::count(metrics::Count::InflightLimitedFromDevices);
                if first {
                    warn!(
                        event = "device_inflight_exceeded",
                        device = %name(sender),
                        max_inflight_per_device = self.max_in_flight,
                        total,
                        "device past south.max_inflight_per_device: its uplinks are refused (rate) until the store answers"
                    );
                }
                false
            }
        }
    }

    /// The receipt reason for an uplink past the in-flight limit.
    pub fn in_flight_detail(&self) -> String {
        format!("more than {} uplinks in flight", self.max_in_flight)
    }

    /// The store answered an uplink [`Self::admit`] let through.
    pub fn answered(&mut self, sender: &Sender) {
        if let Some(limited) = self.in_flight.answered(sender) {
            info!(
                event = "device_inflight_recovered",
                device = %name(sender),
                limited, "device back under south.max_inflight_per_device"
            );
        }
    }

    /// Frees the buckets that are full again; returns the statuses held
    /// for them, to pass on now.
    pub fn sweep(&mut self, now: Instant) -> Vec<(DeviceId, bool)> {
        let mut statuses = Vec::new();
        for swept in self.rate.sweep(now) {
            if swept.limited > 0 {
                info!(
                    event = "device_rate_recovered",
                    device = %name(&swept.sender),
                    limited = swept.limited,
                    "device back within south.rate_per_s"
                );
            }
            if let (Some(device), Some(online)) = (swept.sender, swept.status) {
                statuses.push((device, online));
            }
        }
        statuses
    }
}

#[cfg(test)]
mod tests;
