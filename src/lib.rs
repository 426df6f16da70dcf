//! ferry: an MQTT edge gateway that bridges field devices to an enterprise
//! backend and proves where every message is.
//!
//! # Layout
//!
//! Floors, bottom up. A module imports only from floors below its own
//! (floor 1's plain types may use each other), never in a circle; the
//! architecture test (tests/architecture) reads every file's imports and
//! fails on one that runs up. Data flows one way: devices → [`south`] →
//! [`uplink`] → [`store`] → [`north`], and back through [`downlink`].
//!
//! 1. Plain types and rules, importing nothing of ferry but each other:
//!    [`ids`] (validated identifiers), [`state`] (the message state
//!    machine), [`dead_letter`] (a message given up on, and the one
//!    `Direction`), [`backoff`] (the retry policy and its delays),
//!    [`deadlines`] (every timer), [`clip`] (bounds every peer-chosen
//!    string a log line holds), [`shutdown`] (the signal given once and
//!    the grace spent in pipeline order), [`health`] (pings answered
//!    through each part's own loop), [`memory`] (memory handed back after
//!    a burst), [`signals`] (SIGHUP, SIGTERM and SIGINT counted from the
//!    first instruction), [`live`] (settings handed to a running part). `log_events` (tests only) checks every log
//!    line's `event` against docs/OPERATIONS.md's catalogue.
//! 2. The wire: [`protocol`], every type of docs/PROTOCOL.md (both
//!    directions) with its topic builders, and its own row types.
//! 3. What every part is told and counts: [`config`] (the TOML file and
//!    `FERRY_*` overrides checked once into typed sections with every
//!    bound, the closed choices as enums, the password-file format) and
//!    [`metrics`] (one registry; every counter and gauge is bumped through
//!    a function there).
//! 4. The resources: [`mqtt`] (the one MQTT client session over rumqttc:
//!    reconnect backoff, re-subscription, ordered manual acks, each
//!    publish followed to its PUBACK, one of several endpoints at a time),
//!    [`store`] (SQLite owned by one writer thread, group commit,
//!    migrations, the records it persists; every call one future of
//!    `Result<T, StoreError>`; one gateway per store by a lock on its
//!    database file, whose files it watches), [`status_file`] (the
//!    gateway's live `status.json` and `ferry.pid`).
//! 5. The seams: [`south`] (the devices' broker, `embedded` — ferry's own
//!    rumqttd, receipts delivered straight to each device's connection,
//!    presence from the broker's client-event hook — or `external`, a
//!    persistent session on the site's broker, each device message
//!    acknowledged there only after its commit; and the device door,
//!    `south::door`, where every device publish is held to its sender's
//!    limits, judged, stored and answered for both pipelines), [`north`] (the session
//!    to the upstream broker, its retained status, and a typed receiver
//!    per consumer of what arrives), [`client`] (the library for Rust
//!    devices and backends, and the tests and benchmarks, that speaks the
//!    protocol from the other side).
//! 6. The pipelines and the services beside them: [`uplink`] (a message
//!    the door stored (dedup, seq) and answered `stored` → north →
//!    backend ack → `delivered` receipt, with
//!    retries, expiry and dead letters), [`downlink`] (backend envelope →
//!    store (one queue entry per device with its own seq) → inbox batches
//!    from each device's durable cursor → `confirm`/`read`/`nack` →
//!    receipts north, each committed in an outbox with the change it
//!    reports), [`alerts`] (dead letters, outages, an old backlog, the disk
//!    budget, a silent backend: WARN events, published north),
//!    [`retention`] (the pruner: nothing undelivered is ever deleted),
//!    [`systemd`] (`READY=1`, `STATUS=`, the watchdog). The two pipelines
//!    never import each other; they meet as channels.
//! 7. The operator's views: [`ops`], behind `ferry dlq`, `ferry trace` and
//!    `ferry status`, read on their own read-only connection while the
//!    gateway runs; replays reach the running engine through the store.
//! 8. The operator's HTTP: [`admin`] (`/metrics`, `/healthz`, `/readyz`, the
//!    status page)
//!    over `ops` and `metrics`; and the operator's `systemctl reload`:
//!    [`reload`] (the config checked again, what can change live handed
//!    to its part, the rest named).
//! 9. The wiring: [`gateway`], `run()`: each part built through its own
//!    constructor and handed the channels it reads and writes.
//!
//! The binary (`main.rs` and `cli/`) sits above the library: clap
//! commands, and the one `Exit` type that decides exit codes.

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
pub mod live;
#[cfg(test)]
mod log_events;
pub mod memory;
pub mod metrics;
pub mod mqtt;
pub mod north;
pub mod ops;
pub mod protocol;
pub mod reload;
pub mod retention;
pub mod shutdown;
pub mod signals;
pub mod south;
pub mod state;
pub mod status_file;
pub mod store;
pub mod systemd;
pub mod uplink;

pub use gateway::run;
