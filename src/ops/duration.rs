//! Durations an operator types: `90s`, `15m`, `12h`, `30d`.

use std::time::Duration;

/// Parses a whole number followed by one unit: `s`, `m`, `h` or `d`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let Some(unit) = text.chars().last() else {
        return Err("an empty duration: write e.g. 30d, 12h, 15m or 90s".into());
    };
    let per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => {
            return Err(format!(
                "{text:?}: end it with a unit, s, m, h or d (e.g. 30d)"
            ))
        }
    };
    let number = &text[..text.len() - 1];
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: {number:?} is not a whole number"))?;
    n.checked_mul(per)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            "",
            "30",
            "30w",
            "d",
            "-1d",
            "1.5h",
            "h30",
            "99999999999999999999d",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse("30").unwrap_err().contains("unit"));
    }
}
