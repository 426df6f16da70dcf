//! The downlink path end to end: a backend on a real Mosquitto upstream, the
//! real `ferry` binary, and devices on ferry's south broker.
//!
//! Each test starts its own Mosquitto and ferry on free ports and checks one
//! behaviour of docs/PROTOCOL.md ("Downlink batches", and the downlink half
//! of "North") from the outside: receipts on `ferry/{gateway}/receipts`,
//! batches on `devices/{id}/inbox`, and rows in the store. Well-behaved
//! devices and the backend use ferry's client library; where a test needs
//! to see raw batches or to misbehave, it uses a bare MQTT client
//! (`support::BareClient`).
//!
//! Helpers are here; the tests are in one file per theme.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions, InboxMessage};
use serde_json::{json, Value};

use crate::support::receipts::{eventually, status};
use crate::support::{
    boot_id, cut_off, device_topics, north_topics, BareClient, Ferry, FerryOpts, Mode, Mosquitto,
};
use ferry::ids::DeviceId;

mod batches;
mod cursors;
mod expiry;
mod fan_out;
mod north;
mod versions;

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

// ---------------------------------------------------------------------------
// Receipts north
// ---------------------------------------------------------------------------

/// A typed message as the JSON it was on the wire, for assertions on its
/// fields by name.
fn as_json(m: &impl serde::Serialize) -> Value {
    serde_json::to_value(m).expect("a wire type serializes")
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
                Ok(Some(BackendEvent::Status(s))) if s.online => return north,
                Ok(Some(BackendEvent::Receipt(r))) => north.receipts.push(as_json(&r)),
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
                Ok(Some(BackendEvent::Receipt(r))) => self.receipts.push(as_json(&r)),
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
            Ok(Some(DeviceEvent::Receipt(_) | DeviceEvent::ConnectionFailed(_))) => {}
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
