//! ferry attacked from outside, as a hostile device, a careless operator
//! and a clumsy backend would (issue 15's findings): every path into the
//! embedded broker gets the same checks (wills included), reconnects are
//! served, what a peer chooses never grows the log without bound, and
//! numbers from peers and operators never wrap.

mod connects;
mod paths;
mod reconnects;
mod signals;
mod wills;
