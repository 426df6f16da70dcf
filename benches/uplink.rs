//! Uplink benchmark: N devices → the real `ferry` binary (embedded south
//! broker, SQLite store) → a real Mosquitto upstream → one backend client.
//!
//! It measures what a device and a backend see, nothing internal:
//! - stored-receipt throughput: `stored` receipts per second, first publish
//!   to last `stored`;
//! - end-to-end throughput: first publish to the last `delivered` receipt
//!   (the backend committed it and said `ok`, ferry told the device);
//! - stored-receipt latency (just before `publish` → `stored` arrives),
//!   p50/p90/p99/max, in a saturation phase and in a paced phase;
//! - ferry's peak RSS (VmHWM) and the CPU each process used.
//!
//! Phases: *saturation* (every device keeps at most `--window` messages
//! without a `stored` receipt outstanding, as a real device would) and then
//! *paced* (a fixed schedule per device at half the saturation stored rate,
//! or `--rate`). Every loop is bounded by `--timeout-s` per phase; a phase
//! that runs out of time reports what arrived and says `INCOMPLETE`.
//!
//! ```text
//! cargo bench --bench uplink -- [--devices 100] [--messages-per-device 2000]
//!     [--payload-bytes 200] [--rate R] [--window 64] [--mode both|saturation|paced]
//!     [--sync full|normal] [--max-inflight N] [--timeout-s 120] [--quiet-wait-s 120]
//!     [--client-nodelay true|false]
//! ```

mod support;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, NetworkOptions, Outgoing, Packet, QoS};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, timeout_at, MissedTickBehavior};

use support::{clock_ticks_per_s, cores, cpu_ticks, thread_ticks, vm_kib, CargoBench, Env};

/// Devices connect in groups of this many, so that setup is not a connect
/// storm (each CONNECT costs a round trip to rumqttd's router).
const CONNECT_GROUP: usize = 20;
/// Largest number of acks the backend puts in one JSON array.
const ACK_BATCH: usize = 100;

// ---------------------------------------------------------------- arguments

/// Which phases to run.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
enum Mode {
    Both,
    Saturation,
    Paced,
}

/// Uplink benchmark: N devices → ferry → Mosquitto → one backend.
#[derive(Parser, Clone, Debug)]
#[command(name = "uplink")]
struct Args {
    /// Devices (N).
    #[arg(long, default_value_t = 100)]
    devices: usize,
    /// Messages each device sends per phase.
    #[arg(long, default_value_t = 2000)]
    messages_per_device: usize,
    /// Payload of each message, bytes.
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Total msgs/s for the paced phase; 0 = half the saturation stored rate.
    #[arg(long, value_name = "MSGS_PER_S", default_value_t = 0.0)]
    rate: f64,
    /// Most messages a device keeps without a `stored` receipt.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Phases to run.
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    mode: Mode,
    /// store.sync.
    #[arg(long, default_value = "full", value_parser = ["full", "normal"])]
    sync: String,
    /// north.max_inflight (ferry's default when not given).
    #[arg(long, value_name = "N")]
    max_inflight: Option<u32>,
    /// Bound on each phase, seconds.
    #[arg(long = "timeout-s", value_name = "S", default_value = "120", value_parser = support::parse_secs)]
    timeout: Duration,
    /// How long to wait for other work on the machine to finish first, seconds.
    #[arg(long = "quiet-wait-s", value_name = "S", default_value = "120", value_parser = support::parse_secs)]
    quiet_wait: Duration,
    /// TCP_NODELAY on the bench's device and backend sockets.
    #[arg(long, value_name = "true|false", default_value_t = true, action = clap::ArgAction::Set)]
    client_nodelay: bool,
    #[command(flatten)]
    _cargo: CargoBench,
}

impl Args {
    /// The flags, checked; exits with a usage error on a bad one.
    fn parse_checked() -> Args {
        let args = Args::parse();
        if args.devices == 0 || args.messages_per_device == 0 || args.window == 0 {
            support::invalid::<Args>(
                "--devices, --messages-per-device and --window must be at least 1".into(),
            );
        }
        if !(args.rate >= 0.0 && args.rate.is_finite()) {
            support::invalid::<Args>("--rate must be a number ≥ 0".into());
        }
        args
    }
}

// ----------------------------------------------------------- wire messages

