//! The `ferry` commands (clap): [`Cli`] names them all; `run` starts the
//! gateway (in `main.rs`, which owns the process: signals, logging, the
//! runtime), every other command is a tool here that does its job and
//! answers with an [`Exit`].
//!
//! - [`ops`]: `dlq`, `trace` and `status`, over the library's `ops` views;
//! - [`passwd`]: `passwd`, a password file's line rewritten;
//! - [`device`]: `device`, a device on the command line (`pub`, `listen`);
//! - `check-config` ([`check_config`]);
//! - [`output`]: how every command writes stdout (never `println!`);
//! - [`exit`]: the one place exit codes are written.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use ferry::config::Config;

pub mod device;
pub mod exit;
pub mod ops;
pub mod output;
pub mod passwd;

pub use exit::Exit;

#[derive(Parser)]
#[command(
    name = "ferry",
    version,
    about = "MQTT edge gateway: durable store-and-forward between field devices and a backend"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the gateway.
    Run {
        /// The config file [default: /etc/ferry/ferry.toml, where the package
        /// puts it].
        #[arg(long, short, value_name = "FILE", default_value = ferry::config::DEFAULT_FILE, hide_default_value = true)]
        config: PathBuf,
    },
    /// Check a config file (and FERRY_* overrides) and exit.
    CheckConfig {
        /// The config file [default: /etc/ferry/ferry.toml, where the package
        /// puts it].
        #[arg(long, short, value_name = "FILE", default_value = ferry::config::DEFAULT_FILE, hide_default_value = true)]
        config: PathBuf,
    },
    /// Set DEVICE's password in a password file (south.password_file),
    /// adding or replacing its line. The password is read from stdin,
    /// without echo on a terminal. Send the running gateway SIGHUP
    /// (`systemctl reload ferry`) to apply it. Runs on one file at once
    /// take turns on the lock FILE.lock (a run waits up to 10 s for it).
    Passwd {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        #[arg(value_name = "DEVICE")]
        device: String,
    },
    /// Be a device: `pub` an uplink and see its receipts, or `listen` to
    /// its inbox (one connection, the device's own id).
    Device(Box<device::DeviceArgs>),
    /// Operator tools: dead letters, trace, status.
    #[command(flatten)]
    Ops(ops::OpsCommand),
}

/// `ferry check-config`: `FILE: ok` on stdout, or every bad key, one line
/// each, on stderr.
pub fn check_config(config: &Path) -> Exit {
    if let Err(e) = Config::load(config) {
        say_config_errors(config, &e);
        return Exit::Usage;
    }
    let mut text = output::Text::new();
    text.line(format_args!("{}: ok", config.display()));
    match text.print() {
        Ok(()) => Exit::Ok,
        Err(e) => {
            let exit = Exit::from(&e);
            if exit != Exit::StdoutClosed {
                output::say(format_args!("ferry: {e}"));
            }
            exit
        }
    }
}

/// Each of a refused config's problems as its own line on stderr,
/// `ferry: FILE: config key `KEY`: REASON`.
pub fn say_config_errors(config: &Path, errors: &ferry::config::ConfigErrors) {
    for e in errors.iter() {
        eprintln!("ferry: {}: {e}", config.display());
    }
}
