//! Mixed traffic for the fault runs: devices and a backend on
//! `ferry::client`, each sending on a timer and recording what it was told,
//! so that after the faults a run can check that nothing answered `stored`
//! was lost and print what happened as a table.
//!
//! The peers behave as the protocol asks of them: a device resends each
//! uplink until it has a final receipt and confirms each inbox batch once
//! its application took it (here: into memory, which outlives ferry); the
//! backend acks each uplink once recorded and resends each downlink until
//! it has a `stored` receipt. Their applications outlive their
//! connections: a device that reconnects starts from its own cursor and
//! sends again what was never answered, and so does a restarted backend.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
use ferry::protocol::receipt::ReceiptStatus;
use serde_json::json;
use tokio::sync::watch;

/// (device, msg_id).
pub type Key = (String, String);

/// `key` from the environment, parsed; `default` when unset or unreadable
/// (the fault runs' sizes and seeds).
pub fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The fault runs each load the machine with traffic, restarts and
/// copies; taken first, this makes them run one at a time (other tests
/// still run beside them).
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

/// What the peers saw.
#[derive(Default)]
pub struct Seen {
    /// Uplinks sent, per device in order.
    pub up_sent: BTreeMap<String, Vec<String>>,
    /// Uplinks answered `stored` (or `delivered`) at the device: their seq.
    pub up_stored: HashMap<Key, u64>,
    /// Uplinks at the backend, each arrival's seq.
    pub north: HashMap<Key, Vec<u64>>,
    /// Downlinks sent.
    pub down_sent: Vec<Key>,
    /// Downlinks the backend has a `stored` (or later) receipt for.
    pub down_stored: HashSet<Key>,
    /// Inbox entries as each device's application took them: (seq, msg_id).
    pub inbox: HashMap<String, Vec<(u64, String)>>,
    /// The last seq each device confirmed.
    pub cursor: HashMap<String, u64>,
    /// Entries the device client dropped as already taken.
    pub inbox_duplicates: usize,
    /// Devices whose application connected anew after hearing nothing
    /// for [`WATCHDOG`] with uplinks unanswered, one entry each time.
    pub watchdog_reconnects: Vec<String>,
}

/// A device application that has heard nothing from the gateway for this
/// long while it has uplinks unanswered connects anew, as a careful one
/// does. It once hid a stall of `ferry::client`'s session after a CONNACK
/// (mended; docs/RELIABILITY.md), so the count is in every run's table:
/// it should stay at none.
pub const WATCHDOG: Duration = Duration::from_secs(20);

type Shared = Arc<Mutex<Seen>>;

/// How often each peer sends.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Each device sends an uplink this often.
    pub up_every: Duration,
    /// The backend sends a downlink (to one device after another) this often.
    pub down_every: Duration,
}

/// The devices and the backend, running.
pub struct Traffic {
    pub seen: Shared,
    pub devices: Vec<String>,
    south_port: u16,
    sending: watch::Sender<bool>,
    reconnects: watch::Sender<u64>,
    backend_up: watch::Sender<bool>,
}

impl Traffic {
    /// `devices` devices `{prefix}-{n}` on `south_port` (ferry's own broker
    /// or the site broker) and a backend for `gateway` on `north_port`,
    /// all sending at `pace`.
    pub fn start(
        south_port: u16,
        north_port: u16,
        gateway: &str,
        prefix: &str,
        devices: usize,
        pace: Pace,
    ) -> Traffic {
        Traffic::with(
            south_port,
            Some((north_port, gateway)),
            prefix,
            devices,
            pace,
        )
    }

    /// The devices of [`Traffic::start`] alone, sending uplinks only: the
    /// backend is someone else's (the fleet run's Python backends).
    pub fn devices_only(south_port: u16, prefix: &str, devices: usize, every: Duration) -> Traffic {
        let pace = Pace {
            up_every: every,
            down_every: Duration::MAX,
        };
        Traffic::with(south_port, None, prefix, devices, pace)
    }

