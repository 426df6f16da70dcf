//! Plain MQTT load, for the brokers ferry is compared with: publishers
//! that send the same stamped envelopes as ferry's bench devices
//! ([`super::arrivals::stamped_envelope`]) QoS 1 on `bench/{i}`, and one
//! consumer subscribed to `bench/#` that records what arrives.
//!
//! A publisher keeps at most `window` publishes without a PUBACK (the
//! first broker took it), as ferry's devices keep at most `window` without
//! a `stored` receipt, and publishes as fast as that allows or on a fixed
//! schedule. It does not resend: a dropped connection is counted, and what
//! it lost shows up as lost at the consumer, which fails the run.

use std::sync::Arc;
use std::time::Duration;

use ferry::mqtt::{Event, Options, Session};
use hdrhistogram::Histogram;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{timeout, timeout_at, MissedTickBehavior};

use super::arrivals::{stamped_envelope, Arrivals};
use super::load::PhaseCtx;

/// The topic level the plain publishers publish under.
pub const TOPIC_ROOT: &str = "bench";
/// How long a client may take to be connected and subscribed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What the publishers of one phase saw.
pub struct Published {
    pub published: u64,
    pub acked: u64,
    /// Publishes the broker refused (MQTT 5 reason code, or too large).
    pub refused: u64,
    pub drops: u64,
    pub publishers_timed_out: u64,
    /// ns since the phase's origin of the first publish.
    pub first_publish_ns: u64,
    /// Publish → PUBACK, µs.
    pub ack_latency_us: Histogram<u64>,
}

impl Default for Published {
    fn default() -> Self {
        Published {
            published: 0,
            acked: 0,
            refused: 0,
            drops: 0,
            publishers_timed_out: 0,
            first_publish_ns: 0,
            ack_latency_us: Histogram::new_with_bounds(1, 600_000_000, 3)
                .expect("static histogram bounds"),
        }
    }
}

/// The publishers of one phase, connected, waiting for `go`.
pub struct PlainFleet {
    go: watch::Sender<bool>,
    tasks: Vec<JoinHandle<Published>>,
}

impl PlainFleet {
    /// Connects `ctx.devices` publishers to `ctx.port` and waits until
    /// each is up. Message `n` of publisher `i` is `{run_id}-{i}-{n}`.
    pub async fn connect(ctx: Arc<PhaseCtx>) -> Result<PlainFleet, String> {
        let (go, go_rx) = watch::channel(false);
        let mut tasks = Vec::with_capacity(ctx.devices);
        let mut readies = Vec::with_capacity(ctx.devices);
        for i in 0..ctx.devices {
            let (ready_tx, ready_rx) = oneshot::channel();
            tasks.push(tokio::spawn(publisher(
                i,
                ctx.clone(),
                go_rx.clone(),
                ready_tx,
            )));
            readies.push((i, ready_rx));
        }
        for (i, rx) in readies {
            if !matches!(timeout(CONNECT_TIMEOUT, rx).await, Ok(Ok(()))) {
                return Err(format!(
                    "publisher {i}: not connected to port {} within {CONNECT_TIMEOUT:?}",
                    ctx.port
                ));
            }
        }
        Ok(PlainFleet { go, tasks })
    }

    /// Lets every publisher go; returns once each has every PUBACK or the
    /// deadline passed.
    pub async fn run(self) -> Published {
        let _ = self.go.send(true);
        let mut sum = Published {
            first_publish_ns: u64::MAX,
            ..Published::default()
        };
        for t in self.tasks {
            let p = t.await.unwrap_or_default();
            sum.published += p.published;
            sum.acked += p.acked;
            sum.refused += p.refused;
            let _ = sum.ack_latency_us.add(&p.ack_latency_us);
            sum.drops += p.drops;
            sum.publishers_timed_out += p.publishers_timed_out;
            if p.first_publish_ns != 0 {
                sum.first_publish_ns = sum.first_publish_ns.min(p.first_publish_ns);
            }
        }
        if sum.first_publish_ns == u64::MAX {
            sum.first_publish_ns = 0;
        }
        sum
    }
}

