//! Plain devices (`south.plain_topics`) across connections: a bare MQTT
//! 3.1.1 client ([`RawMqtt`]) that keeps its session (clean session 0)
//! and, as MQTT asks, sends again with DUP under the same packet id every
//! QoS 1 publish it has no PUBACK for. Its PUBACK is its only receipt, so
//! what it was never acknowledged must be stored exactly once, whether the
//! first send was committed or not (docs/PROTOCOL.md, "Plain devices":
//! dedup, and withheld over a limit).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rumqttc::{Packet, Publish, QoS};
use serde_json::json;
use tokio::time::Instant;

use super::Gw;
use crate::support::{logged, Backend, NorthMessage, RawMqtt};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);

/// The plain filter of these tests: `plant/{line}/{device}/...`.
pub(super) const PLAIN: &str = "plant/+/{device}/#";

/// A QoS 1 publish of `{"i": i}` on `topic` under packet id `pkid`.
pub(super) fn plain_publish(topic: &str, pkid: u16, i: u64, dup: bool) -> Packet {
    let mut p = Publish::new(topic, QoS::AtLeastOnce, json!({ "i": i }).to_string());
    p.pkid = pkid;
    p.dup = dup;
    Packet::Publish(p)
}

/// Reads until the broker closes the connection, adding each PUBACK's
/// packet id to `acked`; whether it closed within `timeout`.
pub(super) async fn acks_until_closed(
    raw: &mut RawMqtt,
    acked: &mut BTreeSet<u16>,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match raw.try_recv(left).await {
            Ok(Some(Packet::PubAck(a))) => {
                acked.insert(a.pkid);
            }
            Ok(Some(_)) => {}
            // A timeout or the end of the socket: which one, by the clock.
            Ok(None) | Err(_) => return Instant::now() < deadline,
        }
    }
}

