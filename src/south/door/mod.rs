//! The device door: everything a device sends is judged here, for both
//! pipelines, before either sees it.
//!
//! - [`intake`] reads the south's [`super::Inbound`] publishes, holds each
//!   device to its [`limits`] (rate, uplinks in flight), reads the topic
//!   (`route.rs`: an uplink, a control, or another device's topic),
//!   judges an uplink's envelope, hands it to the store and, in commit
//!   order, answers the device (`answer.rs`: `stored`, a duplicate's
//!   current receipt, or `rejected` with its dead letter) before passing
//!   new messages on to the uplink engine; controls (`confirm`, `pull`,
//!   `read`, `nack`, `status`) go to the downlink as
//!   [`super::DeviceControl`]s.
//! - A plain device's publish (`south.plain_topics`, no envelope) is
//!   stored as it came under a msg_id of ferry's own (`plain.rs`); its
//!   PUBACK is its only receipt; a Sparkplug B edge node's
//!   (`[south.sparkplug]`) is one too, its seq checked (`sparkplug.rs`).
//! - `judged.rs` holds what both share: intake's configuration, its
//!   verdict on a publish, a message's north packet size.
//! - Every publish's PUBACK (PUBREC) waits for its answer here: after the
//!   commit, or once its refusal is answered ([`super::Ack`]).
//!
//! It sits beside the south that owns the devices' sockets; the uplink and
//! downlink pipelines above it never import it (they read what it hands
//! on: store records and controls, through channels wired in `gateway`).

mod answer;
pub mod intake;
mod judged;
pub mod limits;
mod plain;
mod route;
mod sparkplug;
