//! Power cuts under mixed traffic (the model of `support::powercut`): at
//! random instants, ferry is killed and its store reduced to what the disk
//! would hold (what was fsynced; then nothing more, part of what followed
//! in order, or a random part of it, torn), and ferry starts from that.
//! After every cut SQLite's own check passes on the image and every message
//! answered `stored` before the cut is in it; after the last, every such
//! message reached its receiver, seqs have no gaps and nobody saw a seq
//! reused, and the backend got again at most what was in flight at each
//! cut.
//!
//! `FERRY_POWER_CUTS=200` runs the full count (CI runs 20);
//! `FERRY_POWER_SEED=N` repeats a run (the seed is printed).

use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::powercut::{Cut, PowerLoss};
use crate::support::traffic::{env_or, one_at_a_time, Key, Pace, Traffic};
use crate::support::{Ferry, FerryOpts, Mosquitto};

const DEVICES: usize = 4;
/// Each device sends an uplink every 4 ms; the backend a downlink to one of
/// them every 15 ms.
const PACE: Pace = Pace {
    up_every: Duration::from_millis(4),
    down_every: Duration::from_millis(15),
};

/// The image after a cut, opened on a copy: SQLite's integrity check, and
/// which of `up` and `down` it holds none of.
fn check_image(data_dir: &Path, up: &[Key], down: &[Key]) -> (String, Vec<Key>, Vec<Key>) {
    let copy = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(data_dir).expect("data dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).expect("copy");
    }
    let conn = rusqlite::Connection::open(copy.path().join("ferry.db")).expect("open the image");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap_or_else(|e| format!("integrity_check failed: {e}"));
    let has = |sql: &str, (device, msg_id): &Key| {
        conn.query_row(sql, [device, msg_id], |r| r.get::<_, i64>(0))
            .unwrap_or(0)
            > 0
    };
    let missing_up = up
        .iter()
        .filter(|k| {
            !has(
                "SELECT COUNT(*) FROM uplink WHERE device = ?1 AND msg_id = ?2",
                k,
            )
        })
        .cloned()
        .collect();
    let missing_down = down
        .iter()
        .filter(|k| {
            !has(
                "SELECT COUNT(*) FROM down_delivery d JOIN down_message m ON m.id = d.message_id \
                 WHERE d.device = ?1 AND m.msg_id = ?2",
                k,
            )
        })
        .cloned()
        .collect();
    (check, missing_up, missing_down)
}

/// Starts ferry (embedded south, the store under the power-loss model),
/// the devices and the backend, all sending.
fn start(gateway: &str, sync: &str) -> (Mosquitto, PowerLoss, Ferry, Traffic) {
    let mq = Mosquitto::start();
    let power = PowerLoss::new();
    let sync = sync.to_string();
    let ferry =
        Ferry::start(power.on(FerryOpts::new(gateway, mq.port).with(|c| c.store.sync = sync)));
    let traffic = Traffic::start(ferry.south_port, mq.port, gateway, "pc", DEVICES, PACE);
    (mq, power, ferry, traffic)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_answered_stored_survives_power_cuts_and_reaches_its_receiver() {
    let cuts: usize = env_or("FERRY_POWER_CUTS", 20);
    let seed: u64 = env_or("FERRY_POWER_SEED", rand::random());
    eprintln!("power cuts: {cuts}, FERRY_POWER_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let _alone = one_at_a_time().await;
    let (_mq, power, mut ferry, traffic) = start("gw-power", "full");

    let kinds = [Cut::Clean, Cut::Torn, Cut::Scrambled];
    let (mut kept_writes, mut torn_writes) = (0, 0);
    // How long ferry ran between cuts, and how long each cut, its checks
    // and the restart took (ferry down).
    let (mut up_for, mut down_for, mut longest_down) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for n in 0..cuts {
        let pause = Duration::from_millis(rng.gen_range(150..700));
        tokio::time::sleep(pause).await;
        up_for += pause;
        let down_since = std::time::Instant::now();
        let kind = kinds[n % kinds.len()];
        let report = tokio::task::block_in_place(|| power.cut(&mut ferry, kind, &mut rng));
        kept_writes += report.files.values().map(|f| f.1).sum::<usize>();
        torn_writes += report.files.values().map(|f| f.2).sum::<usize>();
        // Taken after the kill: every answer counted here left ferry before it.
        let (up, down) = traffic.stored();
        let (check, missing_up, missing_down) =
            tokio::task::block_in_place(|| check_image(&power.data_dir, &up, &down));
        assert_eq!(
            check, "ok",
            "cut {n} ({kind:?}, {report:?}, seed {seed}): the image fails SQLite's check"
        );
        assert!(
            missing_up.is_empty() && missing_down.is_empty(),
            "cut {n} ({kind:?}, {report:?}, seed {seed}): answered `stored` but not in the image: \
             {} of {} uplinks {:?}, {} of {} downlinks {:?}",
            missing_up.len(),
            up.len(),
            &missing_up[..missing_up.len().min(5)],
            missing_down.len(),
            down.len(),
            &missing_down[..missing_down.len().min(5)],
        );
        tokio::task::block_in_place(|| ferry.restart());
        let outage = down_since.elapsed();
        down_for += outage;
        longest_down = longest_down.max(outage);
    }
    traffic.stop_sending();
    eprintln!(
        "ferry ran {:.0} s between cuts, was down {:.0} s (a cut, the image's checks, the restart; longest {:.1} s)",
        up_for.as_secs_f64(),
        down_for.as_secs_f64(),
        longest_down.as_secs_f64()
    );
    let stalled = traffic.wait_all_arrived(Duration::from_secs(60)).await;
    eprintln!("longest wait with nothing new arriving: {stalled:?}");
    eprintln!("{}", traffic.summary());
    eprintln!("writes after the last fsync kept whole {kept_writes}, torn {torn_writes}");
    let again = traffic.check_order();
    // A duplicate at the backend is an uplink published and not yet acked
    // when the power went: at most each device's window per cut.
    let window = DEVICES * ferry.config.north.max_inflight;
    assert!(
        again <= cuts * window,
        "{again} uplinks reached the backend again, over {cuts} cuts × {window} in flight"
    );
}

/// The model has teeth: with `store.sync = "normal"` (no fsync per
/// commit) a cut loses messages that were answered `stored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_fsync_per_commit_a_cut_loses_messages_answered_stored() {
    let _alone = one_at_a_time().await;
    let (_mq, power, mut ferry, traffic) = start("gw-power-normal", "normal");
    let deadline = Instant::now() + Duration::from_secs(20);
    while traffic.stored().0.len() < 50 {
        assert!(Instant::now() < deadline, "no 50 `stored` receipts");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    traffic.stop_sending();
    let mut rng = StdRng::seed_from_u64(1);
    tokio::task::block_in_place(|| power.cut(&mut ferry, Cut::Clean, &mut rng));
    let (up, _) = traffic.stored();
    let (_, missing_up, _) = check_image(&power.data_dir, &up, &[]);
    assert!(
        !missing_up.is_empty(),
        "all {} uplinks answered `stored` are in the image, though no commit was fsynced",
        up.len()
    );
}