/// A receipt on `devices/{id}/ack` (unknown fields such as `reason` ignored).
#[derive(Deserialize)]
struct Receipt<'a> {
    #[serde(borrow)]
    msg_id: Option<&'a str>,
    #[serde(borrow)]
    status: &'a str,
    seq: Option<u64>,
}

/// The part of a north uplink message the backend needs to ack it.
#[derive(Deserialize)]
struct NorthUp<'a> {
    #[serde(borrow)]
    device: &'a str,
    #[serde(borrow)]
    msg_id: &'a str,
}

#[derive(Serialize)]
struct BackendAck<'a> {
    device: &'a str,
    msg_id: &'a str,
    status: &'static str,
}

/// `{"msg_id":"{prefix}{n}","payload":"xxx…"}`: `prefix` is `{run}-{i}-`.
fn envelope(prefix: &str, n: usize, payload: &str) -> Vec<u8> {
    let mut buf = Vec::with_capacity(prefix.len() + payload.len() + 40);
    buf.extend_from_slice(b"{\"msg_id\":\"");
    buf.extend_from_slice(prefix.as_bytes());
    let _ = write!(buf, "{n}");
    buf.extend_from_slice(b"\",\"payload\":\"");
    buf.extend_from_slice(payload.as_bytes());
    buf.extend_from_slice(b"\"}");
    buf
}

// ------------------------------------------------------------------ devices

/// What one phase asks of every device.
struct PhaseCtx {
    run_id: String,
    south_port: u16,
    messages: usize,
    window: usize,
    payload: String,
    /// Per-device interval between publishes; `None` = as fast as the window allows.
    period: Option<Duration>,
    devices: usize,
    /// Time origin for the `*_ns` fields.
    origin: Instant,
    deadline: tokio::time::Instant,
    go: watch::Receiver<bool>,
}

impl PhaseCtx {
    fn now_ns(&self) -> u64 {
        (self.origin.elapsed().as_nanos() as u64).max(1)
    }
}

/// Shared by a device's publisher task and its event-loop task.
struct DeviceShared {
    /// ns since `origin` just before message `n` was published; 0 = not yet.
    sent_at: Box<[AtomicU64]>,
    /// One permit per message that may be outstanding without `stored`.
    window: Semaphore,
}

const STORED: u8 = 1;
const DELIVERED: u8 = 2;
const FAILED: u8 = 4;

/// What one device saw in one phase; summed into [`PhaseResult`].
struct DeviceResult {
    stored: u64,
    delivered: u64,
    failed: u64,
    rejected: u64,
    duplicate_receipts: u64,
    /// `delivered` before `stored`, or a receipt whose seq differs from the first.
    order_or_seq_errors: u64,
    unparsable: u64,
    /// Receipts for an earlier phase's messages (late `delivered`s).
    foreign: u64,
    conn_errors: u64,
    reconnects: u64,
    resent: u64,
    first_publish_ns: u64,
    last_stored_ns: u64,
    last_delivered_ns: u64,
    latency_us: Histogram<u64>,
    timed_out: bool,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("static histogram bounds")
}

impl DeviceResult {
    fn new() -> Self {
        DeviceResult {
            stored: 0,
            delivered: 0,
            failed: 0,
            rejected: 0,
            duplicate_receipts: 0,
            order_or_seq_errors: 0,
            unparsable: 0,
            foreign: 0,
            conn_errors: 0,
            reconnects: 0,
            resent: 0,
            first_publish_ns: u64::MAX,
            last_stored_ns: 0,
            last_delivered_ns: 0,
            latency_us: new_histogram(),
            timed_out: false,
        }
    }
}

/// Event-loop side of one device: receipts, latency, window refills.
struct DeviceLoop {
    ctx: Arc<PhaseCtx>,
    shared: Arc<DeviceShared>,
    prefix: String,
    topic_up: String,
    state: Vec<u8>,
    seq: Vec<u64>,
    r: DeviceResult,
}

impl DeviceLoop {
    fn finished(&self) -> bool {
        self.r.delivered + self.r.failed >= self.ctx.messages as u64
    }

