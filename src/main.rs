//! The `ferry` command: parse arguments, load the config, run. Exit codes
//! are decided here only: 0 ok, 64 usage or config error, 1 runtime failure.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferry::config::Config;
use tracing_subscriber::EnvFilter;

const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "ferry",
    version,
    about = "MQTT edge gateway: durable store-and-forward between field devices and a backend"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Run {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
    },
    /// Check a config file (and FERRY_* overrides) and exit.
    CheckConfig {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::CheckConfig { config } => match Config::load(&config) {
            Ok(_) => {
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ferry: {}: {e}", config.display());
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::Run { config } => {
            let cfg = match Config::load(&config) {
                Ok(cfg) => cfg,
                Err(e) => {
                    eprintln!("ferry: {}: {e}", config.display());
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            init_logging(&cfg.log_level);
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("ferry: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = runtime.block_on(ferry::run(cfg, shutdown_signal()));
            // Whatever did not finish within the grace was named; don't
            // wait for it again.
            runtime.shutdown_timeout(std::time::Duration::from_millis(500));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "ferry stopped");
                    eprintln!("ferry: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Logs to stderr through `log.level` (or RUST_LOG).
fn init_logging(level: &str) {
    use tracing_subscriber::filter::{FilterExt, FilterFn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_log::LogTracer::init();
    // rumqttd's events are logged, but not inside its spans: it opens one
    // per publish, and creating them costs more than the rest of routing.
    let no_broker_spans =
        FilterFn::new(|meta| !(meta.is_span() && meta.target().starts_with("rumqttd")));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        // Colour only on a terminal, not in the journal or a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter.and(no_broker_spans));
    let _ = tracing_subscriber::registry().with(fmt).try_init();
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.unwrap_or(());
}
