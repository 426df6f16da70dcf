//! ferry: an MQTT edge gateway that bridges field devices to an enterprise
//! backend and proves where every message is.
//!
//! # Layout
//! - [`config`]: the TOML file and `FERRY_*` overrides, checked once.
//! - [`ids`], [`state`], [`backoff`], [`protocol`]: pure types and rules of
//!   docs/PROTOCOL.md — identifiers, the message state machine, resend
//!   delays, and every wire type (both directions, Serialize and
//!   Deserialize) with its topic builders. [`dead_letter`] is the
//!   record of a message given up on; [`deadlines`] is every timer;
//!   [`clip`] bounds every peer-chosen string a log line holds.
//! - [`store`]: SQLite owned by one writer thread, group commit, migrations;
//!   every call one future of `Result<T, StoreError>`. It persists the
//!   pipelines' records (`uplink::record`, `downlink::record`) and never
//!   the reverse.
//! - [`south`]: the seam to the devices' broker, chosen by `south.mode`:
//!   `embedded` (ferry's own rumqttd, receipts and batches delivered straight
//!   to each device's connection, devices held back rather than anything
//!   dropped, presence from the broker's client-event hook) or `external`
//!   (a persistent [`mqtt`] session on the site's broker, each device
//!   message acknowledged there only after its commit, and the backlog it
//!   replays after a reconnect marked, `south::backlog`). The pipelines see
//!   messages in, publishes and acks out, and presence.
//! - [`mqtt`]: the one MQTT client session over rumqttc, used by every
//!   link ferry opens and by [`client`]: reconnect backoff,
//!   re-subscription, ordered manual acks, each publish followed to its
//!   PUBACK so a message a broker refuses is found ([`mqtt::flow`]), and
//!   one of several endpoints at a time ([`mqtt::endpoints`]).
//! - [`north`]: the session to the upstream broker (one of
//!   `north.endpoints` at a time), the retained status, and what arrives
//!   routed to the two pipelines.
//! - [`uplink`]: the pipeline. Device message → per-device limits (rate,
//!   uplinks in flight) → validate → store (dedup,
//!   seq) → `stored` receipt → north → backend ack → `delivered` receipt,
//!   with retries, expiry and dead letters.
//! - [`downlink`]: the other direction. Backend envelope → store (one
//!   message, one queue entry per device with its own seq) → PUBACK and
//!   `stored` receipts north → inbox batches from each device's durable
//!   cursor, one unconfirmed at a time → `confirm`/`read`/`nack` → cursor
//!   commits → `delivered`/`read`/`failed`/`expired` receipts north. Each
//!   receipt north is committed in an outbox with the change it reports and
//!   deleted once the upstream acknowledges it.
//! - [`gateway`]: `run()`, wiring the pieces together: device control
//!   messages go from the uplink intake to the downlink task; the north
//!   session's events are split between the two pipelines.
//! - [`signals`]: SIGHUP, SIGTERM and SIGINT counted from `ferry run`'s
//!   first instruction, so an early one is applied, never fatal.
//! - [`shutdown`]: the signal `run()` gives once, seen by every part, and
//!   the grace it spends in pipeline order: intake stops, what it took is
//!   committed and answered, north is flushed and left, the store closes.
//! - [`ops`]: the operator tools behind `ferry dlq`, `ferry trace` and
//!   `ferry status`: views read on their own read-only connection while the
//!   gateway runs; replays reach the running engine through the store's
//!   `replay_request` table; the gateway keeps a status file for them,
//!   and a lock on its data directory by which they know it runs.
//! - [`systemd`], [`health`]: `READY=1`, `STATUS=` with the backlog, and
//!   the watchdog, fed only while the store writer and the pipeline tasks
//!   answer pings through their own loops.
//! - [`retention`]: the pruner, deleting delivered messages and dead
//!   letters past their retention in small batches through the store, and
//!   delivered ones early while the store is at its disk budget
//!   (`store::budget`); nothing undelivered is ever deleted.
//! - [`alerts`]: dead letters, long north outages, an old backlog and the
//!   disk budget, raised as WARN events and published on
//!   `ferry/{gateway}/alerts` when the link is up.
//! - [`memory`]: hands memory freed after a burst back to the system.
//! - [`client`]: the library for Rust devices and backends (and the tests
//!   and benchmarks) that speaks the protocol from the other side.
//! - `log_events` (tests only): every log line's `event` name is in
//!   docs/OPERATIONS.md's catalogue, at its level, and the reverse.

pub mod admin;
pub mod alerts;
pub mod backoff;
pub mod client;
pub mod clip;
pub mod config;
pub mod dead_letter;
pub mod deadlines;
pub mod downlink;
pub mod gateway;
pub mod health;
pub mod ids;
#[cfg(test)]
mod log_events;
pub mod memory;
pub mod metrics;
pub mod mqtt;
pub mod north;
pub mod ops;
pub mod protocol;
pub mod retention;
pub mod shutdown;
pub mod signals;
pub mod south;
pub mod state;
pub mod store;
pub mod systemd;
pub mod uplink;

pub use gateway::run;