    fn on_receipt(&mut self, body: &[u8]) {
        let Ok(rc) = serde_json::from_slice::<Receipt>(body) else {
            self.r.unparsable += 1;
            return;
        };
        if rc.status == "rejected" {
            self.r.rejected += 1;
            return;
        }
        let Some(n) = rc
            .msg_id
            .and_then(|id| id.strip_prefix(self.prefix.as_str()))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&n| n < self.ctx.messages)
        else {
            self.r.foreign += 1;
            return;
        };
        let now = self.ctx.now_ns();
        let st = self.state[n];
        if let Some(seq) = rc.seq {
            if self.seq[n] == 0 {
                self.seq[n] = seq;
            } else if self.seq[n] != seq {
                self.r.order_or_seq_errors += 1;
            }
        }
        match rc.status {
            "stored" if st & (STORED | FAILED) == 0 => self.mark_stored(n, now),
            "delivered" if st & DELIVERED == 0 => {
                if st & (STORED | FAILED) == 0 {
                    // Receipts must come in state order; count it and go on.
                    self.r.order_or_seq_errors += 1;
                    self.mark_stored(n, now);
                }
                self.state[n] |= DELIVERED;
                self.r.delivered += 1;
                self.r.last_delivered_ns = now;
            }
            "failed" if st & (FAILED | DELIVERED) == 0 => {
                if st & STORED == 0 {
                    self.shared.window.add_permits(1);
                }
                self.state[n] |= FAILED;
                self.r.failed += 1;
            }
            "stored" | "delivered" | "failed" => self.r.duplicate_receipts += 1,
            _ => self.r.unparsable += 1,
        }
    }

    fn mark_stored(&mut self, n: usize, now: u64) {
        self.state[n] |= STORED;
        self.r.stored += 1;
        self.r.last_stored_ns = now;
        let sent = self.shared.sent_at[n].load(Ordering::Acquire);
        if sent != 0 {
            self.r
                .latency_us
                .saturating_record(now.saturating_sub(sent) / 1000);
        }
        self.shared.window.add_permits(1);
    }

    /// After a reconnect without a session: a device resends what it has
    /// no `stored` for (same msg_id).
    fn resend_unstored(&mut self, client: &AsyncClient) {
        for n in 0..self.ctx.messages {
            let sent = self.shared.sent_at[n].load(Ordering::Acquire) != 0;
            if sent && self.state[n] & (STORED | FAILED) == 0 {
                let body = envelope(&self.prefix, n, &self.ctx.payload);
                if client
                    .try_publish(self.topic_up.clone(), QoS::AtLeastOnce, false, body)
                    .is_ok()
                {
                    self.r.resent += 1;
                }
            }
        }
    }
}

/// TCP options of the bench's own clients. With Nagle on, a client's small
/// writes wait for the peer's delayed ACK (~40 ms on Linux) and the figures
/// measure that, not ferry.
fn network_options(nodelay: bool) -> NetworkOptions {
    let mut n = NetworkOptions::new();
    n.set_tcp_nodelay(nodelay);
    n
}

