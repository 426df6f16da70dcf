//! A device's PUBACK (PUBREC) means "committed" (issue 32,
//! docs/PROTOCOL.md "Acknowledgement"): the embedded broker hands every
//! publish from its connection straight to intake, and the connection
//! acknowledges it only once intake answered for it — its commit, or its
//! refusal — in the order the publishes came. Seen by a bare MQTT 3.1.1
//! client, as a plain device that never reads a receipt sees it.

use rumqttc::{Packet, PubRel, QoS};

use super::*;
use crate::support::RawMqtt;
#[cfg(feature = "system-tests")]
use crate::support::Tmpfs;

fn envelope(msg_id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"msg_id": msg_id, "payload": {"t": 1}})).unwrap()
}

/// The msg_ids of `device`'s uplinks in the store, in seq order.
fn msg_ids(ferry: &Ferry, device: &str) -> Vec<String> {
    let db = ferry.db();
    let mut q = db
        .prepare("SELECT msg_id FROM uplink WHERE device = ?1 ORDER BY seq")
        .unwrap();
    let ids = q.query_map([device], |r| r.get(0)).unwrap();
    ids.collect::<Result<_, _>>().unwrap()
}

/// What comes within `timeout`: PUBACK/PUBREC/PUBCOMP packet ids, tagged,
/// and receipts as (msg_id, status), in arrival order.
async fn gather(raw: &mut RawMqtt, timeout: Duration) -> (Vec<String>, Vec<(String, String)>) {
    let deadline = tokio::time::Instant::now() + timeout;
    let (mut acks, mut receipts) = (Vec::new(), Vec::new());
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Some(packet) = raw.recv(left).await else {
            return (acks, receipts);
        };
        match packet {
            Packet::PubAck(a) => acks.push(format!("puback {}", a.pkid)),
            Packet::PubRec(r) => acks.push(format!("pubrec {}", r.pkid)),
            Packet::PubComp(c) => acks.push(format!("pubcomp {}", c.pkid)),
            Packet::Publish(p) => {
                let v: Value = serde_json::from_slice(&p.payload).expect("a receipt is JSON");
                let id = v["msg_id"].as_str().unwrap_or("").to_string();
                receipts.push((id, v["status"].as_str().unwrap_or("").to_string()));
            }
            _ => {}
        }
    }
}

/// The must-show of issue 32: the data directory's disk is full, so
/// nothing can be committed. A QoS 1 publish gets no PUBACK and no
/// `stored` while it is full; once space returns, both come, and the
/// message is in the store once. The disk is a tmpfs mounted as root:
/// the `system-tests` feature's.
#[cfg(feature = "system-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_puback_waits_for_the_commit_while_the_disk_is_full() {
    let disk = Tmpfs::mount(16);
    let data_dir = disk.path.join("data");
    let mq = Mosquitto::start();
    let opts = FerryOpts::new("gw-acked", mq.port).with(move |c| c.gateway.data_dir = data_dir);
    let ferry = Ferry::start(opts);
    let mut raw = RawMqtt::connect(ferry.south_port, "full-1", 30).await;
    raw.subscribe(&["devices/full-1/ack".to_string()]).await;

    let first = raw.publish("devices/full-1/up/t", envelope("m-1"));
    raw.send(first).await;
    let (acks, receipts) = gather(&mut raw, Duration::from_secs(3)).await;
    assert_eq!(acks, ["puback 2"], "acknowledged once committed");
    assert_eq!(receipts, [("m-1".to_string(), "stored".to_string())]);

    let ballast = tokio::task::block_in_place(|| disk.fill());
    let held = raw.publish("devices/full-1/up/t", envelope("m-2"));
    raw.send(held).await;
    let (acks, receipts) = gather(&mut raw, Duration::from_secs(3)).await;
    assert!(
        acks.is_empty() && receipts.is_empty(),
        "nothing may be acknowledged while the disk is full: {acks:?} {receipts:?}"
    );

    std::fs::remove_file(ballast).expect("free the disk");
    let (acks, receipts) = gather(&mut raw, Duration::from_secs(15)).await;
    assert_eq!(acks, ["puback 3"], "acknowledged once space returned");
    assert_eq!(receipts, [("m-2".to_string(), "stored".to_string())]);
    assert_eq!(msg_ids(&ferry, "full-1"), ["m-1", "m-2"]);
}

