//! The message state machine (docs/PROTOCOL.md, "Message states").
//!
//! `STORED → DELIVERED`, or `STORED → DEAD`. No other move exists, and the
//! store only writes a move this module allows; the state is stored as its
//! lower-case name so an operator reading the database sees words.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageState {
    /// Committed to the store, fsynced; not yet confirmed by the receiver.
    Stored,
    /// The receiving application confirmed it committed the message.
    Delivered,
    /// In the dead-letter table with a reason; never sent again.
    Dead,
}

impl MessageState {
    pub fn as_str(self) -> &'static str {
        match self {
            MessageState::Stored => "stored",
            MessageState::Delivered => "delivered",
            MessageState::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<MessageState> {
        match s {
            "stored" => Some(MessageState::Stored),
            "delivered" => Some(MessageState::Delivered),
            "dead" => Some(MessageState::Dead),
            _ => None,
        }
    }

    /// Whether a message in `self` may move to `to`.
    pub fn can_move_to(self, to: MessageState) -> bool {
        matches!(
            (self, to),
            (MessageState::Stored, MessageState::Delivered) | (MessageState::Stored, MessageState::Dead)
        )
    }

    /// Final states are never left.
    pub fn is_final(self) -> bool {
        !matches!(self, MessageState::Stored)
    }
}

impl fmt::Display for MessageState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::MessageState::*;
    use super::*;

    #[test]
    fn only_stored_messages_move() {
        assert!(Stored.can_move_to(Delivered));
        assert!(Stored.can_move_to(Dead));
        for from in [Delivered, Dead] {
            for to in [Stored, Delivered, Dead] {
                assert!(!from.can_move_to(to), "{from} -> {to} must be refused");
            }
        }
        assert!(!Stored.can_move_to(Stored));
    }

    #[test]
    fn names_round_trip() {
        for s in [Stored, Delivered, Dead] {
            assert_eq!(MessageState::parse(s.as_str()), Some(s));
        }
        assert_eq!(MessageState::parse("lost"), None);
        assert!(Delivered.is_final() && Dead.is_final() && !Stored.is_final());
    }
}
