//! The `ferry dlq`, `ferry trace` and `ferry status` commands: arguments
//! in, one [`ferry::ops`] call, a table (or `--json`) out through
//! [`super::output`]. A failure is (an [`Exit`], one line), or stdout
//! closed by its reader.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use ferry::config::Config;
use ferry::dead_letter::Direction;
use ferry::ops::{self, dlq, fmt_ms, status, table, trace, OpsError};
use serde::Serialize;

use super::exit::Exit;
use super::output::{self, OutputError, Text};

mod status_text;

/// Why a command stopped short.
#[derive(Debug)]
enum Failure {
    /// Exit so, this one line on stderr.
    Said(Exit, String),
    /// The reader of stdout went away (`ferry dlq list | head`): nothing
    /// to say, and no one to say it to.
    StdoutClosed,
}

impl From<(Exit, String)> for Failure {
    fn from((exit, line): (Exit, String)) -> Failure {
        Failure::Said(exit, line)
    }
}

impl From<OutputError> for Failure {
    fn from(e: OutputError) -> Failure {
        match Exit::from(&e) {
            Exit::StdoutClosed => Failure::StdoutClosed,
            exit => Failure::Said(exit, e.to_string()),
        }
    }
}

type Outcome = Result<(), Failure>;

#[derive(Subcommand)]
pub enum OpsCommand {
    /// Dead letters: list, show, replay, purge. Works while the gateway runs.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// A message's whole history, both directions, with timestamps.
    Trace {
        #[command(flatten)]
        common: Common,
        device: String,
        msg_id: String,
    },
    /// Links, devices online, backlogs, dead letters and store size.
    Status {
        #[command(flatten)]
        common: Common,
        /// Devices listed by downlink backlog.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
}

/// Runs `command`: its output on stdout, a failure as one line on stderr.
pub fn command(command: OpsCommand) -> Exit {
    match run(command) {
        Ok(()) => Exit::Ok,
        Err(Failure::StdoutClosed) => Exit::StdoutClosed,
        Err(Failure::Said(exit, e)) => {
            output::say(format_args!("ferry: {e}"));
            exit
        }
    }
}

fn run(command: OpsCommand) -> Outcome {
    let config = match &command {
        OpsCommand::Dlq { command } => match command {
            DlqCommand::List { common, .. }
            | DlqCommand::Show { common, .. }
            | DlqCommand::Replay { common, .. }
            | DlqCommand::Purge { common, .. } => common.config.clone(),
        },
        OpsCommand::Trace { common, .. } | OpsCommand::Status { common, .. } => {
            common.config.clone()
        }
    };
    let result = match command {
        OpsCommand::Dlq { command } => dlq(command),
        OpsCommand::Trace {
            common,
            device,
            msg_id,
        } => trace(common, &device, &msg_id),
        OpsCommand::Status { common, top } => status(common, top),
    };
    // The connection is closed by now (each command owns its own).
    let owned = match data_dir(&config) {
        Ok(dir) => ops::restore_ownership(&dir).map_err(|e| fail(e).into()),
        Err(_) => Ok(()),
    };
    result.and(owned)
}

#[derive(Args)]
pub struct Common {
    /// The config file [default: /etc/ferry/ferry.toml, where the package
    /// puts it].
    #[arg(long, short, value_name = "FILE", default_value = ferry::config::DEFAULT_FILE, hide_default_value = true)]
    config: PathBuf,
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum DlqCommand {
    /// List dead letters: id, device, msg_id, direction, reason, attempts,
    /// first and last failure.
    List {
        #[command(flatten)]
        common: Common,
        #[arg(long, value_name = "D")]
        device: Option<String>,
        /// Only reasons starting with R (e.g. `nacked`, `expired`).
        #[arg(long, value_name = "R")]
        reason: Option<String>,
        #[arg(long, value_enum)]
        direction: Option<Direction>,
    },
    /// Everything about one dead letter, its payload included.
    Show {
        #[command(flatten)]
        common: Common,
        id: i64,
    },
    /// Send dead uplinks back to the backend with fresh attempts, same
    /// msg_id and seq. A running gateway sends them within a second or so.
    Replay {
        #[command(flatten)]
        common: Common,
        #[arg(value_name = "ID")]
        ids: Vec<i64>,
        /// Every replayable dead letter (of --device, if given).
        #[arg(long)]
        all: bool,
        #[arg(long, value_name = "D", requires = "all")]
        device: Option<String>,
    },
    /// Delete dead letters older than a duration (30d, 12h, 15m, 90s).
    Purge {
        #[command(flatten)]
        common: Common,
        #[arg(long, value_name = "DURATION")]
        older_than: String,
    },
}

fn fail(e: OpsError) -> (Exit, String) {
    (Exit::from(&e), e.to_string())
}

fn data_dir(config: &Path) -> Result<PathBuf, (Exit, String)> {
    Config::load(config)
        .map(|c| c.data_dir)
        .map_err(|e| (Exit::Usage, output::config_problems(config, &e)))
}

fn print_json(value: &impl Serialize) -> Outcome {
    let json =
        serde_json::to_string_pretty(value).map_err(|e| (Exit::Runtime, format!("json: {e}")))?;
    let mut text = Text::new();
    text.line(json);
    Ok(text.print()?)
}

/// How many refusals a dead letter stands for: one, or a summary's count
/// and its latest.
fn refusals(d: &dlq::DeadLetterDetail) -> String {
    match d.last_refusal_ms {
        Some(at) if d.refusals > 1 || d.row.reason.starts_with("summarised") => {
            format!("{} (summary; the latest {})", d.refusals, fmt_ms(at))
        }
        _ => d.refusals.to_string(),
    }
}

/// What a dead letter keeps of its payload: all of it, or its head of
/// the size sent, with the hash of all of it.
fn kept(d: &dlq::DeadLetterDetail) -> String {
    let p = &d.payload;
    let sent = d.payload_bytes.unwrap_or(p.bytes as i64);
    let mut line = match sent > p.bytes as i64 {
        true => format!("the first {} of {sent} bytes, {}", p.bytes, p.encoding),
        false => format!("{} bytes, {}", p.bytes, p.encoding),
    };
    if let Some(sha) = &d.payload_sha256 {
        line.push_str(&format!(", sha256 {sha}"));
    }
    line
}

fn opt(s: &Option<String>) -> String {
    s.clone().unwrap_or_else(|| "-".into())
}

fn dlq(cmd: DlqCommand) -> Outcome {
    match cmd {
        DlqCommand::List {
            common,
            device,
            reason,
            direction,
        } => {
            let conn = ops::open_read(&data_dir(&common.config)?).map_err(fail)?;
            let filter = dlq::Filter {
                device,
                reason,
                direction,
            };
            let rows = dlq::list(&conn, &filter).map_err(fail)?;
            if common.json {
                return print_json(&rows);
            }
            let cells: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    vec![
                        r.id.to_string(),
                        opt(&r.device),
                        opt(&r.msg_id),
                        r.direction.to_string(),
                        r.reason.clone(),
                        r.attempts.to_string(),
                        fmt_ms(r.first_failure_ms),
                        fmt_ms(r.last_failure_ms),
                    ]
                })
                .collect();
            let mut text = Text::new();
            text.push(&table::render(
                &[
                    "ID",
                    "DEVICE",
                    "MSG_ID",
                    "DIR",
                    "REASON",
                    "ATTEMPTS",
                    "FIRST FAILURE",
                    "LAST FAILURE",
                ],
                &cells,
            ));
            Ok(text.print()?)
        }
        DlqCommand::Show { common, id } => {
            let conn = ops::open_read(&data_dir(&common.config)?).map_err(fail)?;
            let d = dlq::show(&conn, id)
                .map_err(fail)?
                .ok_or_else(|| (Exit::Runtime, format!("no dead letter {id}")))?;
            if common.json {
                return print_json(&d);
            }
            let lines = [
                ("id", d.row.id.to_string()),
                ("direction", d.row.direction.to_string()),
                ("device", opt(&d.row.device)),
                ("msg_id", opt(&d.row.msg_id)),
                ("seq", d.seq.map_or("-".into(), |s| s.to_string())),
                ("reason", d.row.reason.clone()),
                ("attempts", d.row.attempts.to_string()),
                ("last error", opt(&d.last_error)),
                ("first failure", fmt_ms(d.row.first_failure_ms)),
                ("dead-lettered", fmt_ms(d.row.last_failure_ms)),
                ("topic", opt(&d.topic)),
                ("message state", opt(&d.message_state)),
                ("replayable", d.row.replayable.to_string()),
                ("refusals", refusals(&d)),
                ("payload", kept(&d)),
            ];
            let mut text = Text::new();
            for (k, v) in lines {
                text.line(format_args!("{k:>14}: {v}"));
            }
            text.line(&d.payload.data);
            Ok(text.print()?)
        }
        DlqCommand::Replay {
            common,
            ids,
            all,
            device,
        } => {
            if all != ids.is_empty() {
                return Err((
                    Exit::Usage,
                    "name dead letter ids or --all, one of them".to_string(),
                )
                    .into());
            }
            let dir = data_dir(&common.config)?;
            let mut conn = ops::open_write(&dir).map_err(fail)?;
            let ids = if all {
                dlq::replayable_ids(&conn, device.as_deref()).map_err(fail)?
            } else {
                ids
            };
            let bar = Progress::new(ids.len());
            let mut results = Vec::with_capacity(ids.len());
            for (i, id) in ids.iter().enumerate() {
                results.push(dlq::replay(&mut conn, *id, ops::now_ms()).map_err(fail)?);
                bar.show(i + 1);
            }
            bar.done();
            let refused = results.iter().filter(|r| !r.replayed).count();
            if common.json {
                print_json(&results)?;
            } else {
                let mut text = Text::new();
                if all && results.is_empty() {
                    text.line(format_args!(
                        "nothing to replay: no replayable dead letter{}",
                        device
                            .as_deref()
                            .map(|d| format!(" of device {d}"))
                            .unwrap_or_default()
                    ));
                }
                for r in &results {
                    let (id, device, msg_id) = (r.id, opt(&r.device), opt(&r.msg_id));
                    match (&r.refused, r.seq) {
                        (None, Some(seq)) => {
                            text.line(format_args!("{id}: replayed {device}/{msg_id} seq {seq}"))
                        }
                        (None, None) => text.line(format_args!(
                            "{id}: replayed {device}/{msg_id}: the gateway sends it to the device under a new seq"
                        )),
                        (Some(why), _) => text.line(format_args!("{id}: not replayed: {why}")),
                    }
                }
                text.print()?;
            }
            if refused > 0 {
                let line = format!("{refused} of {} dead letters not replayed", results.len());
                return Err((Exit::Runtime, line).into());
            }
            Ok(())
        }
        DlqCommand::Purge { common, older_than } => {
            // Checked before the store is opened: a refused age deletes nothing.
            let before = ops::duration::before(&older_than, ops::now_ms())
                .map_err(|e| (Exit::Usage, format!("--older-than {e}")))?;
            let dir = data_dir(&common.config)?;
            let conn = ops::open_write(&dir).map_err(fail)?;
            let purged = dlq::purge(&conn, before).map_err(fail)?;
            if common.json {
                return print_json(&serde_json::json!({ "purged": purged, "before_ms": before }));
            }
            let mut text = Text::new();
            text.line(format_args!(
                "purged {purged} dead letters from before {}",
                fmt_ms(before)
            ));
            Ok(text.print()?)
        }
    }
}