fn device_options(i: usize, port: u16, window: usize) -> MqttOptions {
    let mut o = MqttOptions::new(format!("dev-{i}"), "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_clean_session(true)
        .set_max_packet_size(1 << 20, 1 << 20)
        .set_inflight((window + 64).clamp(128, u16::MAX as usize) as u16)
        .set_request_channel_capacity(2 * window + 256);
    o
}

/// The device's event loop: connects, subscribes to its receipts, signals
/// `ready` on SubAck, then handles receipts until everything is delivered
/// (or failed) or the phase deadline passes.
async fn device_loop(
    mut el: EventLoop,
    client: AsyncClient,
    mut dl: DeviceLoop,
    i: usize,
    ready: oneshot::Sender<()>,
) -> DeviceResult {
    let topic_ack = format!("devices/dev-{i}/ack");
    let mut ready = Some(ready);
    let mut connected_once = false;
    let mut backoff = Duration::from_millis(50);
    while !dl.finished() {
        let Ok(ev) = timeout_at(dl.ctx.deadline, el.poll()).await else {
            dl.r.timed_out = true;
            break;
        };
        match ev {
            Ok(Event::Incoming(Packet::Publish(p))) => dl.on_receipt(&p.payload),
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                backoff = Duration::from_millis(50);
                let _ = client.try_subscribe(topic_ack.as_str(), QoS::AtLeastOnce);
                if connected_once {
                    dl.r.reconnects += 1;
                    dl.resend_unstored(&client);
                }
                connected_once = true;
            }
            Ok(Event::Incoming(Packet::SubAck(_))) => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            }
            Ok(_) => {}
            Err(e) => {
                dl.r.conn_errors += 1;
                if dl.r.conn_errors <= 2 {
                    eprintln!("dev-{i}: connection error: {e}");
                }
                // rumqttc reconnects on the next poll with no backoff of its own.
                sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
    let first = dl.shared.sent_at[0].load(Ordering::Acquire);
    if first != 0 {
        dl.r.first_publish_ns = first;
    }
    let _ = client.try_disconnect();
    let _ = timeout(Duration::from_secs(1), async {
        loop {
            match el.poll().await {
                Ok(Event::Outgoing(Outgoing::Disconnect)) | Err(_) => break,
                _ => {}
            }
        }
    })
    .await;
    dl.r
}

/// Publishes the device's messages: waits for a window permit (and, paced,
/// for the next tick of its schedule), then publishes QoS 1.
async fn publisher(
    client: AsyncClient,
    ctx: Arc<PhaseCtx>,
    shared: Arc<DeviceShared>,
    i: usize,
) -> u64 {
    let prefix = format!("{}-{i}-", ctx.run_id);
    let topic = format!("devices/dev-{i}/up/bench");
    let mut go = ctx.go.clone();
    if timeout_at(ctx.deadline, go.wait_for(|g| *g)).await.is_err() {
        return 0;
    }
    let mut ticker = ctx.period.map(|period| {
        // Spread the devices' schedules evenly over one period.
        let offset = period.mul_f64(i as f64 / ctx.devices as f64);
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
        t.set_missed_tick_behavior(MissedTickBehavior::Burst);
        t
    });
    let mut published = 0;
    for n in 0..ctx.messages {
        if let Some(t) = ticker.as_mut() {
            if timeout_at(ctx.deadline, t.tick()).await.is_err() {
                break;
            }
        }
        match timeout_at(ctx.deadline, shared.window.acquire()).await {
            Ok(Ok(permit)) => permit.forget(),
            _ => break,
        }
        let body = envelope(&prefix, n, &ctx.payload);
        shared.sent_at[n].store(ctx.now_ns(), Ordering::Release);
        let sent = client.publish(topic.as_str(), QoS::AtLeastOnce, false, body);
        match timeout_at(ctx.deadline, sent).await {
            Ok(Ok(())) => published += 1,
            _ => break,
        }
    }
    published
}

// ------------------------------------------------------------------ backend

#[derive(Default)]
struct BackendStats {
    received: AtomicU64,
    acked: AtomicU64,
    ack_publishes: AtomicU64,
    unparsable: AtomicU64,
    conn_errors: AtomicU64,
}

struct Backend {
    stats: Arc<BackendStats>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// One backend client on Mosquitto: subscribes `ferry/{gw}/up/#` and acks
/// every message `ok`, in JSON arrays of up to [`ACK_BATCH`].
async fn start_backend(
    port: u16,
    gateway: &str,
    deadline: Duration,
    nodelay: bool,
) -> Result<Backend, String> {
    let mut o = MqttOptions::new(
        format!("bench-backend-{}", std::process::id()),
        "127.0.0.1",
        port,
    );
    o.set_keep_alive(Duration::from_secs(30))
        .set_clean_session(true)
        .set_max_packet_size(1 << 20, 1 << 20)
        .set_inflight(1000)
        .set_request_channel_capacity(1024);
    let (client, mut el) = AsyncClient::new(o, 1024);
    el.set_network_options(network_options(nodelay));
    let stats = Arc::new(BackendStats::default());
    let (stop, stop_rx) = watch::channel(false);
    let (ack_tx, mut ack_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let (ready_tx, ready_rx) = oneshot::channel();
    let filter = format!("ferry/{gateway}/up/#");
    let ack_topic = format!("ferry/{gateway}/ack");
    let end = tokio::time::Instant::now() + deadline;

    let st = stats.clone();
    let c = client.clone();
    let mut stop1 = stop_rx.clone();
    let el_task = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut backoff = Duration::from_millis(50);
        loop {
            let ev = tokio::select! {
                _ = stop1.wait_for(|s| *s) => break,
                r = timeout_at(end, el.poll()) => match r { Ok(ev) => ev, Err(_) => break },
            };
            match ev {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    st.received.fetch_add(1, Ordering::Relaxed);
                    match serde_json::from_slice::<NorthUp>(&p.payload) {
                        Ok(up) => {
                            let mut buf =
                                Vec::with_capacity(up.device.len() + up.msg_id.len() + 48);
                            let ack = BackendAck {
                                device: up.device,
                                msg_id: up.msg_id,
                                status: "ok",
                            };
                            if serde_json::to_writer(&mut buf, &ack).is_ok() {
                                let _ = ack_tx.send(buf);
                            }
                        }
                        Err(_) => {
                            st.unparsable.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff = Duration::from_millis(50);
                    let _ = c.try_subscribe(filter.as_str(), QoS::AtLeastOnce);
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    if st.conn_errors.fetch_add(1, Ordering::Relaxed) < 2 {
                        eprintln!("backend: connection error: {e}");
                    }
                    sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    });

    let st = stats.clone();
    let mut stop2 = stop_rx;
    let ack_task = tokio::spawn(async move {
        let mut batch: Vec<u8> = Vec::with_capacity(64 * 1024);
        loop {
            let first = tokio::select! {
                _ = stop2.wait_for(|s| *s) => break,
                m = ack_rx.recv() => match m { Some(m) => m, None => break },
            };
            batch.clear();
            batch.push(b'[');
            batch.extend_from_slice(&first);
            let mut n = 1;
            while n < ACK_BATCH {
                let Ok(m) = ack_rx.try_recv() else { break };
                batch.push(b',');
                batch.extend_from_slice(&m);
                n += 1;
            }
            batch.push(b']');
            let publish =
                client.publish(ack_topic.as_str(), QoS::AtLeastOnce, false, batch.clone());
            match timeout_at(end, publish).await {
                Ok(Ok(())) => {
                    st.acked.fetch_add(n as u64, Ordering::Relaxed);
                    st.ack_publishes.fetch_add(1, Ordering::Relaxed);
                }
                _ => break,
            }
        }
        let _ = client.try_disconnect();
    });

    match timeout(Duration::from_secs(15), ready_rx).await {
        Ok(Ok(())) => Ok(Backend {
            stats,
            stop,
            tasks: vec![el_task, ack_task],
        }),
        _ => Err(format!(
            "backend: no SubAck for ferry/{gateway}/up/# from Mosquitto on port {port} within 15 s"
        )),
    }
}

impl Backend {
    async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = timeout(Duration::from_secs(2), t).await;
        }
    }
}

// ------------------------------------------------------------------- phases

struct PhaseResult {
    name: String,
    rate_target: Option<f64>,
    expected: u64,
    published: u64,
    stored: u64,
    delivered: u64,
    failed: u64,
    rejected: u64,
    duplicate_receipts: u64,
    order_or_seq_errors: u64,
    unparsable: u64,
    foreign: u64,
    conn_errors: u64,
    reconnects: u64,
    resent: u64,
    devices_timed_out: usize,
    first_publish_ns: u64,
    last_stored_ns: u64,
    last_delivered_ns: u64,
    latency_us: Histogram<u64>,
    cpu: CpuUse,
    elapsed: Duration,
}

impl PhaseResult {
    fn stored_rate(&self) -> f64 {
        rate(self.stored, self.first_publish_ns, self.last_stored_ns)
    }
    fn e2e_rate(&self) -> f64 {
        rate(
            self.delivered,
            self.first_publish_ns,
            self.last_delivered_ns,
        )
    }
    fn complete(&self) -> bool {
        self.stored == self.expected && self.delivered + self.failed == self.expected
    }
}

fn rate(count: u64, from_ns: u64, to_ns: u64) -> f64 {
    if count == 0 || to_ns <= from_ns {
        return 0.0;
    }
    count as f64 / ((to_ns - from_ns) as f64 / 1e9)
}

/// Processes whose CPU time the report shows: (label, pid).
type Watched = Vec<(String, u32)>;

async fn run_phase(
    args: &Args,
    name: &str,
    south_port: u16,
    rate_target: Option<f64>,
    watched: &Watched,
) -> Result<PhaseResult, String> {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let run_id = format!("b{unix_ms:x}{}", &name[..1]);
    let (go_tx, go_rx) = watch::channel(false);
    let period = rate_target.map(|r| Duration::from_secs_f64(args.devices as f64 / r));
    let ctx = Arc::new(PhaseCtx {
        run_id,
        south_port,
        messages: args.messages_per_device,
        window: args.window,
        payload: "x".repeat(args.payload_bytes),
        period,
        devices: args.devices,
        origin: Instant::now(),
        deadline: tokio::time::Instant::now() + args.timeout,
        go: go_rx,
    });

    // Connect and subscribe every device before anyone publishes.
    let mut loops = Vec::with_capacity(args.devices);
    let mut pubs = Vec::with_capacity(args.devices);
    for group in (0..args.devices).collect::<Vec<_>>().chunks(CONNECT_GROUP) {
        let mut readies = Vec::new();
        for &i in group {
            let (client, mut el) = AsyncClient::new(
                device_options(i, ctx.south_port, ctx.window),
                2 * ctx.window + 256,
            );
            el.set_network_options(network_options(args.client_nodelay));
            let shared = Arc::new(DeviceShared {
                sent_at: (0..ctx.messages).map(|_| AtomicU64::new(0)).collect(),
                window: Semaphore::new(ctx.window),
            });
            let dl = DeviceLoop {
                ctx: ctx.clone(),
                shared: shared.clone(),
                prefix: format!("{}-{i}-", ctx.run_id),
                topic_up: format!("devices/dev-{i}/up/bench"),
                state: vec![0; ctx.messages],
                seq: vec![0; ctx.messages],
                r: DeviceResult::new(),
            };
            let (ready_tx, ready_rx) = oneshot::channel();
            loops.push(tokio::spawn(device_loop(
                el,
                client.clone(),
                dl,
                i,
                ready_tx,
            )));
            pubs.push(tokio::spawn(publisher(client, ctx.clone(), shared, i)));
            readies.push((i, ready_rx));
        }
        for (i, rx) in readies {
            if !matches!(timeout(Duration::from_secs(30), rx).await, Ok(Ok(()))) {
                return Err(format!(
                    "dev-{i}: no SubAck from ferry's south broker on port {} within 30 s",
                    ctx.south_port
                ));
            }
        }
    }

    let cpu_before = CpuSnapshot::take(watched);
    let wall = Instant::now();
    let _ = go_tx.send(true);

    let mut r = PhaseResult {
        name: name.to_string(),
        rate_target,
        expected: (args.devices * args.messages_per_device) as u64,
        published: 0,
        stored: 0,
        delivered: 0,
        failed: 0,
        rejected: 0,
        duplicate_receipts: 0,
        order_or_seq_errors: 0,
        unparsable: 0,
        foreign: 0,
        conn_errors: 0,
        reconnects: 0,
        resent: 0,
        devices_timed_out: 0,
        first_publish_ns: u64::MAX,
        last_stored_ns: 0,
        last_delivered_ns: 0,
        latency_us: new_histogram(),
        cpu: CpuUse::default(),
        elapsed: Duration::ZERO,
    };
    for p in pubs {
        r.published += p.await.unwrap_or(0);
    }
    for l in loops {
        let d = l.await.map_err(|e| format!("device task panicked: {e}"))?;
        r.stored += d.stored;
        r.delivered += d.delivered;
        r.failed += d.failed;
        r.rejected += d.rejected;
        r.duplicate_receipts += d.duplicate_receipts;
        r.order_or_seq_errors += d.order_or_seq_errors;
        r.unparsable += d.unparsable;
        r.foreign += d.foreign;
        r.conn_errors += d.conn_errors;
        r.reconnects += d.reconnects;
        r.resent += d.resent;
        r.devices_timed_out += usize::from(d.timed_out);
        r.first_publish_ns = r.first_publish_ns.min(d.first_publish_ns);
        r.last_stored_ns = r.last_stored_ns.max(d.last_stored_ns);
        r.last_delivered_ns = r.last_delivered_ns.max(d.last_delivered_ns);
        let _ = r.latency_us.add(&d.latency_us);
    }
    r.elapsed = wall.elapsed();
    r.cpu = CpuSnapshot::take(watched).since(&cpu_before, watched);
    Ok(r)
}

// ------------------------------------------------------------ /proc helpers

/// Busy ticks of the whole machine (all cores), from /proc/stat.
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let f: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is inside user).
    f.iter().take(8).sum::<u64>() - f.get(3).copied().unwrap_or(0) - f.get(4).copied().unwrap_or(0)
}

/// Samples machine-wide CPU for a second at a time until it is nearly idle
/// (other builds or tests on a 2-core box distort every figure), at most
/// `wait`; returns the last sample in % of one core.
async fn wait_for_quiet_machine(wait: Duration) -> f64 {
    let end = Instant::now() + wait;
    loop {
        let (t0, b0) = (Instant::now(), machine_busy_ticks());
        sleep(Duration::from_secs(1)).await;
        let secs = t0.elapsed().as_secs_f64();
        let busy =
            100.0 * machine_busy_ticks().saturating_sub(b0) as f64 / clock_ticks_per_s() / secs;
        if busy < 20.0 || Instant::now() >= end {
            if busy >= 20.0 {
                eprintln!(
                    "warning: the machine is {busy:.0}% busy with other work; figures will be low"
                );
            }
            return busy;
        }
    }
}

/// CPU counters at one instant: the machine, each watched process, and the
/// threads of the first watched process (ferry).
struct CpuSnapshot {
    at: Instant,
    machine: u64,
    procs: Vec<u64>,
    /// Ticks per thread of ferry, keyed by `comm (tid)`.
    threads: BTreeMap<String, u64>,
}

/// CPU used over a phase, in % of one core.
#[derive(Default)]
struct CpuUse {
    machine: f64,
    procs: Vec<(String, f64)>,
    /// The busiest threads of ferry: `comm (tid)`, %.
    ferry_threads: Vec<(String, f64)>,
}

impl CpuSnapshot {
    fn take(watched: &Watched) -> CpuSnapshot {
        let procs = watched.iter().map(|(_, pid)| cpu_ticks(*pid)).collect();
        let threads = watched
            .iter()
            .find(|(label, _)| label == "ferry")
            .map(|(_, pid)| thread_ticks(*pid))
            .unwrap_or_default();
        CpuSnapshot {
            at: Instant::now(),
            machine: machine_busy_ticks(),
            procs,
            threads,
        }
    }

    fn since(&self, before: &CpuSnapshot, watched: &Watched) -> CpuUse {
        let secs = self.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let pct = |ticks: u64| 100.0 * ticks as f64 / clock_ticks_per_s() / secs;
        let procs = watched
            .iter()
            .zip(self.procs.iter().zip(&before.procs))
            .map(|((label, _), (now, then))| (label.clone(), pct(now.saturating_sub(*then))))
            .collect();
        let mut ferry_threads: Vec<(String, f64)> = self
            .threads
            .iter()
            .map(|(thread, now)| {
                let then = before.threads.get(thread).copied().unwrap_or(0);
                (thread.clone(), pct(now.saturating_sub(then)))
            })
            .filter(|(_, p)| *p >= 1.0)
            .collect();
        ferry_threads.sort_by(|a, b| b.1.total_cmp(&a.1));
        ferry_threads.truncate(8);
        CpuUse {
            machine: pct(self.machine.saturating_sub(before.machine)),
            procs,
            ferry_threads,
        }
    }
}

// -------------------------------------------------------------- environment

fn start_env(args: &Args) -> Env {
    Env::start("bench-gw", |c| {
        c.south.max_payload_bytes = 65536.max(args.payload_bytes + 1024);
        c.store.sync = args.sync.clone();
        if let Some(m) = args.max_inflight {
            c.north.max_inflight = m as usize;
        }
    })
}

// ------------------------------------------------------------------- report

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn print_phase(r: &PhaseResult) {
    let label = match r.rate_target {
        Some(rate) => format!("{} at {rate:.0} msgs/s", r.name),
        None => r.name.clone(),
    };
    let status = if r.complete() {
        "complete"
    } else {
        "INCOMPLETE"
    };
    let h = &r.latency_us;
    println!(
        "phase: {label} ({status}, {:.1} s)",
        r.elapsed.as_secs_f64()
    );
    println!(
        "  messages: {} expected, {} published, {} stored, {} delivered",
        r.expected, r.published, r.stored, r.delivered
    );
    println!("  stored throughput: {:.0} msgs/s", r.stored_rate());
    println!("  end-to-end throughput: {:.0} msgs/s", r.e2e_rate());
    println!(
        "  stored latency ms: p50 {} p90 {} p99 {} max {} (n = {})",
        ms(h.value_at_quantile(0.50)),
        ms(h.value_at_quantile(0.90)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
        h.len()
    );
    println!(
        "  missing receipts: stored {}, delivered {}",
        r.expected.saturating_sub(r.stored + r.failed),
        r.expected.saturating_sub(r.delivered + r.failed)
    );
    println!(
        "  anomalies: failed {}, rejected {}, duplicate receipts {}, order/seq errors {}, unparsable {}, late from earlier phase {}",
        r.failed, r.rejected, r.duplicate_receipts, r.order_or_seq_errors, r.unparsable, r.foreign
    );
    println!(
        "  device links: connection errors {}, reconnects {}, resent {}, devices timed out {}",
        r.conn_errors, r.reconnects, r.resent, r.devices_timed_out
    );
    let list = |v: &[(String, f64)]| {
        v.iter()
            .map(|(l, pct)| format!("{l} {pct:.0}%"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ours: f64 = r.cpu.procs.iter().map(|(_, p)| p).sum();
    println!(
        "  cpu (100% = one core): machine {:.0}% of {}00%: {}, everything else {:.0}%",
        r.cpu.machine,
        cores(),
        list(&r.cpu.procs),
        (r.cpu.machine - ours).max(0.0)
    );
    println!("  ferry's busiest threads: {}", list(&r.cpu.ferry_threads));
    let others = r.cpu.machine - ours;
    if others > 25.0 {
        println!(
            "  warning: other work used {others:.0}% CPU during this phase; the figures above are low"
        );
    }
}

// --------------------------------------------------------------------- main

fn main() {
    let args = Args::parse_checked();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = rt.block_on(bench(args)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn bench(args: Args) -> Result<(), String> {
    let before = wait_for_quiet_machine(args.quiet_wait).await;
    let env = start_env(&args);
    let backend_deadline = args.timeout * 3 + Duration::from_secs(60);
    let backend = start_backend(
        env.mosquitto.port,
        &env.ferry.gateway,
        backend_deadline,
        args.client_nodelay,
    )
    .await?;
    let watched: Watched = vec![
        ("ferry".to_string(), env.ferry_pid),
        ("mosquitto".to_string(), env.mosquitto_pid),
        ("bench clients".to_string(), std::process::id()),
    ]
    .into_iter()
    .filter(|(_, pid)| *pid != 0)
    .collect();

    println!("ferry uplink benchmark");
    println!("  devices: {}", args.devices);
    println!("  payload bytes: {}", args.payload_bytes);
    println!("  messages per device: {}", args.messages_per_device);
    println!("  window (unstored per device): {}", args.window);
    println!("  store sync: {}", args.sync);
    println!("  client TCP_NODELAY: {}", args.client_nodelay);
    if let Some(m) = args.max_inflight {
        println!("  north max_inflight: {m}");
    }
    println!("  cores: {}", cores());
    println!(
        "  machine busy before start: {before:.0}% of {}00%",
        cores()
    );

    let mut results = Vec::new();
    let mut saturation_rate = None;
    if args.mode != Mode::Paced {
        let r = run_phase(&args, "saturation", env.ferry.south_port, None, &watched).await?;
        print_phase(&r);
        saturation_rate = Some(r.stored_rate());
        results.push(r);
    }
    if args.mode != Mode::Saturation {
        let rate = if args.rate > 0.0 {
            Some(args.rate)
        } else {
            saturation_rate.map(|r| r / 2.0).filter(|r| *r > 0.0)
        };
        match rate {
            Some(rate) => {
                let r =
                    run_phase(&args, "paced", env.ferry.south_port, Some(rate), &watched).await?;
                print_phase(&r);
                results.push(r);
            }
            None => println!("phase: paced skipped (no --rate and no saturation rate)"),
        }
    }

    let stats = &backend.stats;
    println!(
        "backend: {} received, {} acked in {} ack messages, {} unparsable, {} connection errors",
        stats.received.load(Ordering::Relaxed),
        stats.acked.load(Ordering::Relaxed),
        stats.ack_publishes.load(Ordering::Relaxed),
        stats.unparsable.load(Ordering::Relaxed),
        stats.conn_errors.load(Ordering::Relaxed),
    );
    let kib = |k: Option<u64>| {
        k.map_or("n/a".to_string(), |k| {
            format!("{:.1} MiB", k as f64 / 1024.0)
        })
    };
    println!(
        "gateway memory: peak RSS (VmHWM) {}, RSS now {}",
        kib(vm_kib(env.ferry_pid, "VmHWM")),
        kib(vm_kib(env.ferry_pid, "VmRSS"))
    );
    backend.stop().await;
    if results.iter().any(|r| !r.complete()) {
        println!("ferry log tail:");
        for line in env.ferry.log_tail().lines() {
            println!("  | {line}");
        }
    }
    drop(env);
    Ok(())
}
