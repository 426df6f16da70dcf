//! The admin server under a wall clock an HTTP date cannot say: hyper
//! formatted its `Date` from it on every request and panicked, so the
//! gateway answered nothing on /healthz while it ran on.

use crate::support::admin::get_as;
use crate::support::faketime::FakeClock;

use super::{lone_ferry, ROUTES};

/// Starts a gateway under `clock` (libfaketime's syntax) and asks every
/// route: each answers with a status and a body, without a `Date` (the
/// clock cannot be written as one), and the log has no panic. `year`
/// starts the log's timestamps under that clock.
fn every_route_answers_under(clock: &str, gateway: &str, year: &str) {
    let clock = FakeClock::new(clock);
    let ferry = lone_ferry(|opts| clock.on(opts), gateway);
    let port = ferry.admin_port.expect("admin on");
    let host = format!("127.0.0.1:{port}");
    for path in ROUTES {
        let answer = get_as(port, Some(&host), path).unwrap_or_else(|| {
            panic!(
                "GET {path} under a clock in {year}: no answer\n--- ferry log ---\n{}",
                ferry.log_tail()
            )
        });
        let expected: &[u16] = match *path {
            // The first health check may not have run yet.
            "/healthz" | "/readyz" => &[200, 503],
            "/api/dlq/1" | "/api/trace/press-1/m-1" | "/no-such-path" => &[404],
            _ => &[200],
        };
        assert!(
            expected.contains(&answer.status) && !answer.body.is_empty(),
            "GET {path} under a clock in {year}: {answer:?}"
        );
        assert_eq!(answer.header("date"), None, "GET {path}: {answer:?}");
        if answer.status == 404 {
            assert!(!answer.json_error().is_empty());
        }
    }
    let status: serde_json::Value = serde_json::from_str(
        &get_as(port, Some(&host), "/api/status")
            .expect("answered")
            .body,
    )
    .expect("/api/status is JSON");
    assert_eq!(status["running"], true, "{status}");
    let log = ferry.log();
    assert!(!log.contains("panicked"), "{log}");
    // The log's own timestamps say the year: the clock was faked.
    assert!(
        log.lines().any(|l| l.starts_with(year)),
        "{}",
        ferry.log_tail()
    );
}

#[test]
fn every_admin_route_answers_under_a_wall_clock_before_1970() {
    every_route_answers_under("@1960-01-01 00:00:00", "gw-admin-1960", "1960-");
}

#[test]
fn every_admin_route_answers_under_a_wall_clock_after_9999() {
    // libfaketime takes no five-digit year in a date, but does in an
    // offset: about 8,000 years on, in 10048.
    every_route_answers_under("+2930000d", "gw-admin-10048", "+100");
}