fn trace(common: Common, device: &str, msg_id: &str) -> Outcome {
    let conn = ops::open_read(&data_dir(&common.config)?).map_err(fail)?;
    let events = trace::trace(&conn, device, msg_id).map_err(fail)?;
    if events.is_empty() {
        let line = format!("no message {msg_id} of device {device} in the store");
        return Err((Exit::Runtime, line).into());
    }
    if common.json {
        return print_json(&events);
    }
    let cells: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                fmt_ms(e.at_ms),
                e.direction.to_string(),
                e.seq.map_or("-".into(), |s| s.to_string()),
                e.event.clone(),
                opt(&e.detail),
            ]
        })
        .collect();
    let mut text = Text::new();
    text.push(&table::render(
        &["AT", "DIR", "SEQ", "EVENT", "DETAIL"],
        &cells,
    ));
    Ok(text.print()?)
}

fn status(common: Common, top: usize) -> Outcome {
    let cfg = Config::load(&common.config)
        .map_err(|e| (Exit::Usage, output::config_problems(&common.config, &e)))?;
    let dir = cfg.data_dir;
    let conn = ops::open_read(&dir).map_err(fail)?;
    let s =
        status::status(&conn, &dir, cfg.store.max_db_bytes, top, ops::now_ms()).map_err(fail)?;
    if common.json {
        return print_json(&s);
    }
    Ok(status_text::text(&s).print()?)
}

/// A progress bar on stderr, only when stdout is a terminal and there is
/// more than one thing to do (scripts get clean output).
struct Progress {
    total: usize,
    on: bool,
}

impl Progress {
    fn new(total: usize) -> Progress {
        Progress {
            total,
            on: total > 1 && std::io::stdout().is_terminal(),
        }
    }

    fn show(&self, done: usize) {
        if self.on {
            let filled = done * 30 / self.total.max(1);
            use std::io::Write as _;
            // Best effort: a progress bar is no reason to stop.
            let _ = write!(
                std::io::stderr().lock(),
                "\r[{}{}] {done}/{}",
                "#".repeat(filled),
                " ".repeat(30 - filled),
                self.total
            );
        }
    }

    fn done(&self) {
        if self.on {
            output::say("");
        }
    }
}