/// Reads PUBACKs into `acked` until `want` are all in it; false if the
/// connection closed or `timeout` passed first.
pub(super) async fn acks_until(
    raw: &mut RawMqtt,
    acked: &mut BTreeSet<u16>,
    want: &BTreeSet<u16>,
    timeout: Duration,
) -> bool {
    let deadline = Instant::now() + timeout;
    while !want.is_subset(acked) {
        let left = deadline.saturating_duration_since(Instant::now());
        match raw.try_recv(left).await {
            Ok(Some(Packet::PubAck(a))) => {
                acked.insert(a.pkid);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return false,
        }
    }
    true
}

/// The rows `device` has in the store.
fn rows(gw: &Gw, device: &str) -> i64 {
    gw.ferry
        .query_i64("SELECT COUNT(*) FROM uplink WHERE device = ?1", [device])
}

/// What the backend got from `device`, one entry per msg_id (ferry sends
/// again what is acked late): msg_id → (seq, the payload's `i`), until
/// there are `want` of them or `timeout` passes. Panics if two copies of a
/// msg_id disagree.
pub(super) async fn north_by_id(
    gw: &mut Gw,
    device: &str,
    want: usize,
    timeout: Duration,
) -> BTreeMap<String, (u64, u64)> {
    let of = |all: &[NorthMessage]| -> BTreeMap<String, (u64, u64)> {
        let mut got = BTreeMap::new();
        for m in all.iter().filter(|m| m.device() == device) {
            let seq = m.seq().unwrap_or_else(|| panic!("no seq: {}", m.body));
            let i = m.body["payload"]["i"]
                .as_u64()
                .unwrap_or_else(|| panic!("no payload.i: {}", m.body));
            if let Some(first) = got.insert(m.msg_id().to_string(), (seq, i)) {
                assert_eq!(first, (seq, i), "one msg_id, two messages: {}", m.body);
            }
        }
        got
    };
    let all = gw
        .backend
        .messages_until(timeout, |all| of(all).len() >= want)
        .await;
    of(&all)
}

/// A plain device cut off mid-stream: a first batch, one PUBACK read, a
/// second batch, then the client stops sending (FIN, as for a killed
/// process) and reads what the gateway acknowledged until it closes the
/// connection. Some of what it sent is then stored but unacknowledged.
/// It connects again with its kept session, sends again with DUP under
/// the same packet ids every publish without a PUBACK, then the ones it
/// never sent. Every payload reaches the backend under one msg_id, in the
/// order sent (seq 1, 2, ...), and is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_device_cut_off_mid_stream_resends_on_its_kept_session_and_each_is_stored_once() {
    const FIRST: u64 = 100;
    const CUT: u64 = 2100;
    const ALL: u64 = 2200;
    let gateway = "gw-plain-cut";
    let mut gw = Gw::start(gateway, |o| {
        o.with(|c| c.south.plain_topics = vec![PLAIN.to_string()])
    })
    .await;
    gw.backend = Backend::connect_auto_ack(gw.mq.port, gateway).await;
    let device = "press-1";
    let topic = "plant/line1/press-1/temp";
    let pkid = |i: u64| i as u16 + 1;

    let (mut raw, ack) = RawMqtt::connect_session(gw.port(), device, false).await;
    assert!(!ack.session_present, "a first connection has no session");
    raw.send_many((0..FIRST).map(|i| plain_publish(topic, pkid(i), i, false)))
        .await;
    let mut acked = BTreeSet::new();
    assert!(
        acks_until(&mut raw, &mut acked, &BTreeSet::from([1]), SECS_10).await,
        "no first PUBACK\n{}",
        gw.ferry.log_tail()
    );
    raw.send_many((FIRST..CUT).map(|i| plain_publish(topic, pkid(i), i, false)))
        .await;
    raw.shutdown_write().await.expect("half close");
    assert!(
        acks_until_closed(&mut raw, &mut acked, SECS_10).await,
        "the gateway did not end the connection after the client's FIN\n{}",
        gw.ferry.log_tail()
    );
    drop(raw);
    // Every PUBACK acknowledged a publish that is in the store.
    let mut stored = rows(&gw, device);
    let settle = Instant::now() + SECS_10;
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = rows(&gw, device);
        if now == stored || Instant::now() > settle {
            break;
        }
        stored = now;
    }
    let unacked: Vec<u64> = (0..CUT).filter(|i| !acked.contains(&pkid(*i))).collect();
    eprintln!(
        "cut: {} of {CUT} acknowledged, {stored} stored, {} to send again",
        acked.len(),
        unacked.len()
    );
    // Stored with its PUBACK outstanding: what the resend must not store
    // again. (The client's FIN comes right behind a batch the gateway is
    // still committing, so this is nearly all of the second batch.)
    assert!(
        stored > acked.len() as i64,
        "the cut left nothing stored unacknowledged: {} acked, {stored} stored",
        acked.len()
    );

    let (mut raw, ack) = RawMqtt::connect_session(gw.port(), device, false).await;
    assert!(ack.session_present, "the session was kept");
    raw.send_many(
        unacked
            .iter()
            .map(|i| plain_publish(topic, pkid(*i), *i, true)),
    )
    .await;
    raw.send_many((CUT..ALL).map(|i| plain_publish(topic, pkid(i), i, false)))
        .await;
    let want: BTreeSet<u16> = unacked.iter().copied().chain(CUT..ALL).map(pkid).collect();
    let mut acked_now = BTreeSet::new();
    assert!(
        acks_until(&mut raw, &mut acked_now, &want, SECS_30).await,
        "PUBACKs after the reconnect: {} of {}\n{}",
        acked_now.len(),
        want.len(),
        gw.ferry.log_tail()
    );

    let north = north_by_id(&mut gw, device, ALL as usize, SECS_30).await;
    let mut by_seq: Vec<(u64, u64, &str)> = north
        .iter()
        .map(|(id, (seq, i))| (*seq, *i, id.as_str()))
        .collect();
    by_seq.sort();
    let payloads: Vec<u64> = by_seq.iter().map(|(_, i, _)| *i).collect();
    let seqs: Vec<u64> = by_seq.iter().map(|(s, _, _)| *s).collect();
    // Each payload under exactly one msg_id, all of them, in the order sent.
    assert_eq!(
        payloads,
        (0..ALL).collect::<Vec<_>>(),
        "payloads north by seq ({} msg_ids)",
        north.len()
    );
    assert_eq!(seqs, (1..=ALL).collect::<Vec<_>>(), "seq north");
    assert!(by_seq.iter().all(|(_, _, id)| id.starts_with("p.")));
    assert_eq!(rows(&gw, device), ALL as i64, "rows stored for {device}");
    let log = gw.ferry.log();
    assert_eq!(logged(&log, "plain_publish_withheld", ""), 0, "{log}");
}

