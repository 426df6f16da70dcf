//! The downlink path end to end: a backend on a real Mosquitto upstream, the
//! real `ferry` binary, and devices on ferry's south broker.
//!
//! Each test starts its own Mosquitto and ferry on free ports and checks one
//! behaviour of docs/PROTOCOL.md ("Downlink batches", and the downlink half
//! of "North") from the outside: receipts on `ferry/{gateway}/receipts`,
//! batches on `devices/{id}/inbox`, and rows in the store. Well-behaved
//! devices and the backend use ferry's client library; where a test needs
//! to see raw batches or to misbehave, it uses a bare rumqttc client.

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use common::{boot_id, Ferry, FerryOpts, Mosquitto};
use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions, InboxMessage};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, Publish, QoS, SubscribeFilter};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

const SECS_20: Duration = Duration::from_secs(20);
const SECS_30: Duration = Duration::from_secs(30);
const SECS_60: Duration = Duration::from_secs(60);
/// Long enough to see something that should not happen, short enough to
/// keep the suite fast.
const QUIET: Duration = Duration::from_millis(500);
/// Backend resend period where a test does not want resends.
const NO_RESEND: Duration = Duration::from_secs(120);

fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Polls `check` until it holds; panics after `timeout` naming `what`.
async fn eventually(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "not true within {timeout:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn opts_with(gateway: &str, north_port: u16, extra: &[&str]) -> FerryOpts {
    let mut opts = FerryOpts::new(gateway, north_port);
    opts.extra_toml = extra.iter().map(|s| s.to_string()).collect();
    opts
}

// ---------------------------------------------------------------------------
// Receipts north
// ---------------------------------------------------------------------------

fn status(r: &Value) -> &str {
    r["status"].as_str().unwrap_or("")
}

/// `(msg_id, device)`: what a downlink receipt is about.
type Key = (String, String);

fn key(msg_id: &str, device: &str) -> Key {
    (msg_id.to_string(), device.to_string())
}

fn key_of(r: &Value) -> Key {
    key(
        r["msg_id"].as_str().unwrap_or(""),
        r["device"].as_str().unwrap_or(""),
    )
}

