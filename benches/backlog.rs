//! The drain of a north outage's backlog, and how long another device's
//! new alarm waits meanwhile (fair drain).
//!
//! The real gateway (release build, production timings) is given a store
//! with `--uplinks` stored uplinks of `--devices` devices (`bulk-0`, ...; one
//! by default; written straight into the stopped gateway's database in
//! ferry's own schema, as hours of outage would leave them), restarted
//! with its upstream Mosquitto down, and then the upstream comes back with
//! a backend that acks every uplink.
//! While the backlog drains, device `alarm` publishes one message every
//! `--alarm-every-ms`; an observer on the upstream stamps when each alarm
//! arrives and how many bulk messages arrived between its publish and its
//! arrival. It prints the start-up time on that store (until the south
//! listener accepts, and until the first device is connected), the drain
//! rate, ferry's peak RSS, and the alarms' latency.
//!
//! cargo bench --bench backlog -- [--uplinks 1000000] [--devices 1]
//!     [--alarm-every-ms 1000]

mod support;

use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;

use support::backend::AckingBackend;
use support::harness::backlog;
use support::harness::Device;
use support::report::{dist, mib};
use support::{reset_peak_rss, vm_kib, CargoBench, Env};

#[derive(Parser, Debug)]
#[command(about = "ferry: drain of a backlog after a north outage, and fairness")]
struct Args {
    /// Stored uplinks in all.
    #[arg(long, default_value_t = 1_000_000)]
    uplinks: u64,
    /// Backlogged devices they are spread over (`bulk-0`, ...).
    #[arg(long, default_value_t = 1)]
    devices: u64,
    /// How often the other device publishes an alarm while it drains.
    #[arg(long, default_value_t = 1000)]
    alarm_every_ms: u64,
    /// Gives up after this many seconds of draining.
    #[arg(long, default_value_t = 600)]
    limit_s: u64,
    #[command(flatten)]
    _cargo: CargoBench,
}

const GATEWAY: &str = "gw-backlog";

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench(args));
}

async fn bench(args: Args) {
    let mut env = Env::start(GATEWAY, |_| {});
    assert!(
        env.ferry.terminate(Duration::from_secs(20)),
        "ferry stopped"
    );
    let started = Instant::now();
    for d in 0..args.devices {
        let n = args.uplinks / args.devices + u64::from(d < args.uplinks % args.devices);
        backlog::write_uplinks(&env.ferry.data_dir, GATEWAY, &format!("bulk-{d}"), n);
    }
    let written = started.elapsed();
    // The outage: ferry starts with its upstream gone.
    env.mosquitto.stop();
    let restarted = Instant::now();
    env.ferry.restart();
    let listening = restarted.elapsed();
    let pid = env.ferry.pid().expect("ferry runs");
    reset_peak_rss(pid);
    let alarm = Device::connect(env.ferry.south_port, "alarm").await;
    let accepted = restarted.elapsed();
    env.mosquitto.restart();

    let arrivals = backlog::Arrivals::watch(env.mosquitto.port, GATEWAY).await;
    let backend = AckingBackend::start(
        env.mosquitto.port,
        GATEWAY,
        Duration::from_secs(args.limit_s + 60),
    )
    .await
    .expect("the backend");
    let north_back = Instant::now();

    let mut sent = Vec::new();
    let mut next_alarm = Instant::now();
    let mut delivered = 0;
    let limit = Duration::from_secs(args.limit_s);
    while north_back.elapsed() < limit {
        if Instant::now() >= next_alarm {
            let id = format!("alarm-{}", sent.len());
            let ahead = arrivals.bulk_seen();
            let at = Instant::now();
            alarm
                .publish_envelope("alarm", &id, json!({"i": sent.len()}))
                .await;
            sent.push((id, at, ahead));
            next_alarm += Duration::from_millis(args.alarm_every_ms);
        }
        let m = env.ferry.metrics();
        delivered = m.value(r#"ferry_messages_delivered_total{direction="up"}"#) as u64;
        if delivered >= args.uplinks + sent.len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = north_back.elapsed();
    let peak = vm_kib(pid, "VmHWM");
    backend.stop().await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let arrived = arrivals.stamps();
    let mut latencies = Vec::new();
    let mut between = Vec::new();
    for (id, at, before) in &sent {
        if let Some((when, at_arrival)) = arrived.get(id) {
            latencies.push(when.duration_since(*at).as_secs_f64() * 1000.0);
            between.push(at_arrival.saturating_sub(*before) as f64);
        }
    }
    between.sort_by(f64::total_cmp);
    println!("ferry backlog drain benchmark");
    println!(
        "  backlog: {} stored uplinks of {} device(s) (written in {:.1} s)",
        args.uplinks,
        args.devices,
        written.as_secs_f64()
    );
    println!(
        "  start-up on that store: south listening {:.2} s after the start, first device connected (CONNACK) {:.2} s",
        listening.as_secs_f64(),
        accepted.as_secs_f64()
    );
    println!(
        "  drained {} of {} in {:.1} s after north returned: {:.0} msgs/s; ferry peak RSS {}",
        delivered,
        args.uplinks + sent.len() as u64,
        drained.as_secs_f64(),
        delivered as f64 / drained.as_secs_f64(),
        mib(peak)
    );
    dist("alarm publish -> backend", latencies, sent.len());
    println!(
        "  bulk messages that reached the backend between an alarm's publish and its arrival: p50 {} max {}",
        support::report::quantile(&between, 0.5),
        between.last().copied().unwrap_or(f64::NAN)
    );
}
