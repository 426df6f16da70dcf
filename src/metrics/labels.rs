//! The label sets, each made from the enum it labels: a label value is the
//! enum's own text (`as_str`), so a series can only name a value the enum
//! has.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::dead_letter::Direction;
use crate::protocol::alert::AlertKind;
use crate::protocol::envelope::RejectCode;

impl EncodeLabelValue for Direction {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

impl EncodeLabelValue for AlertKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct Dir {
    pub direction: Direction,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct Kind {
    pub kind: AlertKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct DirReason {
    pub direction: Direction,
    /// The receipt's reason code ([`RejectCode::as_str`]): a short fixed
    /// set, never free text. Kept as the code's text, not the code, since
    /// two codes are one reason on the wire (`nested_too_deep` is
    /// `malformed`) and must be one series.
    pub reason: &'static str,
}

impl DirReason {
    pub fn new(direction: Direction, code: RejectCode) -> DirReason {
        DirReason {
            direction,
            reason: code.as_str(),
        }
    }
}

/// The reasons each direction's intake answers `rejected` with, whose
/// series are made at start.
pub(super) const REJECT_REASONS: [(Direction, &[RejectCode]); 2] = [
    (
        Direction::Up,
        &[
            RejectCode::Malformed,
            RejectCode::TooLarge,
            RejectCode::BadTopic,
            RejectCode::Unauthorized,
            RejectCode::Rate,
            RejectCode::DiskBudget,
        ],
    ),
    (
        Direction::Down,
        &[
            RejectCode::Malformed,
            RejectCode::TooLarge,
            RejectCode::DiskBudget,
        ],
    ),
];

pub(super) fn dir(direction: Direction) -> Dir {
    Dir { direction }
}
