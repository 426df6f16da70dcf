//! `ferry device`: be a device from the command line, on one connection
//! ([`ferry::client::device::DeviceClient`]), to see the protocol work
//! end to end (docs/PROTOCOL.md):
//!
//! - `pub up/{stream} JSON`: sends one uplink with a fresh `msg_id` (or
//!   `--msg-id`), resent until it has an answer, prints its receipts as
//!   they come, and exits 0 on the awaited one (`--wait stored`, the
//!   default, or `delivered`), 1 with a one-line reason on `rejected`,
//!   `failed`, no answer within `--timeout`, or a connection the gateway
//!   refuses (a bad password, a certificate for another device);
//! - `listen`: prints the device's inbox messages and confirms each batch
//!   after printing it, until `--count` messages, `--timeout`, SIGINT or
//!   SIGTERM; it leaves with a clean DISCONNECT (and `{"online": false}`).
//!
//! Where it connects, and how: [`connect`]; what it prints: [`report`].
//! A device already connected with the same id is taken over (one
//! connection per client id), as it would be by any client.

mod connect;
mod report;

use std::time::Duration;

use clap::{Args, Subcommand};
use ferry::client::device::{DeviceClient, DeviceEvent};
use ferry::ids::MsgId;
use ferry::mqtt::Problem;
use ferry::protocol::envelope::WireEnvelope;
use ferry::protocol::receipt::{Receipt, ReceiptStatus};
use tokio::time::Instant;

use self::connect::{parse_duration, ConnectArgs, Target};
use self::report::{Line, Verdict, Wait};
use super::exit::Exit;
use super::output::{self, Text};

/// How long a clean DISCONNECT may take before the connection is dropped.
const CLOSE_WITHIN: Duration = Duration::from_secs(2);

#[derive(Args, Debug)]
pub struct DeviceArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand, Debug)]
enum Action {
    /// Publish one uplink on TOPIC (`up/{stream}`, under the device's
    /// topics) and print its receipts.
    Pub {
        /// `up/` and the stream: `up/alarm`, `up/line3/temp`.
        #[arg(value_name = "TOPIC")]
        topic: String,
        /// The payload, any JSON value (`'{"temp":81}'`, `'"text"'`).
        #[arg(value_name = "JSON")]
        payload: String,
        /// The message's id [default: a fresh one, cli-{ms}-{random}].
        #[arg(long, value_name = "ID")]
        msg_id: Option<String>,
        /// The receipt to wait for.
        #[arg(long, value_enum, default_value = "stored")]
        wait: Wait,
        /// Give up waiting after this long (30s, 500ms, 2m).
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Print the device's inbox messages, confirming each batch once
    /// printed.
    Listen {
        /// Stop after this many messages (exit 1 if --timeout comes first).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// Stop after this long [default: until SIGINT or SIGTERM].
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
}

/// Why it stopped short.
enum Failure {
    /// Exit so, this one line on stderr.
    Said(Exit, String),
    /// The reader of stdout went away.
    StdoutClosed,
}

fn runtime(line: impl Into<String>) -> Failure {
    Failure::Said(Exit::Runtime, line.into())
}

/// Runs `ferry device`: events on stdout, a failure as one line on stderr.
pub fn command(args: DeviceArgs) -> Exit {
    let outcome = match plan(args) {
        Ok(plan) => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(run(plan)),
            Err(e) => Err(runtime(format!("cannot start the runtime: {e}"))),
        },
        Err(e) => Err(Failure::Said(Exit::Usage, e)),
    };
    match outcome {
        Ok(()) => Exit::Ok,
        Err(Failure::StdoutClosed) => Exit::StdoutClosed,
        Err(Failure::Said(exit, line)) => {
            output::say(format_args!("ferry device: {line}"));
            exit
        }
    }
}

/// The command, checked.
struct Plan {
    target: Target,
    json: bool,
    job: Job,
}

enum Job {
    Pub {
        stream: String,
        msg_id: MsgId,
        body: bytes::Bytes,
        wait: Wait,
        timeout: Duration,
    },
    Listen {
        count: Option<u64>,
        timeout: Option<Duration>,
    },
}

fn plan(args: DeviceArgs) -> Result<Plan, String> {
    let target = connect::target(&args.connect)?;
    let job = match args.action {
        Action::Pub {
            topic,
            payload,
            msg_id,
            wait,
            timeout,
        } => {
            let stream = topic
                .strip_prefix("up/")
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    format!("pub {topic:?}: a device publishes on up/{{stream}}: write up/alarm")
                })?;
            if stream.contains(['+', '#']) {
                return Err(format!("pub {topic:?}: no wildcards (+, #) in a topic"));
            }
            let msg_id = msg_id.unwrap_or_else(fresh_msg_id);
            let msg_id =
                MsgId::new(msg_id.as_str()).map_err(|e| format!("--msg-id {msg_id:?}: {e}"))?;
            let payload: serde_json::Value = serde_json::from_str(&payload)
                .map_err(|e| format!("the payload is not JSON ({e}); quote text as '\"text\"'"))?;
            let body = WireEnvelope::json(msg_id.clone(), payload).to_bytes();
            Job::Pub {
                stream: stream.to_string(),
                msg_id,
                body: body.into(),
                wait,
                timeout,
            }
        }
        Action::Listen { count, timeout } => Job::Listen { count, timeout },
    };
    Ok(Plan {
        target,
        json: args.json,
        job,
    })
}