/// One publisher: connects, says `ready`, waits for `go`, then publishes
/// `ctx.messages` tracked QoS 1 publishes with at most `ctx.window`
/// unacknowledged.
async fn publisher(
    i: usize,
    ctx: Arc<PhaseCtx>,
    mut go: watch::Receiver<bool>,
    ready: oneshot::Sender<()>,
) -> Published {
    let client_id = format!("bench-pub-{i}");
    let mut opts = Options::new(
        client_id.as_str(),
        "127.0.0.1",
        ctx.port,
        client_id.as_str(),
    );
    opts.inflight = (ctx.window + 64).clamp(128, u16::MAX as usize) as u16;
    opts.replay = false;
    let (session, mut events) = Session::<u32>::start(opts);
    let mut seen = Published::default();
    let epoch = loop {
        match timeout_at(ctx.deadline, events.recv()).await {
            Ok(Some(Event::Up { epoch, .. })) => break epoch,
            Ok(Some(_)) => {}
            _ => {
                seen.publishers_timed_out = 1;
                return seen;
            }
        }
    };
    let _ = ready.send(());
    if timeout_at(ctx.deadline, go.wait_for(|g| *g)).await.is_err() {
        seen.publishers_timed_out = 1;
        return seen;
    }
    let topic = format!("{TOPIC_ROOT}/{i}");
    let prefix = format!("{}-{i}-", ctx.run_id);
    let mut ticker = ctx.period.map(|period| {
        // Spread the publishers' schedules evenly over one period.
        let offset = period.mul_f64(i as f64 / ctx.devices as f64);
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
        t.set_missed_tick_behavior(MissedTickBehavior::Burst);
        t
    });
    let total = ctx.messages as u64;
    // Paced: how many the schedule allows so far; else all of them.
    let mut allowed = if ticker.is_some() { 0 } else { total };
    let mut outstanding = 0usize;
    let mut sent_at = vec![0u64; ctx.messages];
    while seen.acked + seen.refused < total {
        while outstanding < ctx.window && seen.published < allowed {
            let n = seen.published;
            let sent_ns = ctx.origin.elapsed().as_nanos() as u64;
            let body = stamped_envelope(&format!("{prefix}{n}"), sent_ns, &ctx.payload);
            if !session.publish(topic.clone(), body.into(), false, n as u32, epoch) {
                break;
            }
            if seen.first_publish_ns == 0 {
                seen.first_publish_ns = sent_ns.max(1);
            }
            sent_at[n as usize] = sent_ns;
            seen.published += 1;
            outstanding += 1;
        }
        let (want_tick, t) = (allowed < total, ticker.as_mut());
        let tick = async move {
            match t {
                Some(t) if want_tick => {
                    t.tick().await;
                }
                _ => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep_until(ctx.deadline) => {
                seen.publishers_timed_out = 1;
                break;
            }
            _ = tick => allowed += 1,
            // A full publish queue: try again shortly.
            _ = tokio::time::sleep(Duration::from_millis(1)), if outstanding < ctx.window && seen.published < allowed => {}
            event = events.recv() => match event {
                Some(Event::Published(n)) => {
                    let now = ctx.origin.elapsed().as_nanos() as u64;
                    let sent = sent_at.get(n as usize).copied().unwrap_or(now);
                    seen.ack_latency_us.saturating_record(now.saturating_sub(sent) / 1000);
                    seen.acked += 1;
                    outstanding -= 1;
                }
                Some(Event::Refused(_)) => {
                    // It never arrives: the consumer will miss it.
                    seen.refused += 1;
                    outstanding -= 1;
                }
                Some(Event::Down) => {
                    seen.drops += 1;
                    if seen.drops <= 2 {
                        eprintln!("publisher {i}: connection dropped");
                    }
                    // Tracked publishes of the old connection are void.
                    break;
                }
                Some(_) => {}
                None => break,
            },
        }
    }
    session.close(None, Duration::from_secs(1)).await;
    seen
}

/// The consumer at the far end: one session subscribed to `bench/#`,
/// recording every message into `arrivals` until stopped or `lifetime`.
pub struct Consumer {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    pub drops: Arc<std::sync::atomic::AtomicU64>,
}

impl Consumer {
    pub async fn start(
        port: u16,
        arrivals: Arc<Arrivals>,
        lifetime: Duration,
    ) -> Result<Consumer, String> {
        let client_id = format!("bench-consumer-{}", std::process::id());
        let mut opts = Options::new(client_id.as_str(), "127.0.0.1", port, client_id.as_str());
        opts.subscriptions = vec![format!("{TOPIC_ROOT}/#")];
        let (session, mut events) = Session::<()>::start(opts);
        match timeout(CONNECT_TIMEOUT, events.recv()).await {
            Ok(Some(Event::Up { .. })) => {}
            _ => {
                return Err(format!(
                    "consumer: not subscribed to {TOPIC_ROOT}/# on port {port} within {CONNECT_TIMEOUT:?}"
                ))
            }
        }
        let (stop, mut stop_rx) = watch::channel(false);
        let drops = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let d = drops.clone();
        let end = tokio::time::Instant::now() + lifetime;
        let task = tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = stop_rx.wait_for(|s| *s) => break,
                    e = timeout_at(end, events.recv()) => match e {
                        Ok(Some(e)) => e,
                        _ => break,
                    },
                };
                match event {
                    Event::Message(m) => arrivals.record(&m.payload),
                    Event::Down => {
                        d.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        eprintln!("consumer: connection dropped");
                    }
                    _ => {}
                }
            }
            session.close(None, Duration::from_secs(1)).await;
        });
        Ok(Consumer { stop, task, drops })
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = timeout(Duration::from_secs(2), self.task).await;
    }
}

/// Publishes a probe on `port` every 100 ms until `arrivals` has seen
/// something (the consumer on the far side is reachable: a bridge is up),
/// at most `within`.
pub async fn probe_path(port: u16, arrivals: &Arrivals, within: Duration) -> Result<(), String> {
    let (session, mut events) =
        Session::<()>::start(Options::new("probe", "127.0.0.1", port, "bench-probe"));
    let deadline = tokio::time::Instant::now() + within;
    let mut up = false;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let result = loop {
        if arrivals.any() {
            break Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => break Err(format!(
                "no probe published on port {port} reached the consumer within {within:?}"
            )),
            _ = tick.tick(), if up => {
                session.send(format!("{TOPIC_ROOT}/probe"), b"probe".to_vec(), false);
            }
            e = events.recv() => match e {
                Some(Event::Up { .. }) => up = true,
                Some(Event::Down) => up = false,
                Some(_) => {}
                None => break Err("probe session ended".into()),
            },
        }
    };
    session.close(None, Duration::from_secs(1)).await;
    result
}
