//! The `ferry` binary: parse arguments, then either run the gateway (this
//! file: signals, logging, the runtime) or one of the tools in [`cli`].
//! Every outcome is a [`cli::Exit`], the only place exit codes are written.

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use ferry::config::{Config, LogFormat};
use tracing_subscriber::EnvFilter;

mod cli;

use cli::{Cli, Command, Exit};

/// Holds SIGHUP, SIGTERM and SIGINT back (blocked, so they stay pending)
/// from before `main`, until `main` knows what it runs: `ferry run` counts
/// them ([`ferry::signals`]), a CLI command takes their default action.
/// Runs as the binary's constructor, before any thread exists, so every
/// thread would inherit the mask; `main` lifts it before starting any.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static HOLD_SIGNALS: extern "C" fn() = hold_signals;

#[cfg(target_os = "linux")]
extern "C" fn hold_signals() {
    set_signals_held(true);
}

/// Blocks (or unblocks) SIGHUP, SIGTERM and SIGINT on this thread.
fn set_signals_held(held: bool) {
    #[cfg(unix)]
    // SAFETY: a sigset_t on the stack, filled by sigemptyset/sigaddset
    // before pthread_sigmask reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGHUP, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, signal);
        }
        let how = if held {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

fn main() -> ExitCode {
    let cli = Cli::try_parse();
    // `ferry run` counts the signals that came so far and come later; any
    // other command takes them as a command line tool does.
    if let Ok(Cli {
        command: Command::Run { .. },
    }) = &cli
    {
        if let Err(e) = ferry::signals::install() {
            eprintln!("ferry: cannot handle signals: {e}");
            return Exit::Runtime.into();
        }
    }
    set_signals_held(false);
    let cli = match cli {
        Ok(cli) => cli,
        Err(e) => {
            let exit = if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Ok
            };
            let _ = e.print();
            return exit.into();
        }
    };
    let exit = match cli.command {
        Command::Ops(command) => cli::ops::command(command),
        Command::Device(args) => cli::device::command(*args),
        Command::Passwd { file, device } => cli::passwd::command(&file, &device),
        Command::CheckConfig { config } => cli::check_config(&config),
        Command::Run { config } => run(&config),
    };
    exit.into()
}

/// `ferry run`: the gateway until SIGTERM or SIGINT, and its shutdown.
fn run(config: &Path) -> Exit {
    let cfg = match Config::load(config) {
        Ok(cfg) => cfg,
        Err(e) => {
            cli::say_config_errors(config, &e);
            return Exit::Usage;
        }
    };
    init_logging(&cfg.log_level, cfg.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ferry: cannot start the runtime: {e}");
            return Exit::Runtime;
        }
    };
    let result = runtime.block_on(ferry::run(cfg, shutdown_signal()));
    // Whatever did not finish within the grace was named; don't wait for
    // it again.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    match result {
        Ok(()) => Exit::Ok,
        Err(e) => {
            tracing::error!(event = "gateway_failed", error = %e, "ferry stopped");
            eprintln!("ferry: {e}");
            if e.is_config() {
                Exit::Usage
            } else {
                Exit::Runtime
            }
        }
    }
}

/// Logs to stderr through `log.level` (or RUST_LOG).
fn init_logging(level: &str, format: LogFormat) {
    use tracing_subscriber::filter::{FilterExt, FilterFn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // `systemctl reload` may set another `log.level` (ferry::reload).
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    ferry::reload::set_log_level_setter(Box::new(move |level: &str| {
        let new = EnvFilter::try_new(level).map_err(|e| format!("log.level {level:?}: {e}"))?;
        handle
            .reload(new)
            .map_err(|e| format!("the log filter cannot be changed: {e}"))
    }));
    let _ = tracing_log::LogTracer::init();
    // rumqttd's events are logged, but not inside its spans: it opens one
    // per publish, and creating them costs more than the rest of routing.
    let no_broker_spans =
        FilterFn::new(|meta| !(meta.is_span() && meta.target().starts_with("rumqttd")));
    let filter = filter.and(no_broker_spans);
    // And another `log.format`.
    let (fmt, fmt_handle) = tracing_subscriber::reload::Layer::new(fmt_layer(format));
    ferry::reload::set_log_format_setter(Box::new(move |format: &str| {
        let format = match format {
            "json" => LogFormat::Json,
            _ => LogFormat::Text,
        };
        fmt_handle
            .reload(fmt_layer(format))
            .map_err(|e| format!("the log format cannot be changed: {e}"))
    }));
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .try_init();
}

/// The layer writing events to stderr in `format`.
fn fmt_layer(
    format: LogFormat,
) -> Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync> {
    use tracing_subscriber::Layer;
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        // Colour only on a terminal, not in the journal or a log file.
        LogFormat::Text => fmt
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        // Fields at the top level, next to `message`, for log shippers.
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    }
}

/// Resolves on SIGTERM or SIGINT, also one that came before it was first
/// polled (counted by [`ferry::signals`] since the start).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let streams = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        );
        // After listening, so none falls between the two.
        if ferry::signals::terminated() {
            return;
        }
        match streams {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => loop {
                // The counters still see them.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                if ferry::signals::terminated() {
                    return;
                }
            },
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await.unwrap_or(());
}
