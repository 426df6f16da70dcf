//! ferry's integration tests: one test binary (as ripgrep's `tests/tests.rs`),
//! so the harness in [`support`] compiles once and every area is a module.
//!
//! Each test starts what it needs (a real Mosquitto, the real `ferry`
//! binary, devices and a backend) on free ports of 127.0.0.1. To add an
//! area, write `tests/{area}.rs` (or `tests/{area}/mod.rs` with files per
//! theme), start it with a `//!` saying what it covers, `use
//! crate::support::...` for the harness, and declare it below.
//!
//! Two sets. `cargo test` runs the fast one: unprivileged, needing only
//! Mosquitto and its clients (`mosquitto`, `mosquitto_pub`, `_sub`, `_rr`,
//! `mosquitto_passwd`: Debian's mosquitto and mosquitto-clients). The
//! `system-tests` feature turns on the rest, each needing something more
//! of the machine: root (a tmpfs that fills, a mount namespace, useradd,
//! dpkg, systemd-nspawn, podman), headless Chromium, libfaketime, gcc and C
//! libraries, Python with paho-mqtt, Node.js with MQTT.js, the openssl
//! command or Debian's stock Mosquitto config. `./scripts/test.sh`
//! installs all of it and runs both. A module that is system as a whole
//! is gated below; one that is only in part gates its own tests. Either
//! way a test whose tool is missing fails saying how to get it; none
//! skips.

/// Runs the test function `$name(mode: Mode)` once per south mode, as
/// `$name::embedded` and `$name::external` (a module and a function may
/// share a name).
macro_rules! both_modes {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                super::$name(crate::support::Mode::Embedded).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn external() {
                super::$name(crate::support::Mode::External).await
            }
        }
    };
}

mod support;

mod admin;
mod admin_edges;
mod architecture;
mod auth;
mod budget;
#[cfg(feature = "system-tests")]
mod clock;
mod config;
mod conformance;
#[cfg(feature = "system-tests")]
mod container;
mod device_cli;
mod downlink;
mod edges;
#[cfg(feature = "system-tests")]
mod examples_c;
#[cfg(feature = "system-tests")]
mod examples_c_readme;
#[cfg(feature = "system-tests")]
mod examples_python;
#[cfg(feature = "system-tests")]
mod examples_python_readme;
mod external;
mod external_doc;
mod external_v5;
#[cfg(feature = "system-tests")]
mod faults;
#[cfg(feature = "system-tests")]
mod fleet;
mod hostile;
mod integrity;
mod isolation;
mod lifecycle;
mod limits;
mod logs;
mod mosquitto_passwd;
mod north_errors;
mod operate;
mod ops;
mod ops_edges;
#[cfg(feature = "system-tests")]
mod package;
mod passwd_file;
#[cfg(feature = "system-tests")]
mod power_loss;
mod quickstart;
#[cfg(feature = "system-tests")]
mod readme_devices;
mod reload;
mod reload_load;
mod robust;
#[cfg(feature = "system-tests")]
mod sandbox;
mod session_memory;
mod sessions;
mod soak;
#[cfg(feature = "system-tests")]
mod source_install;
mod sparkplug;
#[cfg(feature = "system-tests")]
mod status_page;
#[cfg(feature = "system-tests")]
mod systemd_real;
mod tls;
#[cfg(feature = "system-tests")]
mod tls_recipe;
mod uplink;
mod v5_broker;
mod versions;
#[cfg(feature = "system-tests")]
mod websocket;
