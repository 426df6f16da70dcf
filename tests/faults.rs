//! Faults at random moments under mixed traffic (`support::traffic`), in
//! both south modes: ferry SIGKILLed and restarted, the upstream broker
//! killed and back after a while, the site broker restarted (external
//! mode), the backend application stopped and started, every device
//! dropping its connection at once mid-batch and reconnecting, SIGHUP,
//! the upstream cut off (frozen, SIGSTOP) for a while,
//! power cuts (`support::powercut`), the disk full (the data directory on
//! a small tmpfs, filled, then freed) and steps of the wall clock
//! (libfaketime). One more device takes its inbox and never confirms.
//! Afterwards everything sent reached its receiver, nothing answered
//! `stored` was lost, seqs have no gap and none was seen reused, the
//! backend got again at most one in-flight window per fault that can cause
//! it, and nothing was dead-lettered.
//!
//! CI runs 16 faults per mode (each kind at least once). `FERRY_FAULTS=N` runs N;
//! `FERRY_FAULT_MESSAGES=M` keeps the faults coming until M messages (up
//! and down) were sent; `FERRY_FAULT_DISK_MIB` sizes the tmpfs (256; a
//! store of a million messages wants about 2048); `FERRY_FAULT_START_S`
//! bounds each restart until devices are served (120);
//! `FERRY_FAULT_CUTOFF_S` is how long the upstream stays cut off (8);
//! `FERRY_FAULT_LOG=FILE` keeps ferry's log there;
//! `FERRY_FAULT_SEED=S`
//! repeats a run (printed). Mounting the tmpfs needs root, as `.ci/run`
//! has.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
use serde_json::json;

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

/// The device that takes its inbox and never confirms it.
const MUTE: &str = "fd-mute";
/// Downlinks queued for it before the faults.
const MUTE_DOWNLINKS: usize = 20;

