//! Durations an operator types (`90s`, `15m`, `12h`, `30d`) and the moment
//! that long before now.
//!
//! Nothing here wraps: a parsed duration fits in i64 milliseconds (what a
//! timestamp in the store is), and a moment [`before`] now is never before
//! the Unix epoch nor after now. Anything else is refused with the reason.

use std::time::Duration;

/// The longest duration [`parse`] reads: `i64::MAX` milliseconds (about
/// 292 million years), what a timestamp in the store can hold.
pub const MAX: Duration = Duration::from_millis(i64::MAX as u64);

/// Why a duration was refused; its text is the line the operator sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("an empty duration: write e.g. 30d, 12h, 15m or 90s")]
    Empty,
    #[error("{0:?}: end it with a unit, s, m, h or d (e.g. 30d)")]
    NoUnit(String),
    #[error("{text:?}: {number:?} is not a whole number")]
    NotANumber { text: String, number: String },
    #[error("{0:?} is longer than the clock can count (about 292 million years)")]
    TooLong(String),
    #[error(
        "{0:?} reaches back before 1970-01-01, where the clock starts: nothing is that old; \
         give a shorter one (e.g. 365d)"
    )]
    BeforeEpoch(String),
}

/// Parses a whole number followed by one unit: `s`, `m`, `h` or `d`; at
/// most [`MAX`].
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    let Some(unit) = text.chars().last() else {
        return Err(DurationError::Empty);
    };
    let per: u64 = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(DurationError::NoUnit(text.into())),
    };
    let number = &text[..text.len() - unit.len_utf8()];
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(DurationError::NotANumber {
            text: text.into(),
            number: number.into(),
        });
    }
    // All digits: a number that does not parse is too large for u64.
    let too_long = || DurationError::TooLong(text.into());
    let secs = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(per))
        .ok_or_else(too_long)?;
    let age = Duration::from_secs(secs);
    if age > MAX {
        return Err(too_long());
    }
    Ok(age)
}

/// `age` before `now_ms`, in milliseconds since the epoch; `None` if that
/// is before the epoch (or `age` is past [`MAX`]).
pub fn cutoff(now_ms: i64, age: Duration) -> Option<i64> {
    let age_ms = i64::try_from(age.as_millis()).ok()?;
    now_ms.checked_sub(age_ms).filter(|ms| *ms >= 0)
}

/// The moment `text` (a duration, as [`parse`] reads it) before `now_ms`,
/// in milliseconds since the epoch: never before the epoch, never after
/// now.
pub fn before(text: &str, now_ms: i64) -> Result<i64, DurationError> {
    let age = parse(text)?;
    cutoff(now_ms, age).ok_or_else(|| DurationError::BeforeEpoch(text.trim().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01 00:00:00Z.
    const NOW_MS: i64 = 1_796_083_200_000;

    #[test]
    fn every_unit_is_read() {
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse("30d"), Ok(Duration::from_secs(2_592_000)));
        assert_eq!(parse(" 0d "), Ok(Duration::ZERO));
    }

    #[test]
    fn a_missing_or_unknown_unit_or_number_is_refused() {
        for bad in [
            "", "30", "30w", "d", "-1d", "+1d", "1.5h", "h30", "1_0d", "30dé",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(matches!(parse("30"), Err(DurationError::NoUnit(_))));
        assert!(matches!(
            parse("-1d"),
            Err(DurationError::NotANumber { .. })
        ));
    }

    #[test]
    fn the_longest_duration_read_is_what_a_timestamp_holds_and_longer_is_too_long() {
        // i64::MAX ms is 106,751,991,167 days and a bit.
        let longest = parse("106751991167d").expect("within i64 milliseconds");
        assert!(longest <= MAX);
        for bad in [
            "106751991168d",
            "9223372036854776s",
            "213503982334d",
            "99999999999999d",
            "18446744073709551615s",
            "99999999999999999999d",
        ] {
            assert_eq!(
                parse(bad),
                Err(DurationError::TooLong(bad.into())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_cutoff_is_the_age_before_now_and_never_before_the_epoch() {
        assert_eq!(before("1h", NOW_MS), Ok(NOW_MS - 3_600_000));
        assert_eq!(before("0s", NOW_MS), Ok(NOW_MS));
        // Exactly back to the epoch is the epoch.
        assert_eq!(
            cutoff(NOW_MS, Duration::from_millis(NOW_MS as u64)),
            Some(0)
        );
        assert_eq!(
            cutoff(NOW_MS, Duration::from_millis(NOW_MS as u64 + 1)),
            None
        );
        for far in ["20789d", "106751991167d"] {
            assert_eq!(
                before(far, NOW_MS),
                Err(DurationError::BeforeEpoch(far.into()))
            );
        }
        // Ages that used to wrap into a cutoff in the future.
        for wrapped in ["213503982334d", "99999999999999d"] {
            assert!(before(wrapped, NOW_MS).is_err(), "{wrapped}");
        }
        assert_eq!(cutoff(NOW_MS, Duration::MAX), None);
    }
}
