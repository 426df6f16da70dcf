//! What a scrape of the admin server costs on a large store.
//!
//! `/metrics` and `/api/status` count the backlogs in the store on every
//! request. This bench gives the real gateway a store with `--uplinks`
//! undelivered uplinks over `--devices` devices and `--downlinks`
//! undelivered downlink deliveries (written straight into a stopped
//! gateway's database, in ferry's own schema), restarts it with the north
//! link down (so nothing drains), and times `--scrapes` GETs of each path,
//! one after another, as a Prometheus server and an open status page would
//! make them. It prints each path's latency (p50, p99, max) and the figures
//! the scrape reported, which must equal what was written.
//!
//! cargo bench --bench scrape -- [--uplinks 1000000] [--downlinks 100000]
//!     [--devices 1000] [--scrapes 50]

mod support;

use std::time::{Duration, Instant};

use clap::Parser;
use rusqlite::params;

use support::harness::{Ferry, FerryOpts, Mosquitto};
use support::CargoBench;

#[derive(Parser, Debug)]
#[command(about = "ferry admin server: scrape cost on a large store")]
struct Args {
    /// Undelivered uplinks in the store.
    #[arg(long, default_value_t = 1_000_000)]
    uplinks: u64,
    /// Undelivered downlink deliveries in the store.
    #[arg(long, default_value_t = 100_000)]
    downlinks: u64,
    /// Devices they are spread over.
    #[arg(long, default_value_t = 1000)]
    devices: u64,
    /// GETs of each path.
    #[arg(long, default_value_t = 50)]
    scrapes: usize,
    #[command(flatten)]
    _cargo: CargoBench,
}

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench(args));
}

async fn bench(args: Args) {
    let mut mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new("gw-scrape", mq.port));
    // The schema is in place: stop, fill, and start again with north down.
    assert!(ferry.terminate(Duration::from_secs(20)), "ferry stopped");
    let started = Instant::now();
    fill(&ferry, &args);
    let filled = started.elapsed();
    mq.stop();
    ferry.restart();
    let db_bytes = std::fs::metadata(ferry.data_dir.join("ferry.db")).map_or(0, |m| m.len());
    println!("ferry admin scrape benchmark");
    println!(
        "store: {} undelivered uplinks, {} undelivered downlink deliveries, {} devices; ferry.db {:.1} MiB (written in {:.1} s)",
        args.uplinks,
        args.downlinks,
        args.devices,
        db_bytes as f64 / (1 << 20) as f64,
        filled.as_secs_f64()
    );
    // The first scrape opens the read connection: not timed.
    let m = ferry.metrics();
    assert_eq!(
        m.value(r#"ferry_backlog_messages{direction="up"}"#) as u64,
        args.uplinks
    );
    assert_eq!(
        m.value(r#"ferry_backlog_messages{direction="down"}"#) as u64,
        args.downlinks
    );
    for path in ["/metrics", "/api/status?top=10", "/healthz"] {
        let mut took: Vec<Duration> = (0..args.scrapes)
            .map(|_| {
                let t = Instant::now();
                let (code, body) = ferry.admin_get(path);
                assert_eq!(code, 200, "GET {path}: {body}");
                t.elapsed()
            })
            .collect();
        took.sort();
        let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize];
        println!(
            "GET {path:<20} p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms  ({} requests)",
            ms(at(0.5)),
            ms(at(0.99)),
            ms(*took.last().expect("at least one")),
            took.len()
        );
    }
    let rss = ferry
        .pid()
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_default();
    println!("ferry peak RSS after the scrapes: {rss}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Writes the backlog in ferry's schema, in one transaction.
fn fill(ferry: &Ferry, args: &Args) {
    let mut db =
        rusqlite::Connection::open(ferry.data_dir.join("ferry.db")).expect("open the store");
    let tx = db.transaction().expect("begin");
    let now = ferry::protocol::now_ms();
    let body = vec![b'x'; 200];
    {
        let mut up = tx
            .prepare(
                "INSERT INTO uplink (device, msg_id, seq, stream, state, body, stored_ms)
                 VALUES (?1, ?2, ?3, 't', 'stored', ?4, ?5)",
            )
            .expect("prepare");
        for i in 0..args.uplinks {
            let device = format!("dev-{}", i % args.devices);
            let seq = i / args.devices + 1;
            up.execute(params![
                device,
                format!("m-{i}"),
                seq as i64,
                body,
                now - 1000
            ])
            .expect("insert uplink");
        }
        let mut msg = tx
            .prepare("INSERT INTO down_message (msg_id, body, stored_ms) VALUES (?1, ?2, ?3)")
            .expect("prepare");
        let mut delivery = tx
            .prepare(
                "INSERT INTO down_delivery (device, seq, message_id, state, at_ms)
                 VALUES (?1, ?2, ?3, 'stored', ?4)",
            )
            .expect("prepare");
        for i in 0..args.downlinks {
            msg.execute(params![format!("d-{i}"), body, now - 1000])
                .expect("insert down_message");
            let id = tx.last_insert_rowid();
            let device = format!("dev-{}", i % args.devices);
            let seq = i / args.devices + 1;
            delivery
                .execute(params![device, seq as i64, id, now - 1000])
                .expect("insert delivery");
        }
        tx.execute(
            "INSERT INTO devices (device, up_seq, down_seq)
             SELECT device, max(seq), 0 FROM uplink GROUP BY device
             ON CONFLICT (device) DO UPDATE SET up_seq = excluded.up_seq",
            [],
        )
        .expect("devices");
        tx.execute(
            "INSERT INTO devices (device, up_seq, down_seq)
             SELECT device, 0, max(seq) FROM down_delivery GROUP BY device
             ON CONFLICT (device) DO UPDATE SET down_seq = excluded.down_seq",
            [],
        )
        .expect("devices");
    }
    tx.commit().expect("commit");
}
