//! Memory per connected device, and memory after devices come and go.
//!
//! ```text
//! cargo bench --bench churn [-- --idle 10000 --rounds 4 --per-round 5000]
//! ```
//!
//! Starts the release `ferry` (north link down: nothing upstream), then:
//! 1. connects `--idle` devices (raw MQTT: CONNECT, SUBSCRIBE to their `ack`
//!    and `inbox`, `status` online) and keeps them idle; reports ferry's RSS
//!    before, with all connected, and after all left;
//! 2. runs `--rounds` rounds of `--per-round` new, distinct devices that
//!    connect the same way and leave; reports RSS after each round.

mod support;

use std::time::{Duration, Instant};

use clap::Parser;
use ferry::ids::DeviceId;
use ferry::protocol::control::{self, Status};
use ferry::protocol::topics::DeviceTopics;
use futures_util::stream::{self, StreamExt};
use support::harness::{free_port, Ferry, FerryOpts, RawMqtt};

/// Memory per connected device, and memory after devices come and go.
#[derive(Parser, Debug)]
#[command(name = "churn")]
struct Args {
    /// Devices connected at once and kept idle (0 skips this part).
    #[arg(long, default_value_t = 10_000)]
    idle: usize,
    /// Rounds of new devices that connect and leave.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Distinct devices in each round.
    #[arg(long, default_value_t = 5000)]
    per_round: usize,
    #[command(flatten)]
    _cargo: support::CargoBench,
}

async fn connect_all(port: u16, ids: Vec<String>) -> Vec<RawMqtt> {
    stream::iter(ids)
        .map(|id| async move {
            let topics =
                DeviceTopics::new("devices", &DeviceId::new(id.as_str()).expect("a device id"));
            let mut raw = RawMqtt::connect(port, &id, 600).await;
            raw.subscribe(&[topics.ack(), topics.inbox()]).await;
            let status = control::to_bytes(&Status {
                online: true,
                ts: None,
            });
            let online = raw.publish(&topics.status(), status);
            raw.send(online).await;
            raw
        })
        .buffer_unordered(256)
        .collect()
        .await
}

async fn leave_all(devices: Vec<RawMqtt>) {
    for mut d in devices {
        d.send(rumqttc::Packet::Disconnect).await;
    }
    // Let the broker and the pipeline see every device go, and ferry hand
    // the freed memory back (it trims every `memory::TRIM_EVERY`).
    tokio::time::sleep(ferry::memory::TRIM_EVERY + Duration::from_secs(2)).await;
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    if args.rounds == 0 || args.per_round == 0 {
        support::invalid::<Args>("--rounds and --per-round must be at least 1".into());
    }
    let max = args.idle.max(args.per_round) + 100;
    // Each device is a socket here and one in ferry (which inherits this).
    support::raise_fd_limit(max as u64 * 2 + 1024);
    let ferry = Ferry::start(FerryOpts::new("gw-churn", free_port()).with(|c| {
        c.south.max_connections = max;
        // The harness sees ferry up by its `gateway_started` line.
        c.log.level = "warn,ferry::gateway=info".to_string();
    }));
    let pid = ferry.pid().expect("ferry runs");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = support::vm_kib(pid, "VmRSS").unwrap_or(0);
    println!("ferry idle, no devices: {}", mib(base));

    if args.idle > 0 {
        let started = Instant::now();
        let ids = (0..args.idle).map(|i| format!("idle-{i}")).collect();
        let devices = connect_all(ferry.south_port, ids).await;
        let took = started.elapsed();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let connected = support::vm_kib(pid, "VmRSS").unwrap_or(0);
        println!(
            "{} idle devices connected in {:.1} s: {} ({:.1} KiB per device above idle)",
            args.idle,
            took.as_secs_f64(),
            mib(connected),
            (connected.saturating_sub(base)) as f64 / args.idle as f64
        );
        leave_all(devices).await;
        println!(
            "after they left: {}",
            mib(support::vm_kib(pid, "VmRSS").unwrap_or(0))
        );
    }

    let mut after = Vec::new();
    for round in 0..args.rounds {
        let ids = (0..args.per_round)
            .map(|i| format!("churn-{round}-{i}"))
            .collect();
        let devices = connect_all(ferry.south_port, ids).await;
        let connected = support::vm_kib(pid, "VmRSS").unwrap_or(0);
        leave_all(devices).await;
        let left = support::vm_kib(pid, "VmRSS").unwrap_or(0);
        println!(
            "round {}: {} distinct devices; {} connected, {} after they left",
            round + 1,
            args.per_round,
            mib(connected),
            mib(left)
        );
        after.push(left);
    }
    let growth = after.last().unwrap() - after[0].min(*after.last().unwrap());
    println!(
        "growth from round 1 to round {}: {}",
        args.rounds,
        mib(growth)
    );
    assert!(!ferry.log().contains(" ERROR "), "ferry logged an ERROR");
}