/// PUBACKs come in the order the publishes came, whatever intake made of
/// each: a malformed envelope (refused, dead-lettered), a publish outside
/// the device's topics (refused, `unauthorized`), a good uplink, a QoS 2
/// uplink (PUBREC, then PUBCOMP for its PUBREL), and a control message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publish_is_acknowledged_in_order_once_answered() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-acked-order", mq.port));
    let mut raw = RawMqtt::connect(ferry.south_port, "ord-1", 30).await;
    raw.subscribe(&["devices/ord-1/ack".to_string()]).await;

    let malformed = raw.publish("devices/ord-1/up/t", b"{not json".to_vec());
    let elsewhere = raw.publish("devices/ord-2/up/t", envelope("m-x"));
    let good = raw.publish("devices/ord-1/up/t", envelope("m-1"));
    let mut exactly_once =
        rumqttc::Publish::new("devices/ord-1/up/t", QoS::ExactlyOnce, envelope("m-2"));
    exactly_once.pkid = raw.next_pkid();
    let confirm = raw.publish("devices/ord-1/confirm", r#"{"upto":0}"#);
    raw.send_many([
        malformed,
        elsewhere,
        good,
        Packet::Publish(exactly_once),
        confirm,
    ])
    .await;
    let (acks, receipts) = gather(&mut raw, Duration::from_secs(3)).await;
    // The SUBSCRIBE had packet id 1.
    assert_eq!(
        acks,
        ["puback 2", "puback 3", "puback 4", "pubrec 5", "puback 6"],
        "in publish order"
    );
    let statuses: HashMap<_, _> = receipts.into_iter().collect();
    assert_eq!(statuses.get("m-1").map(String::as_str), Some("stored"));
    assert_eq!(statuses.get("m-2").map(String::as_str), Some("stored"));
    assert_eq!(statuses.get("m-x").map(String::as_str), Some("rejected"));

    raw.send(Packet::PubRel(PubRel::new(5))).await;
    let (acks, _) = gather(&mut raw, Duration::from_secs(2)).await;
    assert_eq!(acks, ["pubcomp 5"]);
    // The QoS 2 publish sent again before its PUBREL (as after a lost
    // PUBREC) is stored once, and answered again.
    let mut again = rumqttc::Publish::new("devices/ord-1/up/t", QoS::ExactlyOnce, envelope("m-2"));
    again.pkid = 5;
    again.dup = true;
    raw.send(Packet::Publish(again)).await;
    let (acks, receipts) = gather(&mut raw, Duration::from_secs(3)).await;
    assert_eq!(acks, ["pubrec 5"]);
    assert_eq!(receipts.len(), 1, "{receipts:?}");
    assert_eq!(msg_ids(&ferry, "ord-1"), ["m-1", "m-2"]);
}

/// One device that reads its receipts but never acknowledges them cannot
/// grow what waits for it without bound: once its queue of unread
/// deliveries is full (`DEVICE_QUEUE` beyond those in flight), its own
/// publishes are held, neither acknowledged nor stored; once it
/// acknowledges what it got, they go on, and every one is stored once.
/// The device keeps at most 100 publishes without a PUBACK, as MQTT
/// clients do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_never_acknowledges_its_receipts_is_held_until_it_does() {
    const N: usize = 4000;
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-acked-behind", mq.port));
    let mut raw = RawMqtt::connect(ferry.south_port, "slow-1", 60).await;
    raw.subscribe(&["devices/slow-1/ack".to_string()]).await;
    let mut device = Windowed::default();

    // Read everything, acknowledge no receipt, until nothing more comes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        device.top_up(&mut raw, N).await;
        match raw.recv(Duration::from_secs(3)).await {
            None => break,
            Some(packet) => device.read(packet),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the device was never held"
        );
    }
    let (pubacks, stored) = (device.pubacks, msg_ids(&ferry, "slow-1").len());
    assert!(
        pubacks < N && stored < N,
        "held while its deliveries are unread: {pubacks} PUBACKs, {stored} stored of {N}"
    );
    assert_eq!(
        pubacks, stored,
        "a PUBACK for every committed uplink, none other"
    );
    assert!(
        stored > ferry::south::embedded::DEVICE_QUEUE,
        "held only past its queue: {stored} stored"
    );

    // It acknowledges what it got (and what comes): the rest goes on.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while device.pubacks < N || device.receipts < N {
        for pkid in device.unacked.drain(..) {
            raw.send(Packet::PubAck(rumqttc::PubAck::new(pkid))).await;
        }
        device.top_up(&mut raw, N).await;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Some(packet) = raw.recv(left.min(Duration::from_secs(10))).await else {
            panic!(
                "stuck once the device read: {} PUBACKs, {} `stored` of {N}",
                device.pubacks, device.receipts
            );
        };
        device.read(packet);
    }
    assert_eq!(
        msg_ids(&ferry, "slow-1").len(),
        N,
        "every uplink stored once"
    );
}

/// A device that keeps at most [`Windowed::WINDOW`] publishes without a
/// PUBACK, and what it has seen.
#[derive(Default)]
struct Windowed {
    sent: usize,
    pubacks: usize,
    /// Receipts read (`stored` ones: no backend acks here).
    receipts: usize,
    /// Packet ids of the receipts it has not acknowledged.
    unacked: Vec<u16>,
}

impl Windowed {
    const WINDOW: usize = 100;

    /// Publishes uplinks `m-{sent}`, ... while its window has room, `n` in all.
    async fn top_up(&mut self, raw: &mut RawMqtt, n: usize) {
        let more = (n - self.sent).min(Self::WINDOW - (self.sent - self.pubacks));
        let publishes: Vec<_> = (self.sent..self.sent + more)
            .map(|i| raw.publish("devices/slow-1/up/t", envelope(&format!("m-{i}"))))
            .collect();
        raw.send_many(publishes).await;
        self.sent += more;
    }

    fn read(&mut self, packet: Packet) {
        match packet {
            Packet::PubAck(_) => self.pubacks += 1,
            Packet::Publish(p) => {
                self.unacked.push(p.pkid);
                self.receipts += 1;
            }
            _ => {}
        }
    }
}
