//! One edge node's sequence numbers, checked as Sparkplug 3.0 defines
//! them: NBIRTH carries `seq` 0 and a `bdSeq` metric; each NDATA, DBIRTH,
//! DDATA and DDEATH after it carries the previous `seq` + 1, modulo 256;
//! NDEATH carries no `seq`, and its `bdSeq` is the NBIRTH's.

use super::topic::Kind;

/// What sequence checking needs from a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Summary {
    /// The payload's `seq`.
    pub seq: Option<u64>,
    /// The payload's `timestamp`.
    pub timestamp: Option<u64>,
    /// The value of the `bdSeq` metric (NBIRTH and NDEATH carry one).
    pub bd_seq: Option<u64>,
    /// How many metrics the payload holds.
    pub metrics: usize,
}

/// The modulus of `seq`: it runs 0..=255, then 0 again.
const SEQ_MODULUS: u64 = 256;

/// Sequence checking for one edge node (and the devices behind it). It
/// never fixes anything: it says what it saw, and after a gap goes on
/// from the `seq` it got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqCheck {
    /// The session since the last NBIRTH; None before one, or after its
    /// NDEATH.
    session: Option<Session>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Session {
    /// The last `seq` seen.
    seq: u64,
    /// The NBIRTH's `bdSeq`, if it had one.
    bd_seq: Option<u64>,
}

/// What [`SeqCheck::check`] saw in one message: the first problem, in the
/// order the variants are listed, or [`Verdict::InOrder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// As expected (and what NCMD and DCMD, sent by hosts, always get).
    InOrder,
    /// `seq` is not the one expected; checking goes on from `got`.
    Gap {
        /// The `seq` that was due (0 for an NBIRTH).
        expected: u64,
        /// The `seq` the message carried.
        got: u64,
    },
    /// Data (or an NDEATH) before any NBIRTH, or after the node's NDEATH.
    NoBirth,
    /// An NDEATH whose `bdSeq` is not the NBIRTH's: the death of an
    /// earlier session, so the current one goes on.
    BdSeqMismatch {
        /// The NBIRTH's `bdSeq`.
        birth: u64,
        /// The NDEATH's `bdSeq`.
        death: u64,
    },
    /// A message that must carry `seq` has none.
    MissingSeq,
    /// An NBIRTH or NDEATH without a `bdSeq` metric, or an NDEATH after an
    /// NBIRTH without one: the two cannot be matched.
    MissingBdSeq,
}

impl SeqCheck {
    /// A check that has seen nothing yet.
    pub fn new() -> Self {
        SeqCheck::default()
    }

