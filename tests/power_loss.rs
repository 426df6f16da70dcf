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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
use ferry::protocol::receipt::ReceiptStatus;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::sync::watch;

use crate::support::powercut::{Cut, PowerLoss};
use crate::support::{boot_id, Ferry, FerryOpts, Mosquitto};

const DEVICES: usize = 4;
/// Each device sends an uplink this often; the backend a downlink to one
/// of them.
const UP_EVERY: Duration = Duration::from_millis(4);
const DOWN_EVERY: Duration = Duration::from_millis(15);

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

type Key = (String, String);

/// What the peers saw, shared by their tasks.
#[derive(Default)]
struct Seen {
    /// Uplinks sent, per device in order.
    up_sent: BTreeMap<String, Vec<String>>,
    /// Uplinks answered `stored` (or `delivered`) at the device: their seq.
    up_stored: HashMap<Key, u64>,
    /// Uplinks at the backend, each arrival's seq.
    north: HashMap<Key, Vec<u64>>,
    /// Downlinks sent.
    down_sent: Vec<Key>,
    /// Downlinks the backend has a `stored` receipt for.
    down_stored: HashSet<Key>,
    /// Inbox entries as each device's application took them: (seq, msg_id).
    inbox: HashMap<String, Vec<(u64, String)>>,
    /// Entries the device client dropped as already taken.
    inbox_duplicates: usize,
}

type Shared = Arc<Mutex<Seen>>;

/// A device: sends `{boot}-u{n}` every [`UP_EVERY`] while `sending`,
/// records receipts and inbox entries, confirms each batch at once (its
/// application commits in memory, and outlives ferry's restarts).
fn device(port: u16, id: String, boot: String, seen: Shared, sending: watch::Receiver<bool>) {
    tokio::spawn(async move {
        let mut client = DeviceClient::connect(DeviceOptions::new("127.0.0.1", port, &id));
        let mut tick = tokio::time::interval(UP_EVERY);
        let mut n = 0u64;
        loop {
            tokio::select! {
                event = client.events.recv() => match event {
                    Some(DeviceEvent::Receipt(r)) => {
                        let (Some(msg_id), Some(seq)) = (r.msg_id, r.seq) else { continue };
                        if matches!(r.status, ReceiptStatus::Stored | ReceiptStatus::Delivered) {
                            seen.lock().unwrap().up_stored.insert((id.clone(), msg_id.to_string()), seq.0);
                        }
                    }
                    Some(DeviceEvent::Inbox { messages, duplicates, .. }) => {
                        let last = messages.last().map(|m| m.seq);
                        let mut s = seen.lock().unwrap();
                        s.inbox_duplicates += duplicates;
                        let inbox = s.inbox.entry(id.clone()).or_default();
                        inbox.extend(messages.into_iter().map(|m| (m.seq, m.msg_id)));
                        drop(s);
                        if let Some(last) = last {
                            client.confirm(last);
                        }
                    }
                    Some(_) => {}
                    None => return,
                },
                _ = tick.tick(), if *sending.borrow() => {
                    n += 1;
                    let msg_id = format!("{boot}-u{n:06}");
                    client.send("t", &msg_id, json!({"n": n})).expect("msg_id");
                    seen.lock().unwrap().up_sent.entry(id.clone()).or_default().push(msg_id);
                }
            }
        }
    });
}

