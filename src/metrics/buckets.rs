//! The histograms' buckets.

use prometheus_client::metrics::histogram::Histogram;

/// Seconds, from 0.5 ms to ~16 s: commits and receipts.
pub(super) fn fast_buckets() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0,
    ])
}

/// Seconds, from 5 ms to a day: deliveries wait for links and devices.
pub(super) fn slow_buckets() -> Histogram {
    Histogram::new([
        0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14_400.0, 86_400.0,
    ])
}
