//! ferry's integration tests: one test binary (as ripgrep's `tests/tests.rs`),
//! so the harness in [`support`] compiles once and every area is a module.
//!
//! Each test starts what it needs (a real Mosquitto, the real `ferry`
//! binary, devices and a backend) on free ports of 127.0.0.1. To add an
//! area, write `tests/{area}.rs` (or `tests/{area}/mod.rs` with files per
//! theme), start it with a `//!` saying what it covers, `use
//! crate::support::...` for the harness, and declare it below.

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
mod clock;
mod config;
mod conformance;
mod device_cli;
mod downlink;
mod edges;
mod examples_c;
mod examples_c_readme;
mod examples_python;
mod examples_python_readme;
mod external;
mod external_doc;
mod external_v5;
mod faults;
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
mod package;
mod passwd_file;
mod power_loss;
mod quickstart;
mod readme_devices;
mod reload;
mod reload_load;
mod robust;
mod sandbox;
mod session_memory;
mod sessions;
mod soak;
mod source_install;
mod sparkplug;
mod status_page;
mod systemd_real;
mod tls;
mod tls_recipe;
mod uplink;
mod v5_broker;
mod versions;
mod websocket;
