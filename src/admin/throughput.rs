//! Throughput over the last minutes, for the status page's chart: the
//! message counters of [`crate::metrics::flow`] sampled in-process every
//! [`EVERY`], the last [`KEPT`] samples (15 minutes) kept in a ring, and
//! served as rates (`/api/throughput`).
//!
//! Always holds: the ring never holds more than `KEPT + 1` samples, and a
//! rate is never negative (the counters only grow; a smaller total is
//! taken as no traffic).

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

use crate::metrics::Flow;

/// How often the counters are sampled.
pub const EVERY: Duration = Duration::from_secs(10);
/// Intervals kept: 15 minutes of them.
pub const KEPT: usize = 90;

/// The samples, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Ring {
    samples: VecDeque<(i64, Flow)>,
}

/// Messages per second over one interval, from `from_ms` to `at_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    pub from_ms: i64,
    pub at_ms: i64,
    pub uplink_in: f64,
    pub uplink_out: f64,
    pub downlink_in: f64,
    pub downlink_out: f64,
}

/// What `/api/throughput` answers.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// Seconds between samples.
    pub every_s: u64,
    /// Oldest first; the last one runs to the time of the request.
    pub points: Vec<Point>,
}

impl Ring {
    /// Adds the totals `flow` as of `at_ms`, dropping the oldest past
    /// [`KEPT`] intervals.
    pub fn push(&mut self, at_ms: i64, flow: Flow) {
        self.samples.push_back((at_ms, flow));
        while self.samples.len() > KEPT + 1 {
            self.samples.pop_front();
        }
    }

    /// The rates between samples, and from the last one to `now_ms`, when
    /// the totals are `now`.
    pub fn series(&self, now_ms: i64, now: Flow) -> Series {
        let mut points: Vec<Point> = self
            .samples
            .iter()
            .zip(self.samples.iter().skip(1))
            .filter_map(|(a, b)| rate(*a, *b))
            .collect();
        if let Some(last) = self.samples.back() {
            points.extend(rate(*last, (now_ms, now)));
        }
        Series {
            every_s: EVERY.as_secs(),
            points,
        }
    }
}

/// The rates from `a` to `b`; none over an interval under a second.
fn rate((from_ms, a): (i64, Flow), (to_ms, b): (i64, Flow)) -> Option<Point> {
    let secs = (to_ms - from_ms) as f64 / 1000.0;
    if secs < 1.0 {
        return None;
    }
    let per_s = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
    Some(Point {
        from_ms,
        at_ms: to_ms,
        uplink_in: per_s(a.uplink_in, b.uplink_in),
        uplink_out: per_s(a.uplink_out, b.uplink_out),
        downlink_in: per_s(a.downlink_in, b.downlink_in),
        downlink_out: per_s(a.downlink_out, b.downlink_out),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(n: u64) -> Flow {
        Flow {
            uplink_in: n,
            uplink_out: n / 2,
            downlink_in: 0,
            downlink_out: 0,
        }
    }

    #[test]
    fn rates_are_per_second_between_samples_and_up_to_now() {
        let mut ring = Ring::default();
        ring.push(0, flow(0));
        ring.push(10_000, flow(100));
        let s = ring.series(15_000, flow(200));
        assert_eq!(s.points.len(), 2);
        assert_eq!(s.points[0].uplink_in, 10.0);
        assert_eq!(s.points[0].uplink_out, 5.0);
        assert_eq!(s.points[1].at_ms, 15_000);
        assert_eq!(s.points[1].uplink_in, 20.0);
        // Under a second since the last sample: no point for it.
        assert_eq!(ring.series(10_500, flow(300)).points.len(), 1);
        // A smaller total is no traffic, never a negative rate.
        assert_eq!(ring.series(20_000, flow(0)).points[1].uplink_in, 0.0);
    }

    #[test]
    fn the_ring_keeps_fifteen_minutes() {
        let mut ring = Ring::default();
        for i in 0..1000 {
            ring.push(i * 10_000, flow(i as u64));
        }
        assert_eq!(ring.samples.len(), KEPT + 1);
        assert_eq!(ring.series(999 * 10_000, flow(999)).points.len(), KEPT);
    }
}