/// `cli-{ms since the epoch}-{4 random hex digits}`: unique per run, as
/// docs/PROTOCOL.md asks of a msg_id (a time component, not a counter).
fn fresh_msg_id() -> String {
    format!(
        "cli-{}-{:04x}",
        ferry::protocol::now_ms(),
        rand::random::<u16>()
    )
}

/// SIGINT or SIGTERM.
struct Stop {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Stop {
    fn new() -> Result<Stop, Failure> {
        use tokio::signal::unix::{signal, SignalKind};
        let listen =
            |kind| signal(kind).map_err(|e| runtime(format!("cannot handle signals: {e}")));
        Ok(Stop {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// The connected device and what it prints.
struct Session {
    device: DeviceClient,
    id: String,
    at: String,
    json: bool,
    /// Whether it has been connected yet: a failure before that ends the
    /// command (unless nothing listens yet), one after it is a drop the
    /// client repairs.
    connected: bool,
    /// Why the last connection attempt failed.
    last_failure: Option<String>,
    /// Whether a password was given (a refusal then means another thing).
    with_password: bool,
}

/// What one event means to the loop.
enum Heard {
    /// Connected (again).
    Up,
    Receipt(Receipt),
    Inbox(Vec<ferry::client::device::InboxMessage>),
    /// Nothing for the loop.
    Other,
}

impl Session {
    fn say(&self, line: Line<'_>) -> Result<(), Failure> {
        let mut text = Text::new();
        text.line(line.render(self.json));
        text.print().map_err(|e| match Exit::from(&e) {
            Exit::StdoutClosed => Failure::StdoutClosed,
            exit => Failure::Said(exit, e.to_string()),
        })
    }

    /// Prints what the connection did; a first connection that fails is
    /// the end, with the gateway's reason.
    fn hear(&mut self, event: Option<DeviceEvent>) -> Result<Heard, Failure> {
        match event {
            None => Err(runtime("the device client stopped")),
            Some(DeviceEvent::Connected) => {
                self.connected = true;
                self.say(Line::Connected {
                    device: &self.id,
                    at: &self.at,
                })?;
                Ok(Heard::Up)
            }
            Some(DeviceEvent::ConnectionFailed(failure)) => {
                // Before the first connection only a port that does not
                // listen yet (the gateway starting) is worth waiting for.
                if !self.connected && failure.problem != Problem::NotListening {
                    return Err(runtime(format!(
                        "cannot connect to {} as {}: {}",
                        self.at,
                        self.id,
                        report::hint(&failure.error, self.with_password)
                    )));
                }
                self.say(Line::NoConnection {
                    at: &self.at,
                    error: &failure.error,
                })?;
                self.last_failure = Some(failure.error);
                Ok(Heard::Other)
            }
            Some(DeviceEvent::Receipt(r)) => Ok(Heard::Receipt(r)),
            Some(DeviceEvent::Inbox { messages, .. }) => Ok(Heard::Inbox(messages)),
            Some(DeviceEvent::Disconnected) => Ok(Heard::Other),
        }
    }

    /// Why a wait of `timeout` for `what` ended with nothing.
    fn timed_out(&self, what: &str, timeout: Duration) -> Failure {
        match (&self.last_failure, self.connected) {
            (Some(error), false) => runtime(format!(
                "cannot connect to {} as {} within {timeout:?}: {}",
                self.at,
                self.id,
                ferry::clip::Clip(error)
            )),
            _ => runtime(format!("{what} within {timeout:?}")),
        }
    }

    async fn close(&self) {
        self.device.close(CLOSE_WITHIN).await;
    }
}

async fn run(plan: Plan) -> Result<(), Failure> {
    let mut stop = Stop::new()?;
    let device = DeviceClient::try_connect(plan.target.opts.clone())
        .map_err(|e| Failure::Said(Exit::Usage, format!("--id: {e}")))?;
    let mut session = Session {
        device,
        id: plan.target.opts.device.clone(),
        at: plan.target.at.clone(),
        json: plan.json,
        connected: false,
        last_failure: None,
        with_password: plan.target.opts.password.is_some(),
    };
    let result = match plan.job {
        Job::Pub {
            stream,
            msg_id,
            body,
            wait,
            timeout,
        } => {
            let uplink = Uplink {
                stream,
                msg_id,
                body,
                wait,
                timeout,
            };
            publish(&mut session, &mut stop, uplink).await
        }
        Job::Listen { count, timeout } => listen(&mut session, &mut stop, count, timeout).await,
    };
    session.close().await;
    result
}

struct Uplink {
    stream: String,
    msg_id: MsgId,
    body: bytes::Bytes,
    wait: Wait,
    timeout: Duration,
}

/// Sends the uplink once connected and waits for its answer.
async fn publish(session: &mut Session, stop: &mut Stop, up: Uplink) -> Result<(), Failure> {
    let deadline = Instant::now() + up.timeout;
    let mut sent = false;
    let mut last: Option<ReceiptStatus> = None;
    loop {
        let event = tokio::select! {
            event = session.device.events.recv() => event,
            _ = tokio::time::sleep_until(deadline) => {
                let last = last.map(|s| format!(" (last: {})", status_name(s))).unwrap_or_default();
                let what = format!("no {} receipt for {}{last}", up.wait.as_str(), up.msg_id);
                return Err(session.timed_out(&what, up.timeout));
            }
            _ = stop.recv() => {
                return Err(runtime(format!("interrupted before the {} receipt for {}", up.wait.as_str(), up.msg_id)));
            }
        };
        match session.hear(event)? {
            Heard::Up if !sent => {
                session
                    .device
                    .send_raw(&up.stream, up.msg_id.as_str(), up.body.clone());
                sent = true;
                let topic = session.device.topics().up(&up.stream);
                session.say(Line::Sent {
                    msg_id: up.msg_id.as_str(),
                    topic: &topic,
                })?;
            }
            Heard::Receipt(r) if answers(&r, &up.msg_id) => {
                session.say(Line::Receipt(&r))?;
                last = Some(r.status);
                match up.wait.judge(&r) {
                    Verdict::Done => return Ok(()),
                    Verdict::Keep => {}
                    Verdict::Never(reason) => {
                        return Err(runtime(format!("{}: {reason}", up.msg_id)))
                    }
                }
            }
            _ => {}
        }
    }
}

/// Whether `r` answers our uplink: it names it, or it is a rejection of a
/// message whose id could not be read (ours is the only one sent).
fn answers(r: &Receipt, msg_id: &MsgId) -> bool {
    match &r.msg_id {
        Some(id) => id == msg_id,
        None => r.status == ReceiptStatus::Rejected,
    }
}

fn status_name(status: ReceiptStatus) -> String {
    serde_json::to_value(status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Prints inbox messages and confirms each batch after printing it.
async fn listen(
    session: &mut Session,
    stop: &mut Stop,
    count: Option<u64>,
    timeout: Option<Duration>,
) -> Result<(), Failure> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut got: u64 = 0;
    loop {
        let event = tokio::select! {
            event = session.device.events.recv() => event,
            _ = ferry::deadlines::sleep_until(deadline) => {
                let timeout = timeout.unwrap_or_default();
                return match count {
                    Some(n) if got < n => {
                        Err(session.timed_out(&format!("{got} of {n} inbox messages"), timeout))
                    }
                    _ if !session.connected => Err(session.timed_out("no connection", timeout)),
                    _ => Ok(()),
                };
            }
            _ = stop.recv() => return Ok(()),
        };
        let Heard::Inbox(messages) = session.hear(event)? else {
            continue;
        };
        let room = count.map_or(u64::MAX, |n| n - got);
        let take = messages
            .len()
            .min(usize::try_from(room).unwrap_or(usize::MAX));
        for m in &messages[..take] {
            session.say(Line::Inbox(m))?;
        }
        if let Some(last) = messages[..take].last() {
            session.device.confirm(last.seq);
            session.say(Line::Confirmed { upto: last.seq })?;
            got += take as u64;
        }
        if count.is_some_and(|n| got >= n) {
            return Ok(());
        }
    }
}
