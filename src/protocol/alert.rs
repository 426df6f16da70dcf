//! The kinds of alert on `ferry/{gateway}/alerts` (`{"kind", "detail",
//! "ts"}`, docs/PROTOCOL.md): a closed set, written on the wire in
//! snake case, the same words everywhere they are named.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    DeadLetter,
    NorthDown,
    BacklogAge,
    DiskBudget,
    BackendSilent,
}

impl AlertKind {
    pub const ALL: [AlertKind; 5] = [
        AlertKind::DeadLetter,
        AlertKind::NorthDown,
        AlertKind::BacklogAge,
        AlertKind::DiskBudget,
        AlertKind::BackendSilent,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::DeadLetter => "dead_letter",
            AlertKind::NorthDown => "north_down",
            AlertKind::BacklogAge => "backlog_age",
            AlertKind::DiskBudget => "disk_budget",
            AlertKind::BackendSilent => "backend_silent",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_written_as_its_name() {
        for kind in AlertKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(serde_json::from_str::<AlertKind>(&json).unwrap(), kind);
        }
    }
}