/// The seq of every delivery with a `wanted` receipt; every repeat of a
/// receipt must carry the same seq.
fn seqs_with(receipts: &[Value], wanted: &str) -> HashMap<Key, u64> {
    let mut out = HashMap::new();
    for r in receipts.iter().filter(|r| status(r) == wanted) {
        let seq = r["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("`{wanted}` receipt without a u64 seq: {r}"));
        assert!(
            r["ts"].is_u64() || r["ts"].is_i64(),
            "receipt without ts: {r}"
        );
        if let Some(before) = out.insert(key_of(r), seq) {
            assert_eq!(before, seq, "`{wanted}` receipts disagree on the seq: {r}");
        }
    }
    out
}

fn count_with(receipts: &[Value], wanted: &str) -> usize {
    receipts
        .iter()
        .filter(|r| status(r) == wanted)
        .map(key_of)
        .collect::<HashSet<_>>()
        .len()
}

/// The statuses one delivery was reported in, in arrival order.
fn statuses_of(receipts: &[Value], msg_id: &str, device: &str) -> Vec<String> {
    receipts
        .iter()
        .filter(|r| r["msg_id"] == msg_id && r["device"] == device)
        .map(|r| status(r).to_string())
        .collect()
}

/// The backend: ferry's client library on the upstream Mosquitto, with every
/// receipt it heard kept in arrival order.
struct North {
    client: BackendClient,
    receipts: Vec<Value>,
}

impl North {
    /// Connects and waits until the gateway says it is online (its north
    /// subscriptions are acknowledged, so downlinks reach it).
    async fn connect(port: u16, gateway: &str, resend_after: Duration) -> North {
        let mut opts = BackendOptions::new("127.0.0.1", port, gateway);
        opts.resend_after = resend_after;
        let mut north = North {
            client: BackendClient::connect(opts),
            receipts: Vec::new(),
        };
        let deadline = Instant::now() + SECS_30;
        loop {
            match tokio::time::timeout(left(deadline), north.client.events.recv()).await {
                Ok(Some(BackendEvent::Status(s))) if s["online"] == true => return north,
                Ok(Some(BackendEvent::Receipt(r))) => north.receipts.push(r),
                Ok(Some(_)) => {}
                Ok(None) => panic!("the backend client stopped"),
                Err(_) => panic!("gateway {gateway} did not report online within 30 s"),
            }
        }
    }

    /// Sends the downlink `{"msg_id", "payload"}` to `to`.
    fn send(&self, to: &[&str], msg_id: &str, payload: Value) {
        self.client
            .send_down(to, json!({"msg_id": msg_id, "payload": payload}));
    }

    /// Collects receipts until `done(all so far)` holds; false on timeout.
    async fn until(&mut self, timeout: Duration, mut done: impl FnMut(&[Value]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while !done(&self.receipts) {
            match tokio::time::timeout(left(deadline), self.client.events.recv()).await {
                Ok(Some(BackendEvent::Receipt(r))) => self.receipts.push(r),
                Ok(Some(_)) => {}
                Ok(None) => panic!("the backend client stopped"),
                Err(_) => return false,
            }
        }
        true
    }

    /// Like `until`, but panics with what it has on timeout.
    async fn expect(&mut self, timeout: Duration, what: &str, done: impl FnMut(&[Value]) -> bool) {
        if !self.until(timeout, done).await {
            let tail = &self.receipts[self.receipts.len().saturating_sub(20)..];
            panic!(
                "no {what} within {timeout:?}; {} receipts, the last ones: {tail:#?}",
                self.receipts.len()
            );
        }
    }

    /// Collects whatever arrives within `window`.
    async fn settle(&mut self, window: Duration) {
        self.until(window, |_| false).await;
    }
}

// ---------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------

fn device_client(south_port: u16, id: &str) -> DeviceClient {
    let mut opts = DeviceOptions::new("127.0.0.1", south_port, id);
    opts.keep_alive = Duration::from_secs(5);
    DeviceClient::connect(opts)
}

/// Waits for `DeviceEvent::Connected`; nothing is queued for the device yet,
/// so no inbox event can be skipped.
async fn connected(device: &mut DeviceClient, id: &str) {
    let deadline = Instant::now() + SECS_30;
    loop {
        match tokio::time::timeout(left(deadline), device.events.recv()).await {
            Ok(Some(DeviceEvent::Connected)) => return,
            Ok(Some(_)) => {}
            Ok(None) => panic!("device client {id} stopped"),
            Err(_) => panic!("device {id} did not connect within 30 s"),
        }
    }
}

/// What a device client handed to its application.
#[derive(Default, Debug)]
struct Inbox {
    handed: Vec<InboxMessage>,
    duplicates: usize,
    connects: usize,
    disconnects: usize,
}

impl Inbox {
    fn seqs(&self) -> Vec<u64> {
        self.handed.iter().map(|m| m.seq).collect()
    }
}

/// Takes inbox events until `done` holds (false after `timeout`),
/// confirming every one that brought something new when `confirm` is set.
async fn inbox_until(
    device: &mut DeviceClient,
    timeout: Duration,
    confirm: bool,
    inbox: &mut Inbox,
    mut done: impl FnMut(&Inbox) -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    while !done(inbox) {
        match tokio::time::timeout(left(deadline), device.events.recv()).await {
            Ok(Some(DeviceEvent::Inbox {
                messages,
                duplicates,
                ..
            })) => {
                inbox.duplicates += duplicates;
                if let (true, Some(last)) = (confirm, messages.last()) {
                    device.confirm(last.seq);
                }
                inbox.handed.extend(messages);
            }
            Ok(Some(DeviceEvent::Connected)) => inbox.connects += 1,
            Ok(Some(DeviceEvent::Disconnected)) => inbox.disconnects += 1,
            Ok(Some(DeviceEvent::Receipt(_))) => {}
            Ok(None) => panic!("device client stopped"),
            Err(_) => return false,
        }
    }
    true
}

/// Like `inbox_until`, but panics with what it has on timeout.
async fn take_inbox(
    device: &mut DeviceClient,
    timeout: Duration,
    confirm: bool,
    inbox: &mut Inbox,
    done: impl FnMut(&Inbox) -> bool,
) {
    if !inbox_until(device, timeout, confirm, inbox, done).await {
        panic!("inbox not complete within {timeout:?}: {inbox:?}");
    }
}

/// A bare rumqttc client: re-subscribes `filters` after every ConnAck and
/// forwards incoming publishes. For devices that misbehave or whose raw
/// batches a test inspects, and for publishing malformed bytes.
struct Raw {
    client: AsyncClient,
    incoming: mpsc::UnboundedReceiver<Publish>,
    subacks: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl Raw {
    async fn connect(port: u16, client_id: &str, filters: Vec<String>) -> Raw {
        let mut options = MqttOptions::new(client_id, "127.0.0.1", port);
        options.set_max_packet_size(4 << 20, 4 << 20);
        options.set_keep_alive(Duration::from_secs(5));
        let (client, mut eventloop) = AsyncClient::new(options, 1024);
        let (tx, incoming) = mpsc::unbounded_channel();
        let (subacks_tx, mut subacks) = watch::channel(0u64);
        let (connacks_tx, mut connacks) = watch::channel(0u64);
        let resubscriber = client.clone();
        let wants_subscription = !filters.is_empty();
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        connacks_tx.send_modify(|n| *n += 1);
                        if !filters.is_empty() {
                            let topics: Vec<_> = filters
                                .iter()
                                .map(|f| SubscribeFilter::new(f.clone(), QoS::AtLeastOnce))
                                .collect();
                            // The request channel is drained by this loop.
                            let _ = resubscriber.try_subscribe_many(topics);
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => subacks_tx.send_modify(|n| *n += 1),
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(p);
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        let ready = if wants_subscription {
            matches!(
                tokio::time::timeout(SECS_20, subacks.wait_for(|n| *n >= 1)).await,
                Ok(Ok(_))
            )
        } else {
            matches!(
                tokio::time::timeout(SECS_20, connacks.wait_for(|n| *n >= 1)).await,
                Ok(Ok(_))
            )
        };
        assert!(
            ready,
            "client {client_id} not connected to 127.0.0.1:{port} within 20 s"
        );
        Raw {
            client,
            incoming,
            subacks,
            task,
        }
    }

    /// A device subscribed to its inbox only, confirming nothing by itself.
    async fn device(south_port: u16, id: &str) -> Raw {
        Raw::connect(south_port, id, vec![format!("devices/{id}/inbox")]).await
    }

    async fn publish(&self, topic: &str, bytes: impl Into<Vec<u8>>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, bytes.into())
            .await
            .expect("queue publish");
    }

    /// The next incoming publish as JSON; `None` after `timeout`.
    async fn next_json(&mut self, timeout: Duration) -> Option<Value> {
        let p = tokio::time::timeout(timeout, self.incoming.recv())
            .await
            .ok()
            .flatten()?;
        Some(serde_json::from_slice(&p.payload).unwrap_or_else(|e| {
            panic!(
                "not JSON on {} ({e}): {:?}",
                p.topic,
                String::from_utf8_lossy(&p.payload)
            )
        }))
    }

    fn subacks(&self) -> u64 {
        *self.subacks.borrow()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The seqs of a raw inbox batch, checked to be a non-empty, contiguous run.
fn batch_seqs(batch: &Value) -> Vec<u64> {
    let messages = batch["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("inbox batch without messages: {batch}"));
    let seqs: Vec<u64> = messages
        .iter()
        .map(|m| {
            m["seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("inbox entry without seq: {m}"))
        })
        .collect();
    assert!(!seqs.is_empty(), "an empty batch was pushed: {batch}");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "batch seqs not contiguous: {seqs:?}"
    );
    assert!(batch["more"].is_boolean(), "batch without `more`: {batch}");
    seqs
}

/// Connects and at once drops a client with `id`: the broker takes the
/// device's session over, so the device's real client is cut off and
/// reconnects.
async fn cut_off(south_port: u16, id: &str) {
    let mut options = MqttOptions::new(id, "127.0.0.1", south_port);
    options.set_keep_alive(Duration::from_secs(5));
    let (_client, mut eventloop) = AsyncClient::new(options, 16);
    let deadline = Instant::now() + SECS_20;
    loop {
        match tokio::time::timeout(left(deadline), eventloop.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => return,
            Ok(Ok(_)) => {}
            Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => panic!("intruder {id} got no ConnAck within 20 s"),
        }
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_downlinks_for_a_new_device_are_stored_then_sent_in_order_one_confirmed_batch_at_a_time(
) {
    const N: u64 = 1000;
    const DEVICE: &str = "panel-backlog";
    let mq = Mosquitto::start();
    let ferry = Ferry::start(opts_with(
        "gw-down-backlog",
        mq.port,
        &["[downlink]\nbatch_size = 200\nconfirm_timeout_ms = 10000"],
    ));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let mut sent: HashMap<String, u64> = HashMap::new();
    for i in 1..=N {
        let id = format!("bl-{boot}-{i:04}");
        north.send(&[DEVICE], &id, json!({"n": i}));
        sent.insert(id, i);
    }
    north
        .expect(SECS_60, "1000 `stored` receipts", |r| {
            count_with(r, "stored") == N as usize
        })
        .await;
    let stored = seqs_with(&north.receipts, "stored");
    let mut seq_to_id: HashMap<u64, String> = HashMap::new();
    for ((msg_id, device), seq) in &stored {
        assert_eq!(device, DEVICE, "`stored` receipt for another device");
        assert!(sent.contains_key(msg_id), "receipt for unknown {msg_id}");
        assert!(
            seq_to_id.insert(*seq, msg_id.clone()).is_none(),
            "seq {seq} assigned twice"
        );
    }
    assert_eq!(
        seq_to_id.keys().copied().collect::<BTreeSet<_>>(),
        (1..=N).collect::<BTreeSet<_>>(),
        "the device's seqs are 1..=1000"
    );
    assert_eq!(
        count_with(&north.receipts, "delivered"),
        0,
        "`delivered` before the device ever connected"
    );

    // A device that holds each confirm back and checks nothing else comes.
    let mut device = Raw::device(ferry.south_port, DEVICE).await;
    let mut next = 1u64;
    let mut batches = 0;
    while next <= N {
        let batch = device
            .next_json(SECS_30)
            .await
            .unwrap_or_else(|| panic!("no batch from seq {next} within 30 s"));
        let seqs = batch_seqs(&batch);
        batches += 1;
        assert!(
            seqs.len() <= 200,
            "batch of {} > batch_size 200",
            seqs.len()
        );
        assert_eq!(
            seqs[0],
            next,
            "batch {batches} starts at {} after a confirm up to {}",
            seqs[0],
            next - 1
        );
        for m in batch["messages"].as_array().expect("checked") {
            let seq = m["seq"].as_u64().expect("checked");
            let msg_id = m["msg_id"].as_str().unwrap_or("");
            assert_eq!(Some(msg_id), seq_to_id.get(&seq).map(String::as_str), "{m}");
            assert_eq!(m["payload"]["n"].as_u64(), sent.get(msg_id).copied(), "{m}");
            assert!(m["ts"].is_u64(), "inbox entry without ts: {m}");
        }
        let last = *seqs.last().expect("non-empty");
        assert_eq!(batch["more"], last < N, "`more` after seq {last} of {N}");
        if let Some(early) = device.next_json(Duration::from_millis(300)).await {
            panic!(
                "a batch arrived while the one up to {last} was unconfirmed: {}",
                batch_seqs(&early).first().copied().unwrap_or(0)
            );
        }
        device
            .publish(
                &format!("devices/{DEVICE}/confirm"),
                json!({ "upto": last }).to_string(),
            )
            .await;
        next = last + 1;
    }
    assert!(batches >= 5, "1000 messages in {batches} batches of ≤ 200");
    assert!(
        device.next_json(QUIET).await.is_none(),
        "a batch after everything was confirmed"
    );

    north
        .expect(SECS_30, "1000 `delivered` receipts", |r| {
            count_with(r, "delivered") == N as usize
        })
        .await;
    let delivered = seqs_with(&north.receipts, "delivered");
    for (k, seq) in &stored {
        assert_eq!(delivered.get(k), Some(seq), "`delivered` seq for {k:?}");
        let statuses = statuses_of(&north.receipts, &k.0, &k.1);
        let first_delivered = statuses.iter().position(|s| s == "delivered");
        assert!(
            statuses.iter().position(|s| s == "stored") < first_delivered,
            "{k:?}: receipts out of state order: {statuses:?}"
        );
    }
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = ?1",
            [DEVICE]
        ),
        N as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catch_up_cut_by_sigkill_resumes_after_restart_from_the_confirmed_cursor() {
    const N: u64 = 250;
    const BATCH: u64 = 50;
    const DEVICE: &str = "panel-crash";
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start(opts_with(
        "gw-down-crash",
        mq.port,
        &["[downlink]\nbatch_size = 50\nconfirm_timeout_ms = 10000"],
    ));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    for i in 1..=N {
        north.send(&[DEVICE], &format!("cr-{boot}-{i:04}"), json!(i));
    }
    north
        .expect(SECS_60, "250 `stored` receipts", |r| {
            count_with(r, "stored") == N as usize
        })
        .await;
    let confirm_topic = format!("devices/{DEVICE}/confirm");

    // Batches 1 and 2 confirmed, batch 3 received and left unconfirmed.
    let mut device = Raw::device(ferry.south_port, DEVICE).await;
    let mut received: Vec<u64> = Vec::new();
    for b in 1..=3u64 {
        let batch = device
            .next_json(SECS_30)
            .await
            .unwrap_or_else(|| panic!("no batch {b} within 30 s"));
        let seqs = batch_seqs(&batch);
        assert_eq!(
            (seqs[0], seqs.len() as u64),
            ((b - 1) * BATCH + 1, BATCH),
            "batch {b}"
        );
        received.extend(&seqs);
        if b < 3 {
            device
                .publish(&confirm_topic, json!({ "upto": b * BATCH }).to_string())
                .await;
        }
    }
    // Batch 3 is only read after the confirm of batch 2 was committed.
    let cursor = ferry.query_i64(
        "SELECT delivered_upto FROM devices WHERE device = ?1",
        [DEVICE],
    );
    assert_eq!(cursor, 2 * BATCH as i64, "confirmed cursor before the kill");
    let unconfirmed = (2 * BATCH + 1)..=(3 * BATCH);

    ferry.kill();
    ferry.restart();

    // The device reconnects by itself and confirms everything it gets.
    let mut after_restart: Vec<Vec<u64>> = Vec::new();
    while received.iter().max() < Some(&N) {
        let batch = device.next_json(SECS_30).await.unwrap_or_else(|| {
            panic!(
                "no batch after restart within 30 s (device resubscribed {} times, got {after_restart:?})",
                device.subacks()
            )
        });
        let seqs = batch_seqs(&batch);
        let last = *seqs.last().expect("non-empty");
        received.extend(&seqs);
        after_restart.push(seqs);
        device
            .publish(&confirm_topic, json!({ "upto": last }).to_string())
            .await;
    }
    assert_eq!(
        after_restart[0][0],
        2 * BATCH + 1,
        "the first batch after the restart starts right after the confirmed cursor"
    );
    let distinct: BTreeSet<u64> = received.iter().copied().collect();
    assert_eq!(
        distinct,
        (1..=N).collect::<BTreeSet<_>>(),
        "every seq arrived: no gap"
    );
    let mut seen = HashSet::new();
    for seq in &received {
        if !seen.insert(*seq) {
            assert!(
                unconfirmed.contains(seq),
                "seq {seq} arrived twice but was confirmed before the kill ({after_restart:?})"
            );
        }
    }
    eventually(SECS_20, "the cursor reaches 250", || {
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = ?1",
            [DEVICE],
        ) == N as i64
    })
    .await;
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM down_delivery", []),
        N as i64,
        "nothing queued twice"
    );
    assert!(
        device.next_json(QUIET).await.is_none(),
        "a batch after everything was confirmed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_reconnecting_without_confirming_gets_the_same_batch_and_its_client_drops_the_duplicates(
) {
    const DEVICE: &str = "panel-redo";
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-down-redo", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let ids: Vec<String> = (1..=5).map(|i| format!("rd-{boot}-{i}")).collect();
    for id in &ids {
        north.send(&[DEVICE], id, json!({"text": id}));
    }
    north
        .expect(SECS_30, "5 `stored` receipts", |r| {
            count_with(r, "stored") == 5
        })
        .await;

    let mut device = device_client(ferry.south_port, DEVICE);
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_30, false, &mut inbox, |i| {
        i.handed.len() >= 5
    })
    .await;
    // On connect the gateway may push the batch and answer the client's
    // pull with it too: let that settle first.
    inbox_until(&mut device, QUIET, false, &mut inbox, |_| false).await;
    assert_eq!(inbox.seqs(), vec![1, 2, 3, 4, 5]);

    // Cut the connection without having confirmed anything: the client
    // reconnects, the same batch comes again and nothing is handed twice.
    cut_off(ferry.south_port, DEVICE).await;
    let mut again = Inbox::default();
    take_inbox(&mut device, SECS_30, false, &mut again, |i| {
        i.disconnects >= 1 && i.connects >= 1 && i.duplicates >= 5
    })
    .await;
    inbox_until(&mut device, QUIET, false, &mut again, |_| false).await;
    assert!(
        again.handed.is_empty(),
        "the client handed messages again after the reconnect: {again:?}"
    );
    assert_eq!(
        again.duplicates % 5,
        0,
        "the same batch of 5, whole, each time it came: {again:?}"
    );
    let handed_ids: Vec<&str> = inbox.handed.iter().map(|m| m.msg_id.as_str()).collect();
    assert_eq!(
        handed_ids,
        ids.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert!(
        inbox
            .handed
            .iter()
            .all(|m| m.body.is_some() && m.status.is_none()),
        "{inbox:?}"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = ?1",
            [DEVICE]
        ),
        0,
        "nothing was confirmed"
    );

    device.confirm(5);
    north
        .expect(SECS_20, "5 `delivered` receipts", |r| {
            count_with(r, "delivered") == 5
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downlink_to_three_devices_is_delivered_to_each_on_its_own_cursor_the_offline_one_when_it_connects(
) {
    let (a, b, c) = ("dev-a", "dev-b", "dev-c");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-down-fan", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let mut dev_a = device_client(ferry.south_port, a);
    let mut dev_b = device_client(ferry.south_port, b);
    connected(&mut dev_a, a).await;
    connected(&mut dev_b, b).await;
    let (mut inbox_a, mut inbox_b, mut inbox_c) =
        (Inbox::default(), Inbox::default(), Inbox::default());

    // dev-a gets one message of its own first, so its seqs run ahead.
    let own = format!("fan-{boot}-own");
    north.send(&[a], &own, json!("for a only"));
    take_inbox(&mut dev_a, SECS_20, true, &mut inbox_a, |i| {
        !i.handed.is_empty()
    })
    .await;
    north
        .expect(SECS_20, "`delivered` for dev-a's own message", |r| {
            count_with(r, "delivered") == 1
        })
        .await;

    let shared = format!("fan-{boot}-all");
    north.send(&[a, b, c], &shared, json!("for all three"));
    take_inbox(&mut dev_a, SECS_20, true, &mut inbox_a, |i| {
        i.handed.len() >= 2
    })
    .await;
    take_inbox(&mut dev_b, SECS_20, true, &mut inbox_b, |i| {
        !i.handed.is_empty()
    })
    .await;
    north
        .expect(SECS_20, "`delivered` for dev-a and dev-b", |r| {
            let d = seqs_with(r, "delivered");
            d.contains_key(&key(&shared, a)) && d.contains_key(&key(&shared, b))
        })
        .await;
    north.settle(QUIET).await;
    let stored = seqs_with(&north.receipts, "stored");
    assert_eq!(stored.get(&key(&shared, a)), Some(&2), "dev-a's seq");
    assert_eq!(stored.get(&key(&shared, b)), Some(&1), "dev-b's seq");
    assert_eq!(stored.get(&key(&shared, c)), Some(&1), "dev-c's seq");
    assert!(
        statuses_of(&north.receipts, &shared, c) == ["stored"],
        "dev-c is offline: only `stored`, got {:?}",
        statuses_of(&north.receipts, &shared, c)
    );
    assert_eq!(inbox_a.seqs(), vec![1, 2]);
    assert_eq!(inbox_a.handed[1].msg_id, shared);
    assert_eq!(inbox_b.seqs(), vec![1]);
    assert_eq!(inbox_b.handed[0].msg_id, shared);

    let cursor =
        |d: &str| ferry.query_i64("SELECT delivered_upto FROM devices WHERE device = ?1", [d]);
    eventually(SECS_20, "dev-a's and dev-b's cursors move", || {
        cursor(a) == 2 && cursor(b) == 1
    })
    .await;
    assert_eq!(cursor(c), 0, "dev-c's cursor before it connected");
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_message WHERE msg_id = ?1",
            [&shared]
        ),
        1,
        "the shared message is stored once"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery d JOIN down_message m ON m.id = d.message_id \
             WHERE m.msg_id = ?1",
            [&shared]
        ),
        3,
        "one delivery per device"
    );

    let mut dev_c = device_client(ferry.south_port, c);
    take_inbox(&mut dev_c, SECS_20, true, &mut inbox_c, |i| {
        !i.handed.is_empty()
    })
    .await;
    assert_eq!(inbox_c.seqs(), vec![1]);
    assert_eq!(inbox_c.handed[0].msg_id, shared);
    assert_eq!(
        inbox_c.handed[0]
            .body
            .as_ref()
            .map(|b| b["payload"].clone()),
        Some(json!("for all three"))
    );
    north
        .expect(SECS_20, "`delivered` for dev-c", |r| {
            seqs_with(r, "delivered").get(&key(&shared, c)) == Some(&1)
        })
        .await;
    eventually(SECS_20, "dev-c's cursor moves", || cursor(c) == 1).await;
    assert_eq!((cursor(a), cursor(b)), (2, 1), "the others' cursors stay");
    north.settle(QUIET).await;
    assert_eq!(
        north
            .receipts
            .iter()
            .filter(|r| status(r) == "delivered" && r["msg_id"] == shared.as_str())
            .count(),
        3,
        "one `delivered` per device"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_cursors_send_read_receipts_and_a_nack_fails_the_delivery_into_the_dead_letters() {
    const DEVICE: &str = "panel-read";
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-down-read", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let mut device = device_client(ferry.south_port, DEVICE);
    connected(&mut device, DEVICE).await;
    let ids: Vec<String> = (1..=3).map(|i| format!("rn-{boot}-{i}")).collect();
    for id in &ids {
        north.send(&[DEVICE], id, json!({"screen": id}));
    }
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_20, false, &mut inbox, |i| {
        i.handed.len() >= 3
    })
    .await;
    assert_eq!(inbox.seqs(), vec![1, 2, 3]);

    device.confirm(2);
    device.nack(3, "no such screen");
    north
        .expect(SECS_20, "`delivered` ×2 and `failed`", |r| {
            count_with(r, "delivered") == 2 && count_with(r, "failed") == 1
        })
        .await;
    device.read(2);
    north
        .expect(SECS_20, "`read` ×2", |r| count_with(r, "read") == 2)
        .await;
    north.settle(QUIET).await;

    for id in &ids[..2] {
        assert_eq!(
            statuses_of(&north.receipts, id, DEVICE),
            ["stored", "delivered", "read"],
            "{id}"
        );
    }
    assert_eq!(
        statuses_of(&north.receipts, &ids[2], DEVICE),
        ["stored", "failed"],
        "{}",
        ids[2]
    );
    let failed = north
        .receipts
        .iter()
        .find(|r| status(r) == "failed")
        .expect("checked");
    assert_eq!(failed["seq"], 3, "{failed}");
    let reason = failed["reason"].as_str().unwrap_or("");
    assert!(
        reason.starts_with("nacked") && reason.contains("no such screen"),
        "`failed` reason: {failed}"
    );
    let read = seqs_with(&north.receipts, "read");
    assert_eq!(read.get(&key(&ids[0], DEVICE)), Some(&1));
    assert_eq!(read.get(&key(&ids[1], DEVICE)), Some(&2));

    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM dead_letter WHERE direction = 'down' AND device = ?1 \
             AND msg_id = ?2 AND reason LIKE 'nacked%'",
            [DEVICE, ids[2].as_str()]
        ),
        1,
        "a dead letter for the nacked delivery"
    );
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM dead_letter", []),
        1,
        "only the nacked delivery is a dead letter"
    );
    let state = |seq: i64| -> String {
        ferry
            .db()
            .query_row(
                "SELECT state FROM down_delivery WHERE device = ?1 AND seq = ?2",
                rusqlite::params![DEVICE, seq],
                |r| r.get(0),
            )
            .expect("delivery row")
    };
    assert_eq!(
        (state(1), state(2), state(3)),
        ("read".into(), "read".into(), "dead".into())
    );
    assert_eq!(
        ferry.query_i64("SELECT read_upto FROM devices WHERE device = ?1", [DEVICE]),
        2
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT delivered_upto FROM devices WHERE device = ?1",
            [DEVICE]
        ),
        3,
        "the nacked delivery counts as handled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_cap_the_oldest_deliveries_expire_as_tombstones_and_keep_their_content() {
    const DEVICE: &str = "panel-cap";
    let mq = Mosquitto::start();
    let ferry = Ferry::start(opts_with(
        "gw-down-cap",
        mq.port,
        &["[downlink]\nqueue_cap = 3"],
    ));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let ids: Vec<String> = (1..=5).map(|i| format!("cap-{boot}-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        north.send(&[DEVICE], id, json!({"order": i + 1}));
    }
    north
        .expect(SECS_30, "5 `stored` and 2 `expired`", |r| {
            count_with(r, "stored") == 5 && count_with(r, "expired") == 2
        })
        .await;
    north.settle(QUIET).await;
    let expired = seqs_with(&north.receipts, "expired");
    assert_eq!(
        expired,
        HashMap::from([(key(&ids[0], DEVICE), 1), (key(&ids[1], DEVICE), 2)]),
        "the two oldest expire"
    );
    for id in &ids[..2] {
        assert_eq!(
            ferry.query_i64(
                "SELECT count(*) FROM down_message WHERE msg_id = ?1 AND instr(body, ?2) > 0",
                [id.as_str(), "\"order\""]
            ),
            1,
            "{id}: its content is still stored"
        );
    }

    let mut device = device_client(ferry.south_port, DEVICE);
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_20, true, &mut inbox, |i| {
        i.handed.len() >= 5
    })
    .await;
    assert_eq!(inbox.seqs(), vec![1, 2, 3, 4, 5]);
    for (m, id) in inbox.handed.iter().zip(&ids).take(2) {
        assert_eq!(
            (m.msg_id.as_str(), m.status.as_deref(), m.body.is_none()),
            (id.as_str(), Some("expired"), true),
            "a tombstone: {m:?}"
        );
    }
    for (i, (m, id)) in inbox.handed.iter().zip(&ids).enumerate().skip(2) {
        assert_eq!(m.msg_id, *id);
        let payload = m.body.as_ref().map(|b| b["payload"].clone());
        assert_eq!(payload, Some(json!({"order": i + 1})), "{m:?}");
    }
    north
        .expect(SECS_20, "`delivered` ×3", |r| {
            count_with(r, "delivered") == 3
        })
        .await;
    north.settle(QUIET).await;
    let delivered = seqs_with(&north.receipts, "delivered");
    assert!(
        ids[..2]
            .iter()
            .all(|id| !delivered.contains_key(&key(id, DEVICE))),
        "an expired delivery reported `delivered`: {delivered:?}"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery WHERE device = ?1 AND state = 'expired'",
            [DEVICE]
        ),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downlink_whose_ttl_passes_while_its_device_is_offline_expires_and_keeps_its_content() {
    let (late, away) = ("panel-late", "panel-away");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-down-ttl", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let short = format!("ttl-{boot}-short");
    let keep = format!("ttl-{boot}-keep");
    north.client.send_down(
        &[late, away],
        json!({"msg_id": short, "payload": "gone soon", "ttl_s": 1}),
    );
    north.send(&[late], &keep, json!("no ttl"));
    north
        .expect(SECS_20, "3 `stored` receipts", |r| {
            count_with(r, "stored") == 3
        })
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // panel-late connects after the ttl: a tombstone, then the other message.
    let mut device = device_client(ferry.south_port, late);
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_20, true, &mut inbox, |i| {
        i.handed.len() >= 2
    })
    .await;
    assert_eq!(inbox.seqs(), vec![1, 2]);
    assert_eq!(
        (
            inbox.handed[0].msg_id.as_str(),
            inbox.handed[0].status.as_deref()
        ),
        (short.as_str(), Some("expired")),
        "{:?}",
        inbox.handed[0]
    );
    assert!(inbox.handed[0].body.is_none());
    assert_eq!(inbox.handed[1].msg_id, keep);

    // panel-away never connects: the periodic sweep expires its delivery.
    north
        .expect(
            SECS_20,
            "`expired` for both deliveries and `delivered`",
            |r| {
                let e = seqs_with(r, "expired");
                e.contains_key(&key(&short, late))
                    && e.contains_key(&key(&short, away))
                    && count_with(r, "delivered") == 1
            },
        )
        .await;
    north.settle(QUIET).await;
    assert_eq!(
        statuses_of(&north.receipts, &short, late),
        ["stored", "expired"]
    );
    assert_eq!(
        statuses_of(&north.receipts, &short, away),
        ["stored", "expired"]
    );
    assert_eq!(
        statuses_of(&north.receipts, &keep, late),
        ["stored", "delivered"]
    );
    let body: Vec<u8> = ferry
        .db()
        .query_row(
            "SELECT body FROM down_message WHERE msg_id = ?1",
            [&short],
            |r| r.get(0),
        )
        .expect("the expired message is still stored");
    let body: Value = serde_json::from_slice(&body).expect("stored body is JSON");
    assert_eq!(body["payload"], "gone soon", "{body}");
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery d JOIN down_message m ON m.id = d.message_id \
             WHERE m.msg_id = ?1 AND d.state = 'expired'",
            [&short]
        ),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downlinks_sent_across_an_upstream_broker_restart_are_all_queued_once_and_delivered() {
    const N: usize = 300;
    const DEVICE: &str = "panel-storm";
    let mut mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-down-bounce", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, Duration::from_secs(2)).await;
    let boot = boot_id();
    let mut device = device_client(ferry.south_port, DEVICE);
    connected(&mut device, DEVICE).await;
    let consumer = tokio::spawn(async move {
        let mut inbox = Inbox::default();
        take_inbox(&mut device, SECS_60, true, &mut inbox, |i| {
            i.handed.len() >= N
        })
        .await;
        // Anything handed twice would show up here.
        inbox_until(&mut device, QUIET, true, &mut inbox, |_| false).await;
        inbox
    });

    let ids: Vec<String> = (1..=N).map(|i| format!("st-{boot}-{i:04}")).collect();
    for (i, id) in ids.iter().enumerate() {
        if i == N / 3 {
            mq.stop();
        }
        if i == 2 * N / 3 {
            mq.restart();
        }
        north.send(&[DEVICE], id, json!({"i": i}));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let inbox = consumer.await.expect("device task");
    let handed: Vec<&str> = inbox.handed.iter().map(|m| m.msg_id.as_str()).collect();
    assert_eq!(
        handed.iter().collect::<HashSet<_>>().len(),
        handed.len(),
        "the device was handed a message twice"
    );
    assert_eq!(
        handed.iter().copied().collect::<HashSet<_>>(),
        ids.iter().map(String::as_str).collect::<HashSet<_>>(),
        "the device got every downlink"
    );
    assert_eq!(
        inbox.seqs(),
        (1..=N as u64).collect::<Vec<_>>(),
        "handed in seq order, contiguous"
    );

    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM down_delivery", []),
        N as i64,
        "each downlink queued once"
    );
    assert_eq!(
        ferry.query_i64("SELECT count(DISTINCT seq) FROM down_delivery", []),
        N as i64
    );
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM down_message", []),
        N as i64
    );
    eventually(
        SECS_20,
        "every delivery is `delivered` in the store",
        || {
            ferry.query_i64(
                "SELECT count(*) FROM down_delivery WHERE state = 'delivered'",
                [],
            ) == N as i64
        },
    )
    .await;
    // Each downlink was answered north (its `stored` may have been lost with
    // the broker; the resend is then answered with its current status).
    // `delivered` receipts are not counted: those of confirms made while
    // the broker was down are held and published when ferry is back, which
    // can be before the backend (clean session) has subscribed again, and
    // nothing ever repeats a `delivered`. Delivery is checked on the device
    // and in the store above.
    north
        .expect(SECS_30, "an answer for every downlink", |r| {
            r.iter()
                .filter(|r| matches!(status(r), "stored" | "delivered"))
                .map(key_of)
                .collect::<HashSet<_>>()
                .len()
                == N
        })
        .await;
    let answered: HashSet<Key> = north.receipts.iter().map(key_of).collect();
    assert!(
        ids.iter().all(|id| answered.contains(&key(id, DEVICE))),
        "a downlink without an answer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_downlinks_are_rejected_with_a_reason_and_dead_lettered() {
    const DEVICE: &str = "panel-m";
    let mq = Mosquitto::start();
    let ferry = Ferry::start(opts_with(
        "gw-down-bad",
        mq.port,
        &["[groups]\nline3 = [\"panel-m\"]"],
    ));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let raw = Raw::connect(
        mq.port,
        &format!("raw-backend-{}", std::process::id()),
        vec![],
    )
    .await;
    let boot = boot_id();
    let one = format!("ferry/{}/down/{DEVICE}", ferry.gateway);
    let many = format!("ferry/{}/down", ferry.gateway);
    let no_recipient = format!("bad-{boot}-norecipient");
    let unknown_group = format!("bad-{boot}-group");
    let bad_device = format!("bad-{boot}-device");
    let to_not_list = format!("bad-{boot}-to");
    let cases: Vec<(&str, String, Option<&str>, &str)> = vec![
        (
            one.as_str(),
            "{\"msg_id\": \"x\", ".to_string(),
            None,
            "JSON",
        ),
        (
            one.as_str(),
            json!({"payload": 1}).to_string(),
            None,
            "msg_id",
        ),
        (
            many.as_str(),
            json!({"msg_id": no_recipient, "payload": 1}).to_string(),
            Some(&no_recipient),
            "recipient",
        ),
        (
            many.as_str(),
            json!({"msg_id": unknown_group, "payload": 1, "to": ["@nope"]}).to_string(),
            Some(&unknown_group),
            "group",
        ),
        (
            many.as_str(),
            json!({"msg_id": bad_device, "payload": 1, "to": ["no spaces allowed"]}).to_string(),
            Some(&bad_device),
            "device id",
        ),
        (
            many.as_str(),
            json!({"msg_id": to_not_list, "payload": 1, "to": DEVICE}).to_string(),
            Some(&to_not_list),
            "array",
        ),
        (
            one.as_str(),
            json!({"msg_id": "has a space", "payload": 1}).to_string(),
            None,
            "msg_id",
        ),
    ];
    for (n, (topic, body, msg_id, hint)) in cases.iter().enumerate() {
        raw.publish(topic, body.as_bytes()).await;
        north
            .expect(SECS_20, &format!("`rejected` for {body}"), |r| {
                r.iter().filter(|r| status(r) == "rejected").count() > n
            })
            .await;
        let rejected = north
            .receipts
            .iter()
            .filter(|r| status(r) == "rejected")
            .nth(n)
            .expect("checked");
        let expected_id = msg_id.map(Value::from).unwrap_or(Value::Null);
        assert_eq!(rejected["msg_id"], expected_id, "{body} → {rejected}");
        let reason = rejected["reason"].as_str().unwrap_or("");
        assert!(
            reason.contains(hint),
            "the reason for {body} names the problem ({hint}): {rejected}"
        );
        assert_eq!(
            ferry.query_i64(
                "SELECT count(*) FROM dead_letter WHERE direction = 'down' AND raw = ?1 \
                 AND topic = ?2 AND length(reason) > 0",
                rusqlite::params![body.as_bytes(), topic]
            ),
            1,
            "a dead letter for {body}"
        );
    }
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM dead_letter WHERE msg_id = ?1",
            [&unknown_group]
        ),
        1,
        "the dead letter keeps a readable msg_id"
    );
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM down_message", []),
        0,
        "nothing malformed was queued"
    );

    // The gateway goes on: a well-formed downlink to the group is stored.
    let good = format!("ok-{boot}");
    raw.publish(
        &many,
        json!({"msg_id": good, "payload": "fine", "to": ["@line3"]}).to_string(),
    )
    .await;
    north
        .expect(SECS_20, "`stored` for the good downlink", |r| {
            seqs_with(r, "stored").get(&key(&good, DEVICE)) == Some(&1)
        })
        .await;
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM dead_letter", []),
        cases.len() as i64,
        "one dead letter per malformed downlink"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_downlink_is_answered_with_its_current_status_and_queued_only_for_new_devices() {
    let (a, b, c) = ("rep-a", "rep-b", "rep-c");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-down-repeat", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let mut dev_a = device_client(ferry.south_port, a);
    connected(&mut dev_a, a).await;
    let msg_id = format!("rep-{boot}");
    north.send(&[a, b], &msg_id, json!("twice"));
    let mut inbox = Inbox::default();
    take_inbox(&mut dev_a, SECS_20, true, &mut inbox, |i| {
        !i.handed.is_empty()
    })
    .await;
    north
        .expect(SECS_20, "`stored` ×2 and `delivered` for rep-a", |r| {
            count_with(r, "stored") == 2 && count_with(r, "delivered") == 1
        })
        .await;
    north.settle(QUIET).await;
    let before = north.receipts.len();

    // The backend sends it again, now naming a third device.
    north.send(&[a, b, c], &msg_id, json!("twice"));
    north
        .expect(SECS_20, "an answer for each of the three", |r| {
            r[before..].iter().map(key_of).collect::<HashSet<_>>().len() == 3
        })
        .await;
    north.settle(QUIET).await;
    let repeat: HashMap<Key, (String, u64)> = north.receipts[before..]
        .iter()
        .map(|r| {
            (
                key_of(r),
                (status(r).to_string(), r["seq"].as_u64().unwrap_or(0)),
            )
        })
        .collect();
    assert_eq!(
        repeat,
        HashMap::from([
            (key(&msg_id, a), ("delivered".to_string(), 1)),
            (key(&msg_id, b), ("stored".to_string(), 1)),
            (key(&msg_id, c), ("stored".to_string(), 1)),
        ]),
        "the repeat is answered with each delivery's current status and original seq"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery d JOIN down_message m ON m.id = d.message_id \
             WHERE m.msg_id = ?1",
            [&msg_id]
        ),
        3,
        "queued once per device"
    );
    assert_eq!(
        ferry.query_i64("SELECT max(down_seq) FROM devices", []),
        1,
        "no device got a second seq"
    );
    inbox_until(&mut dev_a, QUIET, true, &mut inbox, |_| false).await;
    assert_eq!(inbox.seqs(), vec![1], "rep-a got it once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_batch_is_sent_again_with_a_growing_timeout_while_the_device_is_online() {
    const DEVICE: &str = "panel-slow";
    let mq = Mosquitto::start();
    let ferry = Ferry::start(opts_with(
        "gw-down-resend",
        mq.port,
        &["[downlink]\nconfirm_timeout_ms = 300"],
    ));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    for i in 1..=3 {
        north.send(&[DEVICE], &format!("slow-{boot}-{i}"), json!(i));
    }
    north
        .expect(SECS_20, "3 `stored` receipts", |r| {
            count_with(r, "stored") == 3
        })
        .await;

    // A device that never confirms: the same batch, at growing intervals.
    let mut device = Raw::device(ferry.south_port, DEVICE).await;
    let mut arrivals = Vec::new();
    for n in 1..=3 {
        let batch = device
            .next_json(SECS_20)
            .await
            .unwrap_or_else(|| panic!("copy {n} of the batch did not come within 20 s"));
        assert_eq!(batch_seqs(&batch), vec![1, 2, 3], "copy {n}");
        arrivals.push(Instant::now());
    }
    let first_gap = arrivals[1] - arrivals[0];
    let second_gap = arrivals[2] - arrivals[1];
    assert!(
        first_gap >= Duration::from_millis(250),
        "resent after {first_gap:?} < confirm_timeout_ms 300"
    );
    assert!(
        second_gap >= Duration::from_millis(500),
        "second resend after {second_gap:?}: the timeout doubles to 600 ms"
    );

    // Offline by its own word: no more resends.
    device
        .publish(
            &format!("devices/{DEVICE}/status"),
            json!({"online": false}).to_string(),
        )
        .await;
    // A copy already on its way may still land.
    let _ = device.next_json(Duration::from_millis(200)).await;
    assert!(
        device
            .next_json(Duration::from_millis(2500))
            .await
            .is_none(),
        "a batch was resent to a device that said it is offline"
    );

    device
        .publish(
            &format!("devices/{DEVICE}/confirm"),
            json!({"upto": 3}).to_string(),
        )
        .await;
    north
        .expect(SECS_20, "3 `delivered` receipts", |r| {
            count_with(r, "delivered") == 3
        })
        .await;
    assert!(
        device.next_json(QUIET).await.is_none(),
        "a batch after everything was confirmed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_pending_north_survive_a_sigkill_and_all_reach_the_backend_after_restart() {
    const N: usize = 120;
    const DEVICE: &str = "panel-outbox";
    let mut mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new("gw-down-outbox", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let ids: Vec<String> = (1..=N).map(|i| format!("ob-{boot}-{i:04}")).collect();
    for id in &ids {
        north.send(&[DEVICE], id, json!(1));
    }
    north
        .expect(SECS_60, "`stored` receipts", |r| {
            count_with(r, "stored") == N
        })
        .await;

    // The upstream goes away; the device takes and confirms everything, so
    // every `delivered` receipt waits in ferry's outbox.
    mq.stop();
    let mut device = device_client(ferry.south_port, DEVICE);
    connected(&mut device, DEVICE).await;
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_60, true, &mut inbox, |i| {
        i.handed.len() >= N
    })
    .await;
    eventually(SECS_20, "every delivery `delivered` in the store", || {
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery WHERE state = 'delivered'",
            [],
        ) == N as i64
    })
    .await;
    let waiting = ferry.query_i64("SELECT count(*) FROM receipt_outbox", []);
    assert!(waiting >= N as i64, "{waiting} receipts in the outbox");

    // Killed with all of them unsent; the upstream returns, the backend
    // subscribes again, then ferry starts.
    ferry.kill();
    mq.restart();
    let deadline = Instant::now() + SECS_30;
    loop {
        match tokio::time::timeout(left(deadline), north.client.events.recv()).await {
            Ok(Some(BackendEvent::Connected)) => break,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the backend client stopped"),
            Err(_) => panic!("the backend did not reconnect within 30 s"),
        }
    }
    ferry.restart();
    north
        .expect(SECS_60, "a `delivered` receipt for every downlink", |r| {
            r.iter()
                .filter(|r| status(r) == "delivered")
                .map(key_of)
                .collect::<HashSet<_>>()
                .len()
                == N
        })
        .await;
    let delivered: HashSet<Key> = north
        .receipts
        .iter()
        .filter(|r| status(r) == "delivered")
        .map(key_of)
        .collect();
    assert!(ids.iter().all(|id| delivered.contains(&key(id, DEVICE))));
    eventually(SECS_20, "the outbox empties once acknowledged", || {
        ferry.query_i64("SELECT count(*) FROM receipt_outbox", []) == 0
    })
    .await;
    drop(device);
}