    /// Checks one message of the node, of kind `kind`, and remembers what
    /// the next needs. An NBIRTH always starts a new session (a rebirth
    /// resets); an NDEATH with the birth's `bdSeq` ends it.
    pub fn check(&mut self, kind: Kind, summary: &Summary) -> Verdict {
        match kind {
            Kind::NCmd | Kind::DCmd => Verdict::InOrder,
            Kind::NBirth => {
                self.session = Some(Session {
                    seq: summary.seq.unwrap_or(0),
                    bd_seq: summary.bd_seq,
                });
                match (summary.seq, summary.bd_seq) {
                    (None, _) => Verdict::MissingSeq,
                    (Some(got), _) if got != 0 => Verdict::Gap { expected: 0, got },
                    (Some(_), None) => Verdict::MissingBdSeq,
                    (Some(_), Some(_)) => Verdict::InOrder,
                }
            }
            Kind::NDeath => {
                let Some(session) = self.session else {
                    return Verdict::NoBirth;
                };
                match (session.bd_seq, summary.bd_seq) {
                    (Some(birth), Some(death)) if birth != death => {
                        Verdict::BdSeqMismatch { birth, death }
                    }
                    (Some(_), Some(_)) => {
                        self.session = None;
                        Verdict::InOrder
                    }
                    _ => {
                        self.session = None;
                        Verdict::MissingBdSeq
                    }
                }
            }
            Kind::NData | Kind::DBirth | Kind::DData | Kind::DDeath => {
                let Some(session) = &mut self.session else {
                    return Verdict::NoBirth;
                };
                let Some(got) = summary.seq else {
                    return Verdict::MissingSeq;
                };
                let expected = (session.seq % SEQ_MODULUS + 1) % SEQ_MODULUS;
                session.seq = got;
                if got == expected {
                    Verdict::InOrder
                } else {
                    Verdict::Gap { expected, got }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(seq: u64) -> Summary {
        Summary {
            seq: Some(seq),
            ..Summary::default()
        }
    }

    fn birth(bd_seq: u64) -> Summary {
        Summary {
            seq: Some(0),
            bd_seq: Some(bd_seq),
            ..Summary::default()
        }
    }

    fn death(bd_seq: u64) -> Summary {
        Summary {
            bd_seq: Some(bd_seq),
            ..Summary::default()
        }
    }

    #[test]
    fn in_order_across_the_wrap_from_255_to_0() {
        let mut check = SeqCheck::new();
        assert_eq!(check.check(Kind::NBirth, &birth(3)), Verdict::InOrder);
        assert_eq!(check.check(Kind::DBirth, &seq(1)), Verdict::InOrder);
        for n in 2..=255 {
            let kind = if n % 2 == 0 { Kind::NData } else { Kind::DData };
            assert_eq!(check.check(kind, &seq(n)), Verdict::InOrder, "seq {n}");
        }
        assert_eq!(check.check(Kind::DData, &seq(0)), Verdict::InOrder);
        assert_eq!(check.check(Kind::DDeath, &seq(1)), Verdict::InOrder);
        // Commands come from hosts: no seq, and they do not move it.
        assert_eq!(
            check.check(Kind::NCmd, &Summary::default()),
            Verdict::InOrder
        );
        assert_eq!(
            check.check(Kind::DCmd, &Summary::default()),
            Verdict::InOrder
        );
        assert_eq!(check.check(Kind::NData, &seq(2)), Verdict::InOrder);
        assert_eq!(check.check(Kind::NDeath, &death(3)), Verdict::InOrder);
    }

    #[test]
    fn a_gap_is_reported_and_checking_goes_on_from_what_came() {
        let mut check = SeqCheck::new();
        check.check(Kind::NBirth, &birth(0));
        assert_eq!(check.check(Kind::NData, &seq(1)), Verdict::InOrder);
        assert_eq!(
            check.check(Kind::NData, &seq(5)),
            Verdict::Gap {
                expected: 2,
                got: 5
            }
        );
        assert_eq!(check.check(Kind::NData, &seq(6)), Verdict::InOrder);
        // A repeat is a gap too.
        assert_eq!(
            check.check(Kind::DData, &seq(6)),
            Verdict::Gap {
                expected: 7,
                got: 6
            }
        );
        assert_eq!(check.check(Kind::DData, &seq(7)), Verdict::InOrder);
        // A message without seq changes nothing.
        assert_eq!(
            check.check(Kind::NData, &Summary::default()),
            Verdict::MissingSeq
        );
        assert_eq!(check.check(Kind::NData, &seq(8)), Verdict::InOrder);
    }

    #[test]
    fn data_before_any_birth_is_reported() {
        let mut check = SeqCheck::new();
        for kind in [Kind::NData, Kind::DBirth, Kind::DData, Kind::DDeath] {
            assert_eq!(check.check(kind, &seq(0)), Verdict::NoBirth, "{kind:?}");
        }
        assert_eq!(check.check(Kind::NDeath, &death(0)), Verdict::NoBirth);
        assert_eq!(check.check(Kind::NBirth, &birth(0)), Verdict::InOrder);
        assert_eq!(check.check(Kind::NData, &seq(1)), Verdict::InOrder);
        // After the node's death, data again needs a birth.
        assert_eq!(check.check(Kind::NDeath, &death(0)), Verdict::InOrder);
        assert_eq!(check.check(Kind::NData, &seq(2)), Verdict::NoBirth);
    }

    #[test]
    fn a_death_with_another_bd_seq_is_reported_and_the_session_goes_on() {
        let mut check = SeqCheck::new();
        check.check(Kind::NBirth, &birth(7));
        assert_eq!(
            check.check(Kind::NDeath, &death(6)),
            Verdict::BdSeqMismatch { birth: 7, death: 6 }
        );
        assert_eq!(check.check(Kind::NData, &seq(1)), Verdict::InOrder);
        assert_eq!(check.check(Kind::NDeath, &death(7)), Verdict::InOrder);
        // An NDEATH without bdSeq cannot be matched; it still ends the session.
        check.check(Kind::NBirth, &birth(8));
        assert_eq!(
            check.check(Kind::NDeath, &Summary::default()),
            Verdict::MissingBdSeq
        );
        assert_eq!(check.check(Kind::NData, &seq(1)), Verdict::NoBirth);
    }

    #[test]
    fn a_rebirth_resets_the_sequence() {
        let mut check = SeqCheck::new();
        check.check(Kind::NBirth, &birth(1));
        for n in 1..=40 {
            check.check(Kind::NData, &seq(n));
        }
        assert_eq!(check.check(Kind::NBirth, &birth(2)), Verdict::InOrder);
        assert_eq!(check.check(Kind::NData, &seq(1)), Verdict::InOrder);
        // The new birth's bdSeq is the one an NDEATH must carry now.
        assert_eq!(
            check.check(Kind::NDeath, &death(1)),
            Verdict::BdSeqMismatch { birth: 2, death: 1 }
        );
        assert_eq!(check.check(Kind::NDeath, &death(2)), Verdict::InOrder);
    }

    #[test]
    fn a_birth_is_checked_for_seq_zero_and_a_bd_seq() {
        let mut check = SeqCheck::new();
        assert_eq!(
            check.check(
                Kind::NBirth,
                &Summary {
                    seq: Some(4),
                    bd_seq: Some(0),
                    ..Summary::default()
                }
            ),
            Verdict::Gap {
                expected: 0,
                got: 4
            }
        );
        // Checking goes on from the seq the birth had.
        assert_eq!(check.check(Kind::NData, &seq(5)), Verdict::InOrder);
        assert_eq!(check.check(Kind::NBirth, &death(0)), Verdict::MissingSeq);
        assert_eq!(check.check(Kind::NData, &seq(1)), Verdict::InOrder);
        assert_eq!(check.check(Kind::NBirth, &seq(0)), Verdict::MissingBdSeq);
        assert_eq!(check.check(Kind::NData, &seq(1)), Verdict::InOrder);
        assert_eq!(check.check(Kind::NDeath, &death(0)), Verdict::MissingBdSeq);
    }

    #[test]
    fn the_state_is_a_few_integers() {
        assert!(std::mem::size_of::<SeqCheck>() <= 40);
    }
}
