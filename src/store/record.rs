//! The records the store persists and hands back, one module per
//! direction: plain data, built and read on the caller's side of the
//! channel, so the writer thread only binds and reads columns.
//!
//! - [`uplink`]: a message on its way in, a stored message waiting for the
//!   backend, a duplicate's current state, and the moves asked of it.
//! - [`downlink`]: a message for one or more devices, inbox batches,
//!   cursors and their moves, the receipts committed with them, and the
//!   words of every reason a delivery ends with.
//! - [`refusal`]: a message refused at the door as its dead letter keeps
//!   it, and what became of it.

pub mod downlink;
pub mod refusal;
pub mod uplink;
