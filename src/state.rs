//! The message state machines (docs/PROTOCOL.md, "Message states").
//!
//! Uplink: `STORED → DELIVERED`, or `STORED → DEAD`. Downlink, per
//! delivery: `STORED → DELIVERED → READ`, with `EXPIRED` and `DEAD` as side
//! exits. No other move exists: the store checks every move it writes with
//! [`MessageState::check_move`] / [`DeliveryState::check_move`], in every
//! build, and refuses an illegal one with [`IllegalMove`]. States are stored
//! as lower-case names so an operator reading the database sees words; a
//! name this build does not know is an error, never a guess.

use std::fmt;

/// A state change the state machine does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal {kind} move {from} -> {to}")]
pub struct IllegalMove {
    /// `"message"` or `"delivery"`.
    pub kind: &'static str,
    pub from: &'static str,
    pub to: &'static str,
}

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
            (MessageState::Stored, MessageState::Delivered)
                | (MessageState::Stored, MessageState::Dead)
        )
    }

    /// The move `self -> to`, or why it is refused.
    pub fn check_move(self, to: MessageState) -> Result<(), IllegalMove> {
        if self.can_move_to(to) {
            return Ok(());
        }
        Err(IllegalMove {
            kind: "message",
            from: self.as_str(),
            to: to.as_str(),
        })
    }
}

impl fmt::Display for MessageState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where one downlink delivery `(message, device)` stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryState {
    /// Queued for the device, committed.
    Stored,
    /// The device confirmed a batch covering it.
    Delivered,
    /// The device's read cursor passed it.
    Read,
    /// Given up before it was delivered (`ttl_s` or the queue cap).
    Expired,
    /// The device nacked it; dead-lettered for this device.
    Dead,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Stored => "stored",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Read => "read",
            DeliveryState::Expired => "expired",
            DeliveryState::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryState> {
        [
            Self::Stored,
            Self::Delivered,
            Self::Read,
            Self::Expired,
            Self::Dead,
        ]
        .into_iter()
        .find(|d| d.as_str() == s)
    }

    /// The status word in receipts north.
    pub fn receipt_status(self) -> &'static str {
        match self {
            DeliveryState::Dead => "failed",
            other => other.as_str(),
        }
    }

    /// Whether the delivery may move to `to`.
    pub fn can_move_to(self, to: DeliveryState) -> bool {
        use DeliveryState::*;
        matches!(
            (self, to),
            (Stored, Delivered)
                | (Stored, Expired)
                | (Stored, Dead)
                | (Delivered, Read)
                | (Delivered, Dead)
        )
    }

    /// The move `self -> to`, or why it is refused.
    pub fn check_move(self, to: DeliveryState) -> Result<(), IllegalMove> {
        if self.can_move_to(to) {
            return Ok(());
        }
        Err(IllegalMove {
            kind: "delivery",
            from: self.as_str(),
            to: to.as_str(),
        })
    }
}

impl fmt::Display for DeliveryState {
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
    fn deliveries_move_forward_only() {
        use DeliveryState as D;
        assert!(D::Stored.can_move_to(D::Delivered));
        assert!(D::Delivered.can_move_to(D::Read));
        assert!(D::Stored.can_move_to(D::Expired));
        assert!(!D::Read.can_move_to(D::Delivered));
        assert!(!D::Expired.can_move_to(D::Delivered));
        assert!(!D::Stored.can_move_to(D::Read), "read only after delivered");
        assert_eq!(D::Dead.receipt_status(), "failed");
        for d in [D::Stored, D::Delivered, D::Read, D::Expired, D::Dead] {
            assert_eq!(D::parse(d.as_str()), Some(d));
        }
    }

    #[test]
    fn names_round_trip() {
        for s in [Stored, Delivered, Dead] {
            assert_eq!(MessageState::parse(s.as_str()), Some(s));
        }
        assert_eq!(MessageState::parse("lost"), None);
    }

    #[test]
    fn an_illegal_move_is_an_error_naming_both_states() {
        assert_eq!(Stored.check_move(Dead), Ok(()));
        let err = Delivered.check_move(Stored).unwrap_err();
        assert_eq!(err.to_string(), "illegal message move delivered -> stored");
        let err = DeliveryState::Read
            .check_move(DeliveryState::Delivered)
            .unwrap_err();
        assert_eq!(err.to_string(), "illegal delivery move read -> delivered");
        assert!(DeliveryState::Stored
            .check_move(DeliveryState::Expired)
            .is_ok());
    }
}
