//! Client library for programs that talk to ferry: a Rust device
//! ([`device::DeviceClient`]) and a backend ([`backend::BackendClient`]),
//! both on [`crate::mqtt`] sessions, both doing their half of
//! docs/PROTOCOL.md through the wire types of [`crate::protocol`]:
//!
//! - a device announces itself (`status`, and `{"online": false}` as its
//!   last will), pulls its backlog on every connect, drops inbox entries at
//!   or below its own cursor, confirms only when the application says it
//!   committed, and resends each uplink until it has a final answer
//!   (`stored` or better, `rejected`, `failed`; a `rejected` with reason
//!   `rate` is not final: nothing was kept, so it goes again after the
//!   receipt timeout);
//! - a backend acks uplinks, resends each downlink until every recipient
//!   has a `stored` receipt, and receives receipts.
//!
//! Every topic comes from [`crate::protocol::topics`] and every body is one
//! of [`crate::protocol`]'s wire types, the same ones the gateway reads and
//! writes. Events hand the application the typed message (an uplink's or
//! a batch entry's own payload stays the application's JSON); what is not
//! one of the protocol's messages is logged and skipped.
//!
//! Both reconnect with exponential backoff and jitter (the session's).

pub mod backend;
pub mod device;
mod resends;