    fn with(
        south_port: u16,
        backend: Option<(u16, &str)>,
        prefix: &str,
        devices: usize,
        pace: Pace,
    ) -> Traffic {
        let seen = Shared::default();
        let (sending, sending_rx) = watch::channel(true);
        let (reconnects, reconnects_rx) = watch::channel(0);
        let (backend_up, backend_up_rx) = watch::channel(true);
        let boot = super::boot_id();
        let ids: Vec<String> = (0..devices).map(|d| format!("{prefix}-{d}")).collect();
        for id in &ids {
            let device = Peer {
                seen: seen.clone(),
                boot: boot.clone(),
                sending: sending_rx.clone(),
            };
            tokio::spawn(device.device(
                south_port,
                id.clone(),
                pace.up_every,
                reconnects_rx.clone(),
            ));
        }
        if let Some((north_port, gateway)) = backend {
            let backend = Peer {
                seen: seen.clone(),
                boot,
                sending: sending_rx,
            };
            tokio::spawn(backend.backend(
                north_port,
                gateway.to_string(),
                ids.clone(),
                pace.down_every,
                backend_up_rx,
            ));
        }
        Traffic {
            seen,
            devices: ids,
            south_port,
            sending,
            reconnects,
            backend_up,
        }
    }

    /// Every device drops its connection at once and connects again (a
    /// reconnect storm; a batch in flight is left unconfirmed).
    pub fn reconnect_devices(&self) {
        self.reconnects.send_modify(|n| *n += 1);
    }

    /// The backend application stops (its connection dropped) or starts.
    pub fn backend(&self, up: bool) {
        self.backend_up.send_replace(up);
    }

    pub fn stop_sending(&self) {
        self.sending.send_replace(false);
    }

    /// Uplink arrivals at the backend beyond each message's first, so far.
    pub fn again_so_far(&self) -> usize {
        let s = self.seen.lock().unwrap();
        s.north
            .values()
            .map(|seqs| seqs.len().saturating_sub(1))
            .sum()
    }

    /// Messages sent so far, uplinks and downlinks.
    pub fn sent(&self) -> usize {
        let s = self.seen.lock().unwrap();
        s.up_sent.values().map(Vec::len).sum::<usize>() + s.down_sent.len()
    }

    /// What has been answered `stored` so far: (uplinks, downlinks).
    pub fn stored(&self) -> (Vec<Key>, Vec<Key>) {
        let s = self.seen.lock().unwrap();
        (
            s.up_stored.keys().cloned().collect(),
            s.down_stored.iter().cloned().collect(),
        )
    }