/// The backend: acks every uplink after recording it, sends a downlink to
/// one device after another every [`DOWN_EVERY`] while `sending`, records
/// the `stored` receipts of downlinks.
fn backend(port: u16, gateway: &str, boot: String, seen: Shared, sending: watch::Receiver<bool>) {
    let gateway = gateway.to_string();
    tokio::spawn(async move {
        let mut client = BackendClient::connect(BackendOptions::new("127.0.0.1", port, &gateway));
        let mut tick = tokio::time::interval(DOWN_EVERY);
        let mut n = 0usize;
        loop {
            tokio::select! {
                event = client.events.recv() => match event {
                    Some(BackendEvent::Uplink(m)) => {
                        let key = (m.device.to_string(), m.envelope.msg_id.to_string());
                        seen.lock().unwrap().north.entry(key).or_default().push(m.seq.0);
                        client.ack_message(&m);
                    }
                    Some(BackendEvent::Receipt(r)) if r.status == "stored" => {
                        if let (Some(device), Some(msg_id)) = (r.device, r.msg_id) {
                            seen.lock().unwrap().down_stored.insert((device, msg_id));
                        }
                    }
                    Some(_) => {}
                    None => return,
                },
                _ = tick.tick(), if *sending.borrow() => {
                    let to = format!("pc-{}", n % DEVICES);
                    let msg_id = format!("{boot}-d{n:05}");
                    n += 1;
                    client.send_down(&[to.as_str()], json!({"msg_id": msg_id, "payload": n}));
                    seen.lock().unwrap().down_sent.push((to, msg_id));
                }
            }
        }
    });
}

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
async fn start(
    gateway: &str,
    sync: &str,
) -> (Mosquitto, PowerLoss, Ferry, Shared, watch::Sender<bool>) {
    let mq = Mosquitto::start();
    let power = PowerLoss::new();
    let sync = sync.to_string();
    let ferry =
        Ferry::start(power.on(FerryOpts::new(gateway, mq.port).with(|c| c.store.sync = sync)));
    let seen = Shared::default();
    let (sending, rx) = watch::channel(true);
    let boot = boot_id();
    for d in 0..DEVICES {
        device(
            ferry.south_port,
            format!("pc-{d}"),
            boot.clone(),
            seen.clone(),
            rx.clone(),
        );
    }
    backend(mq.port, gateway, boot, seen.clone(), rx);
    (mq, power, ferry, seen, sending)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_answered_stored_survives_power_cuts_and_reaches_its_receiver() {
    let cuts: usize = env_or("FERRY_POWER_CUTS", 20);
    let seed: u64 = env_or("FERRY_POWER_SEED", rand::random());
    eprintln!("power cuts: {cuts}, FERRY_POWER_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let gateway = "gw-power";
    let (_mq, power, mut ferry, seen, sending) = start(gateway, "full").await;

    let kinds = [Cut::Clean, Cut::Torn, Cut::Scrambled];
    let mut torn_writes = 0;
    let mut kept_writes = 0;
    for n in 0..cuts {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(150..700))).await;
        let kind = kinds[n % kinds.len()];
        let report = tokio::task::block_in_place(|| power.cut(&mut ferry, kind, &mut rng));
        torn_writes += report.files.values().map(|f| f.2).sum::<usize>();
        kept_writes += report.files.values().map(|f| f.1).sum::<usize>();
        // Taken after the kill: every answer counted here left ferry before it.
        let (up, down): (Vec<Key>, Vec<Key>) = {
            let s = seen.lock().unwrap();
            (
                s.up_stored.keys().cloned().collect(),
                s.down_stored.iter().cloned().collect(),
            )
        };
        let (check, missing_up, missing_down) = check_image(&power.data_dir, &up, &down);
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
        ferry.restart();
    }
    sending.send(false).expect("peers run");

    // Everything sent reaches its receiver: the clients resend until
    // answered. A long run leaves a backlog, so the wait is for progress:
    // it fails when nothing new arrives for 30 s.
    let mut last = (Instant::now(), 0);
    loop {
        let (done, progress) = {
            let s = seen.lock().unwrap();
            let ups_answered = s.up_sent.iter().all(|(d, ids)| {
                ids.iter()
                    .all(|m| s.up_stored.contains_key(&(d.clone(), m.clone())))
            });
            let ups_arrived = s.up_stored.keys().all(|k| s.north.contains_key(k));
            let downs_stored = s.down_sent.iter().all(|k| s.down_stored.contains(k));
            let taken: HashSet<Key> = s
                .inbox
                .iter()
                .flat_map(|(d, e)| e.iter().map(|(_, m)| (d.clone(), m.clone())))
                .collect();
            let downs_taken = s.down_sent.iter().all(|k| taken.contains(k));
            let progress = s.up_stored.len() + s.north.len() + s.down_stored.len() + taken.len();
            (
                ups_answered && ups_arrived && downs_stored && downs_taken,
                progress,
            )
        };
        if done {
            break;
        }
        if progress > last.1 {
            last = (Instant::now(), progress);
        }
        assert!(
            last.0.elapsed() < Duration::from_secs(30),
            "nothing more arrived for 30 s after the last cut: {}",
            summary(&seen.lock().unwrap())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let s = seen.lock().unwrap();
    eprintln!("{}", summary(&s));
    eprintln!("writes after the last fsync kept whole {kept_writes}, torn {torn_writes}");
    // A duplicate at the backend is an uplink published and not yet acked
    // when the power went: at most each device's window per cut.
    let window = DEVICES * ferry.config.north.max_inflight;
    let again: usize = s.north.values().map(|seqs| seqs.len() - 1).sum();
    assert!(
        again <= cuts * window,
        "{again} uplinks reached the backend again, over {cuts} cuts × {window} in flight"
    );
    // Per device, the backend saw seqs 1..=n, one msg_id each, the same
    // seq every time and the seq of the device's receipt.
    for d in 0..DEVICES {
        let device = format!("pc-{d}");
        let mut by_seq: BTreeMap<u64, BTreeSet<&str>> = BTreeMap::new();
        for ((dev, msg_id), seqs) in &s.north {
            if *dev != device {
                continue;
            }
            let distinct: BTreeSet<u64> = seqs.iter().copied().collect();
            assert_eq!(
                distinct.len(),
                1,
                "{device}/{msg_id}: north under seqs {seqs:?}"
            );
            assert_eq!(
                s.up_stored.get(&(dev.clone(), msg_id.clone())),
                distinct.first(),
                "{device}/{msg_id}: receipt's seq"
            );
            by_seq.entry(seqs[0]).or_default().insert(msg_id);
        }
        let seqs: Vec<u64> = by_seq.keys().copied().collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "{device}: uplink seqs with a gap"
        );
        let reused: Vec<_> = by_seq.iter().filter(|(_, ids)| ids.len() > 1).collect();
        assert!(
            reused.is_empty(),
            "{device}: one seq for two messages: {reused:?}"
        );
        // Downlinks: in seq order, no gap, no entry twice.
        let inbox = s.inbox.get(&device).map(Vec::as_slice).unwrap_or(&[]);
        let got: Vec<u64> = inbox.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(
            got,
            (1..=got.len() as u64).collect::<Vec<_>>(),
            "{device}: inbox seqs"
        );
    }
}

/// The model has teeth: with `store.sync = "normal"` (no fsync per
/// commit) a cut loses messages that were answered `stored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_fsync_per_commit_a_cut_loses_messages_answered_stored() {
    let (_mq, power, mut ferry, seen, sending) = start("gw-power-normal", "normal").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.lock().unwrap().up_stored.len() < 50 {
        assert!(Instant::now() < deadline, "no 50 `stored` receipts");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sending.send(false).expect("peers run");
    let mut rng = StdRng::seed_from_u64(1);
    tokio::task::block_in_place(|| power.cut(&mut ferry, Cut::Clean, &mut rng));
    let up: Vec<Key> = seen.lock().unwrap().up_stored.keys().cloned().collect();
    let (_, missing_up, _) = check_image(&power.data_dir, &up, &[]);
    assert!(
        !missing_up.is_empty(),
        "all {} uplinks answered `stored` are in the image, though no commit was fsynced",
        up.len()
    );
}

fn summary(s: &Seen) -> String {
    let sent: usize = s.up_sent.values().map(Vec::len).sum();
    let arrivals: usize = s.north.values().map(Vec::len).sum();
    let lost_up = s
        .up_stored
        .keys()
        .filter(|k| !s.north.contains_key(*k))
        .count();
    let taken: usize = s.inbox.values().map(Vec::len).sum();
    format!(
        "\n| invariant | count |\n|---|---|\n\
         | uplinks sent | {sent} |\n\
         | uplinks answered `stored` at the device | {} |\n\
         | uplinks at the backend (distinct) | {} |\n\
         | answered `stored`, never at the backend | {lost_up} |\n\
         | uplink arrivals at the backend beyond the first | {} |\n\
         | downlinks sent | {} |\n\
         | downlinks answered `stored` to the backend | {} |\n\
         | inbox entries taken by devices | {taken} |\n\
         | inbox entries dropped by devices as already taken | {} |",
        s.up_stored.len(),
        s.north.len(),
        arrivals - s.north.len(),
        s.down_sent.len(),
        s.down_stored.len(),
        s.inbox_duplicates,
    )
}
