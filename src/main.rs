//! The `ferry` command: parse arguments, load the config, run. Exit codes
//! are decided here only: 0 ok, 64 usage or config error, 1 runtime failure,
//! 141 stdout closed by its reader (as a shell reports a command SIGPIPE
//! ended, `ls | head`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferry::config::{Config, LogFormat};
use tracing_subscriber::EnvFilter;

mod cli_output;
mod ops_cli;

const EXIT_CONFIG: u8 = 64;
/// 128 + SIGPIPE: what a shell shows for `ls | head` when `ls` is cut off.
const EXIT_STDOUT_CLOSED: u8 = 141;

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
    /// Set DEVICE's password in a password file (south.password_file),
    /// adding or replacing its line. The password is read from stdin,
    /// without echo on a terminal. Send the running gateway SIGHUP
    /// (`systemctl reload ferry`) to apply it.
    Passwd {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        #[arg(value_name = "DEVICE")]
        device: String,
    },
    /// Operator tools: dead letters, trace, status.
    #[command(flatten)]
    Ops(ops_cli::OpsCommand),
}

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
            return ExitCode::FAILURE;
        }
    }
    set_signals_held(false);
    let cli = match cli {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_CONFIG } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Ops(command) => match ops_cli::run(command) {
            Ok(()) => ExitCode::SUCCESS,
            Err(ops_cli::Failure::StdoutClosed) => ExitCode::from(EXIT_STDOUT_CLOSED),
            Err(ops_cli::Failure::Said(code, e)) => {
                cli_output::say(format_args!("ferry: {e}"));
                ExitCode::from(code)
            }
        },
        Command::Passwd { file, device } => match passwd(&file, &device) {
            Ok(()) => {
                eprintln!("ferry: {}: password for {device} set", file.display());
                ExitCode::SUCCESS
            }
            Err((code, e)) => {
                eprintln!("ferry passwd: {e}");
                ExitCode::from(code)
            }
        },
        Command::CheckConfig { config } => match Config::load(&config) {
            Ok(_) => {
                let mut text = cli_output::Text::new();
                text.line(format_args!("{}: ok", config.display()));
                match text.print() {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(cli_output::OutputError::Closed) => ExitCode::from(EXIT_STDOUT_CLOSED),
                    Err(e) => {
                        cli_output::say(format_args!("ferry: {e}"));
                        ExitCode::FAILURE
                    }
                }
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
            init_logging(&cfg.log_level, cfg.log_format);
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
                    tracing::error!(event = "gateway_failed", error = %e, "ferry stopped");
                    eprintln!("ferry: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `ferry passwd FILE DEVICE`; an error is (exit code, one line).
fn passwd(file: &std::path::Path, device: &str) -> Result<(), (u8, String)> {
    use ferry::config::passwords as auth;
    use std::io::{BufRead, IsTerminal, Write};

    let device = ferry::ids::DeviceId::new(device)
        .map_err(|e| (EXIT_CONFIG, format!("device id {device:?}: {e}")))?;
    let existing = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err((1, format!("{}: {e}", file.display()))),
    };
    // Refuse to rewrite a file the gateway could not read anyway.
    auth::parse(file, &existing).map_err(|e| (EXIT_CONFIG, e.to_string()))?;

    let password = if std::io::stdin().is_terminal() {
        let first = rpassword::prompt_password(format!("password for {device}: "))
            .map_err(|e| (1, format!("cannot read the password: {e}")))?;
        let again = rpassword::prompt_password("again: ")
            .map_err(|e| (1, format!("cannot read the password: {e}")))?;
        if first != again {
            return Err((EXIT_CONFIG, "the passwords differ; nothing changed".into()));
        }
        first
    } else {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(|e| (1, format!("cannot read the password from stdin: {e}")))?;
        line.trim_end_matches(['\n', '\r']).to_string()
    };
    if password.is_empty() {
        return Err((EXIT_CONFIG, "empty password; nothing changed".into()));
    }
    let hash = auth::hash_password(&password).map_err(|e| (1, format!("cannot hash: {e}")))?;
    let text = auth::set_line(&existing, &device, &hash);

    // Written whole and renamed over the old file, so the gateway reading
    // it on SIGHUP sees the old file or the new one, never half of one.
    let tmp = file.with_extension("tmp");
    let io = |e: std::io::Error| (1, format!("{}: {e}", tmp.display()));
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        // Keep the file's owner and mode (e.g. root:ferry 0640), so the
        // gateway can still read it after root edits it.
        if let Ok(meta) = std::fs::metadata(file) {
            use std::os::unix::fs::MetadataExt;
            std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid())).map_err(io)?;
            f.set_permissions(meta.permissions()).map_err(io)?;
        }
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, file).map_err(|e| (1, format!("{}: {e}", file.display())))?;
    Ok(())
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
    let _ = tracing_log::LogTracer::init();
    // rumqttd's events are logged, but not inside its spans: it opens one
    // per publish, and creating them costs more than the rest of routing.
    let no_broker_spans =
        FilterFn::new(|meta| !(meta.is_span() && meta.target().starts_with("rumqttd")));
    let filter = filter.and(no_broker_spans);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let layer = match format {
        LogFormat::Text => fmt
            // Colour only on a terminal, not in the journal or a log file.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed(),
        // Fields at the top level, next to `message`, for log shippers.
        LogFormat::Json => fmt.json().flatten_event(true).with_filter(filter).boxed(),
    };
    let _ = tracing_subscriber::registry().with(layer).try_init();
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
