//! Resend delays: exponential backoff with jitter (docs/PROTOCOL.md, North).
//!
//! The k-th resend (k = 0 for the first) waits `d·(1 − jitter·u)` with
//! `d = min(max, base·2^k)` and `u` uniform in [0, 1). The delay is therefore
//! always in `(d·(1 − jitter), d]` and never above `max`.
//!
//! [`RetryConfig`] is the policy these delays are drawn from; it is a plain
//! value, checked where it is built.

use std::time::Duration;

/// A resend policy: delays from `base` doubling up to `max`, each shortened
/// by up to `jitter` (a fraction in [0, 1]), and `max_attempts` attempts
/// before the sender gives up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryConfig {
    pub base: Duration,
    pub max: Duration,
    pub max_attempts: u32,
    pub jitter: f64,
}

/// The delay before resend `k`, for a given uniform sample `u` in [0, 1).
pub fn delay(cfg: &RetryConfig, k: u32, u: f64) -> Duration {
    let d = cap(cfg.base, cfg.max, k);
    let factor = 1.0 - cfg.jitter * u.clamp(0.0, 1.0);
    d.mul_f64(factor)
}

/// The delay before resend `k` with a fresh random sample.
pub fn delay_random(cfg: &RetryConfig, k: u32) -> Duration {
    delay(cfg, k, rand::random::<f64>())
}

/// `min(max, base·2^k)` without overflow.
fn cap(base: Duration, max: Duration, k: u32) -> Duration {
    let factor = 1u32.checked_shl(k.min(31)).unwrap_or(u32::MAX);
    base.checked_mul(factor).map_or(max, |d| d.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(jitter: f64) -> RetryConfig {
        RetryConfig {
            base: Duration::from_millis(100),
            max: Duration::from_millis(5_000),
            max_attempts: 10,
            jitter,
        }
    }

    #[test]
    fn delays_double_until_the_cap() {
        let c = cfg(0.0);
        let got: Vec<u128> = (0..8).map(|k| delay(&c, k, 0.5).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }

    #[test]
    fn huge_attempt_numbers_stay_at_the_cap() {
        let c = cfg(0.0);
        assert_eq!(delay(&c, 63, 0.0), Duration::from_millis(5_000));
        assert_eq!(delay(&c, u32::MAX, 0.0), Duration::from_millis(5_000));
    }

    #[test]
    fn jitter_only_shortens_within_its_fraction() {
        let c = cfg(0.2);
        assert_eq!(delay(&c, 2, 0.0), Duration::from_millis(400));
        assert_eq!(delay(&c, 2, 0.5), Duration::from_millis(360));
        for k in 0..20 {
            let d = cap(c.base, c.max, k);
            for _ in 0..200 {
                let got = delay_random(&c, k);
                assert!(got <= d, "k={k}: {got:?} > {d:?}");
                assert!(
                    got > d.mul_f64(0.8) - Duration::from_nanos(1),
                    "k={k}: {got:?} too short"
                );
            }
        }
    }

    #[test]
    fn random_jitter_spreads_delays() {
        let c = cfg(1.0);
        let samples: std::collections::HashSet<_> = (0..50).map(|_| delay_random(&c, 3)).collect();
        assert!(
            samples.len() > 10,
            "jitter produced only {} distinct delays",
            samples.len()
        );
    }
}
