//! A message given up on at the door: why, where it came from, and its raw
//! bytes, for the `dead_letter` table. Both pipelines make these; the store
//! persists them.
//!
//! [`Direction`] is the one name for which way a message goes, everywhere:
//! its text (`up`, `down`) is what the `direction` columns hold, what the
//! CLI and the JSON views print and take, and the metrics' label value; a
//! text that is neither is an error, never a guess.

use std::fmt;

use bytes::Bytes;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use serde::Serialize;

/// Which way a message goes: `up` (device → backend) or `down`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Up,
    Down,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Up, Direction::Down];

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
        }
    }

    /// The direction named `s` (`up` or `down`, as [`Direction::as_str`]
    /// writes it).
    pub fn parse(s: &str) -> Option<Direction> {
        Direction::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ToSql for Direction {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for Direction {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Direction> {
        let text = value.as_str()?;
        Direction::parse(text)
            .ok_or_else(|| FromSqlError::Other(format!("unknown direction {text:?}").into()))
    }
}

/// A message that was never accepted (malformed, too large, bad topic), or
/// a receipt north the upstream would never take.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub direction: Direction,
    pub device: Option<String>,
    pub msg_id: Option<String>,
    pub topic: String,
    pub reason: String,
    pub raw: Bytes,
    pub at_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direction_reads_back_what_it_writes_and_nothing_else() {
        for d in Direction::ALL {
            assert_eq!(Direction::parse(d.as_str()), Some(d));
            assert_eq!(d.to_string(), d.as_str());
            assert_eq!(
                serde_json::to_string(&d).unwrap(),
                format!("\"{}\"", d.as_str())
            );
        }
        assert_eq!(Direction::parse("Up"), None);
        assert_eq!(Direction::parse(""), None);
    }

    #[test]
    fn a_direction_is_its_text_in_sql() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for d in Direction::ALL {
            let text: String = conn.query_row("SELECT ?1", [d], |r| r.get(0)).unwrap();
            assert_eq!(text, d.as_str());
            let back: Direction = conn
                .query_row("SELECT ?1", [d.as_str()], |r| r.get(0))
                .unwrap();
            assert_eq!(back, d);
        }
        let bad = conn.query_row("SELECT 'sideways'", [], |r| r.get::<_, Direction>(0));
        assert!(bad.is_err());
    }

    #[test]
    fn the_cli_takes_the_same_words() {
        use clap::ValueEnum;
        for d in Direction::ALL {
            assert_eq!(Direction::from_str(d.as_str(), false), Ok(d));
        }
    }
}