    /// Waits until everything sent has reached its receiver: every uplink
    /// answered and at the backend, every downlink `stored` and taken by its
    /// device. A long run leaves a backlog, so the wait is for progress: it
    /// fails when nothing new arrives for `quiet`. Returns the longest
    /// time nothing new arrived.
    pub async fn wait_all_arrived(&self, quiet: Duration) -> Duration {
        let mut last = (Instant::now(), 0);
        let mut longest = Duration::ZERO;
        loop {
            let (done, progress) = {
                let s = self.seen.lock().unwrap();
                let ups_answered = s.up_sent.iter().all(|(d, ids)| {
                    ids.iter()
                        .all(|m| s.up_stored.contains_key(&(d.clone(), m.clone())))
                });
                let ups_arrived = s.up_stored.keys().all(|k| s.north.contains_key(k));
                let downs_stored = s.down_sent.iter().all(|k| s.down_stored.contains(k));
                let taken = taken(&s);
                let downs_taken = s.down_sent.iter().all(|k| taken.contains(k));
                let progress =
                    s.up_stored.len() + s.north.len() + s.down_stored.len() + taken.len();
                (
                    ups_answered && ups_arrived && downs_stored && downs_taken,
                    progress,
                )
            };
            longest = longest.max(last.0.elapsed());
            if done {
                return longest;
            }
            if progress > last.1 {
                last = (Instant::now(), progress);
            }
            assert!(
                last.0.elapsed() < quiet,
                "nothing more arrived for {quiet:?} after the faults: {}\n{}\n{}",
                self.summary(),
                self.waiting(),
                self.sockets()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Checks what every run must show once everything arrived: per
    /// device, the backend saw seqs 1..=n, each under one msg_id and the
    /// same seq every time, the seq of the device's receipt; each device's
    /// inbox seqs are 1..=n in order. Returns how many uplinks reached the
    /// backend more than once.
    pub fn check_order(&self) -> usize {
        let s = self.seen.lock().unwrap();
        for device in &self.devices {
            let mut by_seq: BTreeMap<u64, BTreeSet<&str>> = BTreeMap::new();
            for ((dev, msg_id), seqs) in &s.north {
                if dev != device {
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
                    "{device}/{msg_id}: the receipt's seq"
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
            let inbox = s.inbox.get(device).map(Vec::as_slice).unwrap_or(&[]);
            let got: Vec<u64> = inbox.iter().map(|(seq, _)| *seq).collect();
            assert_eq!(
                got,
                (1..=got.len() as u64).collect::<Vec<_>>(),
                "{device}: inbox seqs"
            );
        }
        s.north.values().map(|seqs| seqs.len() - 1).sum()
    }

    /// Per device, what it still waits for: uplinks with no answer, and
    /// downlinks `stored` it has not taken.
    fn waiting(&self) -> String {
        let s = self.seen.lock().unwrap();
        let taken = taken(&s);
        let mut out =
            String::from("waiting, per device (uplinks unanswered, downlinks not taken):");
        for d in &self.devices {
            let up = s
                .up_sent
                .get(d)
                .into_iter()
                .flatten()
                .filter(|m| !s.up_stored.contains_key(&(d.clone(), (*m).clone())))
                .count();
            let down = s
                .down_sent
                .iter()
                .filter(|k| k.0 == *d && !taken.contains(*k))
                .count();
            out.push_str(&format!(" {d} {up}/{down};"));
        }
        out
    }

    /// The TCP sockets to and from the devices' port, with their queues
    /// (`ss`): which side of a stalled connection is not reading.
    fn sockets(&self) -> String {
        let port = self.south_port;
        let out = std::process::Command::new("ss")
            .args(["-tnpi", "state", "established"])
            .arg(format!("( sport = :{port} or dport = :{port} )"))
            .output();
        match out {
            Ok(out) => format!(
                "--- ss (port {port}) ---\n{}",
                String::from_utf8_lossy(&out.stdout)
            ),
            Err(e) => format!("ss not run: {e}"),
        }
    }

    /// The run's counts as a Markdown table.
    pub fn summary(&self) -> String {
        let s = self.seen.lock().unwrap();
        let sent: usize = s.up_sent.values().map(Vec::len).sum();
        let arrivals: usize = s.north.values().map(Vec::len).sum();
        let lost_up = s
            .up_stored
            .keys()
            .filter(|k| !s.north.contains_key(*k))
            .count();
        let taken = taken(&s);
        // Only this traffic's own downlinks (another backend's receipts
        // come on the same topic).
        let sent_down: HashSet<&Key> = s.down_sent.iter().collect();
        let lost_down = s
            .down_stored
            .iter()
            .filter(|k| sent_down.contains(k) && !taken.contains(*k))
            .count();
        format!(
            "\n| invariant | count |\n|---|---|\n\
             | uplinks sent | {sent} |\n\
             | uplinks answered `stored` at the device | {} |\n\
             | uplinks at the backend (distinct) | {} |\n\
             | answered `stored`, never at the backend | {lost_up} |\n\
             | uplink arrivals at the backend beyond the first | {} |\n\
             | downlinks sent | {} |\n\
             | downlinks answered `stored` to the backend | {} |\n\
             | downlinks taken by their device (distinct) | {} |\n\
             | answered `stored`, never taken by the device | {lost_down} |\n\
             | inbox entries dropped by devices as already taken | {} |\n\
             | device watchdog reconnects (nothing heard for {WATCHDOG:?}) | {:?} |",
            s.up_stored.len(),
            s.north.len(),
            arrivals - s.north.len(),
            s.down_sent.len(),
            s.down_stored
                .iter()
                .filter(|k| sent_down.contains(k))
                .count(),
            taken.len(),
            s.inbox_duplicates,
            s.watchdog_reconnects,
        )
    }
}

fn taken(s: &Seen) -> HashSet<Key> {
    s.inbox
        .iter()
        .flat_map(|(d, e)| e.iter().map(|(_, m)| (d.clone(), m.clone())))
        .collect()
}

/// What a peer's task shares.
struct Peer {
    seen: Shared,
    boot: String,
    sending: watch::Receiver<bool>,
}

impl Peer {
    /// A device: sends `{boot}-u{n}` every `every` while sending, records
    /// receipts and inbox entries, confirms each batch at once; on a
    /// reconnect it starts a new client from its cursor and sends again
    /// what was never answered.
    async fn device(
        self,
        port: u16,
        id: String,
        every: Duration,
        mut reconnects: watch::Receiver<u64>,
    ) {
        let connect = |cursor: u64| {
            let mut opts = DeviceOptions::new("127.0.0.1", port, &id);
            opts.cursor = cursor;
            DeviceClient::connect(opts)
        };
        let mut client = connect(0);
        // When the application last heard from the gateway.
        let mut heard = Instant::now();
        let mut watchdog = tokio::time::interval(Duration::from_secs(1));
        let mut tick = tokio::time::interval(every);
        let mut n = 0u64;
        loop {
            tokio::select! {
                event = client.events.recv() => match event {
                    Some(DeviceEvent::Receipt(r)) => {
                        heard = Instant::now();
                        let (Some(msg_id), Some(seq)) = (r.msg_id, r.seq) else { continue };
                        if matches!(r.status, ReceiptStatus::Stored | ReceiptStatus::Delivered) {
                            self.seen.lock().unwrap().up_stored.insert((id.clone(), msg_id.to_string()), seq.0);
                        }
                    }
                    Some(DeviceEvent::Inbox { messages, duplicates, .. }) => {
                        heard = Instant::now();
                        let last = messages.last().map(|m| m.seq);
                        let mut s = self.seen.lock().unwrap();
                        s.inbox_duplicates += duplicates;
                        let inbox = s.inbox.entry(id.clone()).or_default();
                        inbox.extend(messages.into_iter().map(|m| (m.seq, m.msg_id)));
                        if let Some(last) = last {
                            s.cursor.insert(id.clone(), last);
                            drop(s);
                            client.confirm(last);
                        }
                    }
                    Some(_) => {}
                    None => return,
                },
                changed = reconnects.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    drop(client);
                    let (cursor, unanswered) = self.to_resume(&id);
                    client = connect(cursor);
                    for msg_id in unanswered {
                        client.send("t", &msg_id, json!({"again": true})).expect("msg_id");
                    }
                    heard = Instant::now();
                }
                // The application's watchdog: nothing heard for a while
                // with uplinks unanswered, it connects anew (counted).
                _ = watchdog.tick(), if heard.elapsed() >= WATCHDOG => {
                    let (cursor, unanswered) = self.to_resume(&id);
                    if !unanswered.is_empty() {
                        drop(client);
                        self.seen.lock().unwrap().watchdog_reconnects.push(id.clone());
                        client = connect(cursor);
                        for msg_id in unanswered {
                            client.send("t", &msg_id, json!({"again": true})).expect("msg_id");
                        }
                    }
                    heard = Instant::now();
                }
                _ = tick.tick(), if *self.sending.borrow() => {
                    // The guard was read when this wait began: a stop
                    // since then ends the sending here, so nothing is
                    // sent after `stop_sending` returned.
                    if !*self.sending.borrow() {
                        continue;
                    }
                    n += 1;
                    let msg_id = format!("{}-u{n:06}", self.boot);
                    client.send("t", &msg_id, json!({"n": n})).expect("msg_id");
                    self.seen.lock().unwrap().up_sent.entry(id.clone()).or_default().push(msg_id);
                }
            }
        }
    }

    /// Where device `id` resumes: its cursor, and its uplinks never answered.
    fn to_resume(&self, id: &str) -> (u64, Vec<String>) {
        let s = self.seen.lock().unwrap();
        let unanswered = s
            .up_sent
            .get(id)
            .into_iter()
            .flatten()
            .filter(|m| !s.up_stored.contains_key(&(id.to_string(), (*m).clone())))
            .cloned()
            .collect();
        (s.cursor.get(id).copied().unwrap_or(0), unanswered)
    }

    /// The backend: acks every uplink once recorded, sends a downlink to
    /// one device after another every `every` while sending, records the
    /// `stored` receipts of downlinks. While stopped it has no connection;
    /// started again, it sends again every downlink with no `stored`
    /// receipt.
    async fn backend(
        self,
        port: u16,
        gateway: String,
        devices: Vec<String>,
        every: Duration,
        mut up: watch::Receiver<bool>,
    ) {
        let connect = || BackendClient::connect(BackendOptions::new("127.0.0.1", port, &gateway));
        let mut client = Some(connect());
        let mut tick = tokio::time::interval(every);
        let mut n = 0usize;
        loop {
            tokio::select! {
                event = async {
                    match client.as_mut() {
                        Some(c) => c.events.recv().await,
                        None => std::future::pending().await,
                    }
                } => match event {
                    Some(BackendEvent::Uplink(m)) => {
                        let key = (m.device.to_string(), m.envelope.msg_id.to_string());
                        self.seen.lock().unwrap().north.entry(key).or_default().push(m.seq.0);
                        if let Some(c) = &client {
                            c.ack_message(&m);
                        }
                    }
                    // A resent downlink the device already took is
                    // answered with where it stands: `delivered` or `read`.
                    Some(BackendEvent::Receipt(r)) if matches!(r.status, "stored" | "delivered" | "read") => {
                        if let (Some(device), Some(msg_id)) = (r.device, r.msg_id) {
                            self.seen.lock().unwrap().down_stored.insert((device, msg_id));
                        }
                    }
                    Some(_) => {}
                    None => return,
                },
                changed = up.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let now_up = *up.borrow_and_update();
                    match (now_up, client.is_some()) {
                        (false, true) => client = None,
                        (true, false) => {
                            let c = connect();
                            let again: Vec<Key> = {
                                let s = self.seen.lock().unwrap();
                                s.down_sent.iter().filter(|k| !s.down_stored.contains(*k)).cloned().collect()
                            };
                            for (to, msg_id) in again {
                                c.send_down(&[to.as_str()], json!({"msg_id": msg_id, "payload": "again"}));
                            }
                            client = Some(c);
                        }
                        _ => {}
                    }
                }
                _ = tick.tick(), if *self.sending.borrow() && client.is_some() => {
                    // As the devices': nothing after `stop_sending`.
                    if !*self.sending.borrow() {
                        continue;
                    }
                    let to = devices[n % devices.len()].clone();
                    let msg_id = format!("{}-d{n:06}", self.boot);
                    n += 1;
                    if let Some(c) = &client {
                        c.send_down(&[to.as_str()], json!({"msg_id": msg_id, "payload": n}));
                    }
                    self.seen.lock().unwrap().down_sent.push((to, msg_id));
                }
            }
        }
    }
}
