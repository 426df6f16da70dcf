use super::*;
use std::time::Duration;

fn dev(id: &str) -> Sender {
    Some(DeviceId::new(id).unwrap())
}

fn limiter(per_s: f64, burst: u32) -> RateLimiter {
    RateLimiter::new(RateLimit { per_s, burst })
}

const PASS: Take = Take::Pass {
    recovered: None,
    status: None,
};

#[test]
fn a_device_gets_its_burst_at_once_then_its_rate() {
    let (mut r, t0) = (limiter(10.0, 5), Instant::now());
    let a = dev("a");
    for _ in 0..5 {
        assert_eq!(r.take(&a, t0), PASS);
    }
    assert_eq!(r.take(&a, t0), Take::Limited { first: true });
    assert_eq!(r.take(&a, t0), Take::Limited { first: false });
    // 10 a second: one token back every 100 ms.
    assert_eq!(
        r.take(&a, t0 + Duration::from_millis(50)),
        Take::Limited { first: false }
    );
    assert_eq!(r.take(&a, t0 + Duration::from_millis(100)), PASS);
    assert_eq!(
        r.take(&a, t0 + Duration::from_millis(100)),
        Take::Limited { first: false }
    );
}

#[test]
fn one_device_over_its_rate_leaves_another_untouched() {
    let (mut r, t0) = (limiter(1.0, 2), Instant::now());
    for _ in 0..10 {
        r.take(&dev("loud"), t0);
    }
    assert_eq!(r.take(&dev("quiet"), t0), PASS);
    assert_eq!(r.take(&dev("quiet"), t0), PASS);
}

#[test]
fn a_device_is_back_when_its_bucket_is_full_again_and_says_how_many_were_refused() {
    let (mut r, t0) = (limiter(10.0, 2), Instant::now());
    let a = dev("a");
    for _ in 0..5 {
        r.take(&a, t0);
    }
    // Half refilled: within the rate again, not yet back.
    assert_eq!(r.take(&a, t0 + Duration::from_millis(100)), PASS);
    assert_eq!(
        r.take(&a, t0 + Duration::from_millis(400)),
        Take::Pass {
            recovered: Some(3),
            status: None
        }
    );
    assert_eq!(r.take(&a, t0 + Duration::from_millis(400)), PASS, "once");
}

#[test]
fn full_buckets_are_swept_away_and_limited_ones_report_their_count() {
    let (mut r, t0) = (limiter(10.0, 2), Instant::now());
    r.take(&dev("calm"), t0);
    for _ in 0..4 {
        r.take(&dev("loud"), t0);
    }
    assert_eq!(r.len(), 2);
    assert!(r.sweep(t0).is_empty(), "neither is full yet");
    assert_eq!(r.len(), 2);
    // calm needs 100 ms for its one token, loud 200 ms for two.
    assert!(r.sweep(t0 + Duration::from_millis(100)).is_empty());
    assert_eq!(r.len(), 1, "calm is gone without a word");
    assert_eq!(
        r.sweep(t0 + Duration::from_millis(200)),
        vec![Swept {
            sender: dev("loud"),
            limited: 2,
            status: None
        }]
    );
    assert_eq!(r.len(), 0);
    // A swept device starts again with a full bucket.
    assert_eq!(r.take(&dev("loud"), t0 + Duration::from_millis(200)), PASS);
}

#[test]
fn a_status_said_over_the_rate_is_held_and_the_latest_passed_on_once() {
    let (mut r, t0) = (limiter(10.0, 1), Instant::now());
    let a = dev("a");
    r.take(&a, t0);
    assert_eq!(r.take(&a, t0), Take::Limited { first: true });
    r.hold_status(&a, false);
    r.take(&a, t0);
    r.hold_status(&a, true);
    assert_eq!(
        r.take(&a, t0 + Duration::from_millis(100)),
        Take::Pass {
            recovered: Some(2),
            status: Some(true)
        },
        "with its next publish within the rate"
    );
    assert_eq!(r.take(&a, t0 + Duration::from_millis(200)), PASS);
    // Or with the sweep, when it says nothing more.
    r.take(&a, t0 + Duration::from_millis(200));
    r.hold_status(&a, false);
    assert_eq!(
        r.sweep(t0 + Duration::from_secs(1)),
        vec![Swept {
            sender: a,
            limited: 1,
            status: Some(false)
        }]
    );
}

#[test]
fn publishers_without_a_device_id_share_one_bucket() {
    let (mut r, t0) = (limiter(1.0, 2), Instant::now());
    assert_eq!(r.take(&None, t0), PASS);
    assert_eq!(r.take(&None, t0), PASS);
    assert_eq!(r.take(&None, t0), Take::Limited { first: true });
    assert_eq!(r.len(), 1);
}

#[test]
fn uplinks_in_flight_are_bounded_per_device_and_forgotten_at_zero() {
    let mut f = InFlight::new(2);
    let (a, b) = (dev("a"), dev("b"));
    assert_eq!(f.admit(&a), Admit::Pass);
    assert_eq!(f.admit(&a), Admit::Pass);
    assert_eq!(f.admit(&a), Admit::Limited { first: true });
    assert_eq!(f.admit(&a), Admit::Limited { first: false });
    assert_eq!(f.admit(&b), Admit::Pass, "another device is not held up");
    assert_eq!(f.answered(&a), None);
    assert_eq!(f.admit(&a), Admit::Pass, "room again");
    assert_eq!(f.answered(&a), None);
    assert_eq!(f.answered(&a), Some(2), "none left: back, with its count");
    assert_eq!(f.answered(&b), None, "never limited");
    assert_eq!(f.len(), 0);
    assert_eq!(f.answered(&a), None, "an unknown sender is no error");
}

#[test]
fn a_device_is_reported_seen_once_a_second_however_much_it_sends() {
    let mut limits = Limits::new(
        RateLimit {
            per_s: 1000.0,
            burst: 1000,
        },
        16,
    );
    let (a, b) = (DeviceId::new("a").unwrap(), DeviceId::new("b").unwrap());
    let start = Instant::now();
    assert!(limits.report_seen(&a, start));
    assert!(!limits.report_seen(&a, start + Duration::from_millis(10)));
    assert!(limits.report_seen(&b, start + Duration::from_millis(20)));
    assert!(!limits.report_seen(&a, start + Duration::from_millis(999)));
    assert!(limits.report_seen(&a, start + Duration::from_millis(1000)));
    assert!(!limits.report_seen(&a, start + Duration::from_millis(1500)));
}
