//! The `Date` of the admin server's answers, written only from a clock
//! the format can write.
//!
//! An HTTP date runs from 1970 to 9999. A box without a battery-backed
//! clock can boot in 1970 or before, and a bad NTP answer can put it
//! anywhere; the admin server must answer all the same. hyper's own
//! `Date` is turned off (the admin connection's builder), and each answer
//! gets one here: the wall clock's when it lies in that range, none
//! otherwise, as RFC 9110 §6.6.1 asks of a server without a usable clock.
//! (hyper still renders its cached date on every poll of a connection;
//! the vendored httpdate clamps what it cannot write instead of
//! panicking, see vendor/README.md.)
//!
//! Always holds: nothing here panics, whatever the clock says.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderValue};
use axum::response::Response;

/// 9999-12-31T23:59:59Z, the last second an HTTP date can write.
const LAST_SECOND: u64 = 253_402_300_799;

/// `now` as an HTTP date, or `None` outside 1970..=9999.
pub fn http_date(now: SystemTime) -> Option<String> {
    let since = now.duration_since(UNIX_EPOCH).ok()?;
    (since.as_secs() <= LAST_SECOND).then(|| httpdate::fmt_http_date(now))
}

/// Adds `Date` to `response` when the wall clock can be written.
pub async fn stamp(mut response: Response) -> Response {
    if let Some(date) = http_date(SystemTime::now()).and_then(|d| HeaderValue::from_str(&d).ok()) {
        response.headers_mut().insert(header::DATE, date);
    }
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_clock_the_format_can_write_gives_a_date_and_any_other_none() {
        let at = |secs: u64| UNIX_EPOCH + Duration::from_secs(secs);
        assert_eq!(
            http_date(at(784_111_777)).as_deref(),
            Some("Sun, 06 Nov 1994 08:49:37 GMT")
        );
        assert_eq!(
            http_date(UNIX_EPOCH).as_deref(),
            Some("Thu, 01 Jan 1970 00:00:00 GMT")
        );
        assert_eq!(
            http_date(at(LAST_SECOND)).as_deref(),
            Some("Fri, 31 Dec 9999 23:59:59 GMT")
        );
        // 1960-01-01 and 10048-12-29, the clocks tests/admin_hostile.rs
        // runs the binary under.
        assert_eq!(
            http_date(UNIX_EPOCH - Duration::from_secs(315_619_200)),
            None
        );
        assert_eq!(http_date(at(LAST_SECOND + 1)), None);
        assert_eq!(http_date(at(254_948_465_432)), None);
    }
}