/// Over `south.rate_per_s` (2/s, burst 1) a plain device's second publish
/// gets no PUBACK and its connection is closed (counted, said once as
/// `plain_publish_withheld`). It connects again with its kept session and
/// sends it again with DUP under the same packet id, until it gets its
/// PUBACK (within the rate, a second or so): stored once, and north once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_publish_over_the_rate_is_withheld_and_its_dup_resend_stored_once() {
    let mut gw = Gw::start("gw-plain-rate", |o| {
        o.with(|c| {
            c.south.plain_topics = vec![PLAIN.to_string()];
            c.south.rate_per_s = 2.0;
            c.south.burst = 1;
        })
    })
    .await;
    let device = "press-2";
    let topic = "plant/line1/press-2/temp";
    let (mut raw, _) = RawMqtt::connect_session(gw.port(), device, false).await;
    raw.send(plain_publish(topic, 1, 1, false)).await;
    let mut acked = BTreeSet::new();
    assert!(
        acks_until(&mut raw, &mut acked, &BTreeSet::from([1]), SECS_10).await,
        "the first publish, within the burst, gets its PUBACK\n{}",
        gw.ferry.log_tail()
    );
    raw.send(plain_publish(topic, 2, 2, false)).await;
    assert!(
        acks_until_closed(&mut raw, &mut acked, SECS_10).await,
        "the connection of a device over its rate is closed\n{}",
        gw.ferry.log_tail()
    );
    assert!(!acked.contains(&2), "withheld, yet acknowledged");
    drop(raw);
    let withheld = gw
        .ferry
        .metrics()
        .value("ferry_plain_withheld_from_devices_total");
    assert!(withheld >= 1.0, "withheld counted: {withheld}");
    assert_eq!(
        logged(&gw.ferry.log(), "plain_publish_withheld", device),
        1,
        "{}",
        gw.ferry.log_tail()
    );

    // Again with DUP until acknowledged; a resend over the rate is
    // withheld like the first.
    let deadline = Instant::now() + SECS_10;
    let mut attempts = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "no PUBACK for the resend after {attempts} attempts\n{}",
            gw.ferry.log_tail()
        );
        attempts += 1;
        let (mut raw, ack) = RawMqtt::connect_session(gw.port(), device, false).await;
        assert!(ack.session_present, "the session was kept");
        raw.send(plain_publish(topic, 2, 2, true)).await;
        let mut acked = BTreeSet::new();
        if acks_until(
            &mut raw,
            &mut acked,
            &BTreeSet::from([2]),
            Duration::from_secs(3),
        )
        .await
        {
            eprintln!("rate: the resend taken at attempt {attempts}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let north = north_by_id(&mut gw, device, 2, SECS_30).await;
    let mut got: Vec<(u64, u64)> = north.values().copied().collect();
    got.sort();
    assert_eq!(got, vec![(1, 1), (2, 2)], "north (seq, i): {north:?}");
    for id in north.keys() {
        assert_eq!(gw.stored(device, id), 1, "{id} stored once");
    }
    assert_eq!(rows(&gw, device), 2, "rows stored for {device}");
    let after = gw
        .ferry
        .metrics()
        .value("ferry_plain_withheld_from_devices_total");
    assert_eq!(
        after,
        withheld + attempts as f64 - 1.0,
        "each resend over the rate withheld, the last taken"
    );
}
