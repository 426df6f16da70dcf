//! Faults at random moments under mixed traffic (`support::traffic`), in
//! both south modes: ferry SIGKILLed and restarted, the upstream broker
//! killed and back after a while, the site broker restarted (external
//! mode), the backend application stopped and started, every device
//! dropping its connection at once mid-batch and reconnecting, SIGHUP,
//! power cuts (`support::powercut`), the disk full (the data directory on
//! a small tmpfs, filled, then freed) and steps of the wall clock
//! (libfaketime).
//! Afterwards everything sent reached its receiver, nothing answered
//! `stored` was lost, seqs have no gap and none was seen reused, the
//! backend got again at most one in-flight window per fault that can cause
//! it, and nothing was dead-lettered.
//!
//! CI runs 16 faults per mode (each kind at least once). `FERRY_FAULTS=N` runs N;
//! `FERRY_FAULT_MESSAGES=M` keeps the faults coming until M messages (up
//! and down) were sent; `FERRY_FAULT_DISK_MIB` sizes the tmpfs (256; a
//! store of a million messages wants about 2048); `FERRY_FAULT_START_S`
//! bounds each restart until devices are served (120); `FERRY_FAULT_SEED=S`
//! repeats a run (printed). Mounting the tmpfs needs root, as `.ci/run`
//! has.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::faketime::FakeClock;
use crate::support::powercut::{Cut, PowerLoss};
use crate::support::traffic::{env_or, one_at_a_time, Pace, Traffic};
use crate::support::{Ferry, FerryOpts, Mode, Mosquitto, Tmpfs};

const DEVICES: usize = 6;
const PACE: Pace = Pace {
    up_every: Duration::from_millis(5),
    down_every: Duration::from_millis(10),
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// SIGKILL, then a restart.
    Kill,
    /// The upstream broker SIGKILLed (it forgets every session) and back
    /// after a pause.
    UpstreamDown,
    /// The site broker SIGKILLed and back at once (external mode).
    SiteRestart,
    /// The backend application gone for a while.
    BackendAway,
    /// Every device drops its connection and reconnects.
    DeviceStorm,
    /// SIGHUP: a config reload.
    Hangup,
    /// The power goes: the store is what was fsynced (maybe with later
    /// writes, torn), and ferry starts from that.
    PowerCut,
    /// The data directory's disk fills for a while.
    DiskFull,
    /// The wall clock steps (NTP on a box without an RTC).
    ClockStep,
}

impl Fault {
    /// Can leave uplinks published north and not acked, to be published
    /// again: a window per device at most.
    fn republishes(self) -> bool {
        matches!(
            self,
            Fault::Kill | Fault::PowerCut | Fault::UpstreamDown | Fault::BackendAway
        )
    }
}

both_modes!(nothing_answered_stored_is_lost_under_random_faults);
async fn nothing_answered_stored_is_lost_under_random_faults(mode: Mode) {
    let faults: usize = env_or("FERRY_FAULTS", 16);
    let messages: usize = env_or("FERRY_FAULT_MESSAGES", 0);
    let seed: u64 = env_or("FERRY_FAULT_SEED", rand::random());
    eprintln!("{mode:?}: {faults} faults, {messages} messages, FERRY_FAULT_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let _alone = one_at_a_time().await;
    let gateway = "gw-faults";
    let mut mq = Mosquitto::start();
    let disk = Tmpfs::mount(env_or("FERRY_FAULT_DISK_MIB", 256));
    let power = PowerLoss::at(Some(disk.path.join("data")));
    let clock = FakeClock::new("+0");
    let opts = power.on(clock.on(FerryOpts::new(gateway, mq.port)));
    let mut ferry = Ferry::start_in(mode, opts);
    ferry.start_timeout = Duration::from_secs(env_or("FERRY_FAULT_START_S", 120));
    let mut slowest_start = ferry.last_start;
    let traffic = Traffic::start(ferry.south_port, mq.port, gateway, "fd", DEVICES, PACE);

    let mut kinds = vec![
        Fault::Kill,
        Fault::UpstreamDown,
        Fault::BackendAway,
        Fault::DeviceStorm,
        Fault::Hangup,
        Fault::PowerCut,
        Fault::DiskFull,
        Fault::ClockStep,
    ];
    if mode == Mode::External {
        kinds.push(Fault::SiteRestart);
    }
    let mut done: BTreeMap<Fault, usize> = BTreeMap::new();
    let started = Instant::now();
    let mut n = 0;
    while n < faults || traffic.sent() < messages {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
        // Each kind once before any twice, then at random.
        let fault = if n < kinds.len() {
            kinds[n]
        } else {
            kinds[rng.gen_range(0..kinds.len())]
        };
        let pause = Duration::from_millis(rng.gen_range(200..3000));
        match fault {
            Fault::Kill => tokio::task::block_in_place(|| ferry.restart()),
            Fault::UpstreamDown => {
                tokio::task::block_in_place(|| mq.kill());
                tokio::time::sleep(pause).await;
                tokio::task::block_in_place(|| mq.restart());
            }
            Fault::SiteRestart => tokio::task::block_in_place(|| {
                let site = ferry.site.as_mut().expect("a site broker");
                site.kill();
                site.restart();
            }),
            Fault::BackendAway => {
                traffic.backend(false);
                tokio::time::sleep(pause).await;
                traffic.backend(true);
            }
            Fault::DeviceStorm => traffic.reconnect_devices(),
            Fault::Hangup => ferry.hangup(),
            Fault::PowerCut => tokio::task::block_in_place(|| {
                let cut = [Cut::Clean, Cut::Torn, Cut::Scrambled][rng.gen_range(0..3)];
                power.cut(&mut ferry, cut, &mut rng);
                ferry.restart();
            }),
            Fault::DiskFull => {
                let ballast = tokio::task::block_in_place(|| disk.fill());
                tokio::time::sleep(pause).await;
                std::fs::remove_file(ballast).expect("free the disk");
            }
            Fault::ClockStep => {
                let steps = ["-1h", "-10m", "+0", "+10m", "+1h"];
                clock.set(steps[rng.gen_range(0..steps.len())]);
            }
        }
        if matches!(fault, Fault::Kill | Fault::PowerCut) {
            slowest_start = slowest_start.max(ferry.last_start);
        }
        *done.entry(fault).or_default() += 1;
        n += 1;
    }
    traffic.stop_sending();
    let faulted_for = started.elapsed();
    let stalled = traffic.wait_all_arrived(Duration::from_secs(60)).await;
    eprintln!("longest wait with nothing new arriving: {stalled:?}");

    let mut table = traffic.summary();
    table.push_str(&format!(
        "\n| slowest restart until devices served (ms) | {} |",
        slowest_start.as_millis()
    ));
    for (fault, count) in &done {
        table.push_str(&format!("\n| faults: {fault:?} | {count} |"));
    }
    eprintln!(
        "{mode:?}, seed {seed}, faults over {:.0} s:{table}",
        faulted_for.as_secs_f64()
    );
    let again = traffic.check_order();
    let window = DEVICES * ferry.config.north.max_inflight;
    let republishing: usize = done
        .iter()
        .filter(|(f, _)| f.republishes())
        .map(|(_, c)| c)
        .sum();
    assert!(
        again <= republishing * window,
        "{again} uplinks reached the backend again, over {republishing} faults × {window} in flight{table}"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        0,
        "dead letters after faults alone{table}\n{}",
        ferry.log_tail()
    );
}