/// Queues [`MUTE_DOWNLINKS`] downlinks for [`MUTE`] (waiting for their
/// `stored` receipts), then runs it: connected through every fault, it
/// counts the batches it is offered and confirms none.
async fn mute_device(north_port: u16, south_port: u16, gateway: &str) -> Arc<AtomicUsize> {
    let mut opts = BackendOptions::new("127.0.0.1", north_port, gateway);
    opts.client_id = "backend-of-the-mute".into();
    let mut backend = BackendClient::connect(opts);
    for n in 0..MUTE_DOWNLINKS {
        backend.send_down(
            &[MUTE],
            json!({"msg_id": format!("mute-{n}"), "payload": n}),
        );
    }
    let mut stored = HashSet::new();
    let wait = async {
        while stored.len() < MUTE_DOWNLINKS {
            match backend.events.recv().await {
                Some(BackendEvent::Receipt(r))
                    if r.status == "stored" && r.device.as_deref() == Some(MUTE) =>
                {
                    stored.extend(r.msg_id);
                }
                Some(_) => {}
                None => panic!("the backend client ended"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("the mute device's downlinks stored");
    let offers = Arc::new(AtomicUsize::new(0));
    let counted = offers.clone();
    let device = DeviceClient::connect(DeviceOptions::new("127.0.0.1", south_port, MUTE));
    tokio::spawn(async move {
        // The whole client and backend, not only the fields used: dropped,
        // they close their connections.
        let (mut device, _backend) = (device, backend);
        while let Some(event) = device.events.recv().await {
            // A batch offered again holds only entries the client already
            // handed over: counted as duplicates.
            if let DeviceEvent::Inbox {
                messages,
                duplicates,
                ..
            } = event
            {
                if !messages.is_empty() || duplicates > 0 {
                    counted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    offers
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// SIGKILL, then a restart.
    Kill,
    /// The upstream broker SIGKILLed (it forgets every session) and back
    /// after a pause.
    UpstreamDown,
    /// The upstream broker frozen (SIGSTOP) for `FERRY_FAULT_CUTOFF_S`,
    /// then let go: a link cut off, not refused; connections hang, pings
    /// go unanswered, connects get no CONNACK, until it comes back.
    UpstreamCutOff,
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
            Fault::Kill
                | Fault::PowerCut
                | Fault::UpstreamDown
                | Fault::UpstreamCutOff
                | Fault::BackendAway
        )
    }
}

both_modes!(nothing_answered_stored_is_lost_under_random_faults);
async fn nothing_answered_stored_is_lost_under_random_faults(mode: Mode) {
    let faults: usize = env_or("FERRY_FAULTS", 16);
    let messages: usize = env_or("FERRY_FAULT_MESSAGES", 0);
    let seed: u64 = env_or("FERRY_FAULT_SEED", rand::random());
    let cutoff = Duration::from_secs(env_or("FERRY_FAULT_CUTOFF_S", 8));
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
    if let Ok(keep) = std::env::var("FERRY_FAULT_LOG") {
        // A second name for ferry's log, left when the run's directory goes.
        let _ = std::fs::remove_file(&keep);
        std::fs::hard_link(&ferry.log_path, &keep)
            .expect("FERRY_FAULT_LOG on the same file system");
    }
    ferry.start_timeout = Duration::from_secs(env_or("FERRY_FAULT_START_S", 120));
    let mut slowest_start = ferry.last_start;
    let offers = mute_device(mq.port, ferry.south_port, gateway).await;
    let traffic = Traffic::start(ferry.south_port, mq.port, gateway, "fd", DEVICES, PACE);

    let mut kinds = vec![
        Fault::Kill,
        Fault::UpstreamDown,
        Fault::UpstreamCutOff,
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
    // Duplicates at the backend in the interval from each fault to the
    // next, per kind: (sum, largest), to say which faults make them.
    let mut again_after: BTreeMap<Fault, (usize, usize)> = BTreeMap::new();
    let mut interval: Option<(Fault, usize)> = None;
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
        let again_now = traffic.again_so_far();
        if let Some((before, at)) = interval.replace((fault, again_now)) {
            let e = again_after.entry(before).or_default();
            e.0 += again_now - at;
            e.1 = e.1.max(again_now - at);
        }
        match fault {
            Fault::Kill => tokio::task::block_in_place(|| ferry.restart()),
            Fault::UpstreamDown => {
                tokio::task::block_in_place(|| mq.kill());
                tokio::time::sleep(pause).await;
                tokio::task::block_in_place(|| mq.restart());
            }
            Fault::UpstreamCutOff => {
                let pid = mq.pid().expect("the upstream runs") as libc::pid_t;
                // SAFETY: kill(2) on the child's pid, which it still is
                // (not reaped: it runs).
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                tokio::time::sleep(cutoff).await;
                unsafe { libc::kill(pid, libc::SIGCONT) };
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

    if let Some((last, at)) = interval {
        let e = again_after.entry(last).or_default();
        let n = traffic.again_so_far() - at;
        e.0 += n;
        e.1 = e.1.max(n);
    }
    let mut table = traffic.summary();
    table.push_str(&format!(
        "\n| slowest restart until devices served (ms) | {} |",
        slowest_start.as_millis()
    ));
    for (fault, count) in &done {
        let (again, most) = again_after.get(fault).copied().unwrap_or_default();
        table.push_str(&format!(
            "\n| faults: {fault:?} (uplinks again until the next fault: in all, most after one) | {count} ({again}, {most}) |"
        ));
    }
    eprintln!(
        "{mode:?}, seed {seed}, faults over {:.0} s:{table}",
        faulted_for.as_secs_f64()
    );
    // The device that never confirms: everything queued for it waits in
    // the store, offered again and again, and held nobody else up.
    let offered = offers.load(Ordering::Relaxed);
    table.push_str(&format!(
        "\n| downlinks for a device that never confirms: waiting in the store, of {MUTE_DOWNLINKS} (batches offered to it) | {} ({offered}) |",
        ferry.query_i64(
            "SELECT COUNT(*) FROM down_delivery WHERE device = ?1 AND state = 'stored'",
            [MUTE]
        )
    ));
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
        ferry.query_i64(
            "SELECT COUNT(*) FROM down_delivery WHERE device = ?1 AND state = 'stored'",
            [MUTE]
        ),
        MUTE_DOWNLINKS as i64,
        "a device that never confirms keeps all its downlinks waiting{table}"
    );
    assert!(
        offered >= 2,
        "the unconfirmed batch is offered again{table}"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        0,
        "dead letters after faults alone{table}\n{}",
        ferry.log_tail()
    );
}
