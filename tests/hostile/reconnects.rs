//! A device that reconnects at once, under the same client id, is served
//! every time: the broker takes its old session over (or finds it gone),
//! answers CONNACK 0, and the new connection's subscriptions and receipts
//! work; with a kept session (`clean_session = false`) every reconnect
//! finds it, and no receipt comes again but as QoS 1 allows. Before, the old connection's late "gone" notice reached the router
//! after the new connection had taken its slot, and dropped the new one.

use std::collections::HashMap;
use std::time::Duration;

use rumqttc::{ConnectReturnCode, Packet, SubscribeReasonCode};
use serde_json::{json, Value};

use crate::support::access::{Access, AuthMode};
use crate::support::{boot_id, device_topics, Ferry, FerryOpts, Mosquitto, RawMqtt};

/// Rounds per variant.
const ROUNDS: usize = 50;

const SECS_10: Duration = Duration::from_secs(10);

/// How a round's connection ends.
#[derive(Clone, Copy, Debug)]
enum Leave {
    /// DISCONNECT, then the socket is closed.
    Disconnect,
    /// The socket is closed with no DISCONNECT (a device losing power).
    Drop,
    /// Nothing: the next connection takes the session over, and the old
    /// connection must be closed.
    StayOpen,
}

each_auth_mode!(a_device_reconnecting_at_once_is_served_every_time);

async fn a_device_reconnecting_at_once_is_served_every_time(mode: AuthMode) {
    reconnect_rounds(mode, "rc-dev", Session::Clean).await;
}

each_auth_mode!(a_device_reconnecting_at_once_with_a_kept_session_resumes_it_every_time);

/// As above with `clean_session = false`: every reconnect but the first
/// finds its session (CONNACK 0, session present), its subscriptions work
/// without a SUBSCRIBE, and each round's receipt comes once (and at most
/// once more, marked DUP, right after the reconnect; see below).
async fn a_device_reconnecting_at_once_with_a_kept_session_resumes_it_every_time(mode: AuthMode) {
    reconnect_rounds(mode, "rk-dev", Session::Kept).await;
}

/// What each CONNECT asks of the device's session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Session {
    /// `clean_session = true`: each connection subscribes anew.
    Clean,
    /// `clean_session = false`: only the first connection subscribes.
    Kept,
}

/// [`ROUNDS`] rounds of each way to leave: connect, (subscribe,) status
/// and an uplink whose `stored` receipt must come, then leave and connect
/// again at once.
async fn reconnect_rounds(mode: AuthMode, device: &str, session: Session) {
    let access = Access::new(mode);
    let mq = Mosquitto::start();
    let ferry = Ferry::start(access.opts(FerryOpts::new("gw-reconnect", mq.port), &[device]));
    let topics = device_topics(device);
    let boot = boot_id();
    // Every receipt read: its msg_id, DUP flag and the connection (a
    // count over all rounds) it came on.
    let mut receipts: Vec<(String, bool, usize)> = Vec::new();
    // The connection each round's receipt belongs to.
    let mut rounds: HashMap<String, usize> = HashMap::new();
    let mut connected_before = false;
    for leave in [Leave::Disconnect, Leave::Drop, Leave::StayOpen] {
        let mut previous: Option<RawMqtt> = None;
        for round in 0..ROUNDS {
            let what = format!("{mode:?}, {session:?}, {leave:?}, round {round}");
            let mut connect = access.connect_packet(device);
            connect.clean_session = session == Session::Clean;
            let (mut raw, ack) = access
                .try_connect(ferry.south_port, device, connect)
                .await
                .unwrap_or_else(|e| {
                    panic!("{what}: {e}\n{}", ferry.log_tail());
                });
            assert_eq!(ack.code, ConnectReturnCode::Success, "{what}");
            let resumed = session == Session::Kept && connected_before;
            assert_eq!(ack.session_present, resumed, "{what}: session present");
            connected_before = true;
            if let Some(mut old) = previous.take() {
                assert!(
                    old.closed_within(Duration::from_secs(5)).await,
                    "{what}: the connection taken over is closed"
                );
            }
            if !resumed {
                let codes = raw.subscribe(&[topics.ack(), topics.inbox()]).await;
                assert!(
                    codes
                        .iter()
                        .all(|c| !matches!(c, SubscribeReasonCode::Failure)),
                    "{what}: {codes:?}"
                );
            }
            let msg_id = format!("{boot}-{leave:?}-{round}");
            let status = raw.publish(&topics.status(), r#"{"online":true}"#);
            let up = raw.publish(
                &topics.up("t"),
                json!({"msg_id": msg_id, "payload": round}).to_string(),
            );
            raw.send_many([status, up]).await;
            let at = rounds.len();
            rounds.insert(msg_id.clone(), at);
            let stored = stored_receipt(&mut raw, &msg_id, SECS_10, at, &mut receipts).await;
            assert!(stored, "{what}: no stored receipt\n{}", ferry.log_tail());
            match leave {
                Leave::Disconnect => raw.send(Packet::Disconnect).await,
                Leave::Drop => {}
                Leave::StayOpen => previous = Some(raw),
            }
        }
    }
    if session == Session::Kept {
        // The last round's session too has nothing to send again.
        let mut connect = access.connect_packet(device);
        connect.clean_session = false;
        let mut raw = access.connect(ferry.south_port, device, connect).await;
        let at = rounds.len();
        stored_receipt(&mut raw, "", Duration::from_millis(500), at, &mut receipts).await;
    }
    // Each round's receipt came once on its own connection, not DUP. A
    // second copy may come, marked DUP, on the very next connection of a
    // kept session, and nowhere else: the broker saved the session before
    // it had read the device's PUBACK (in a debug log, always a new
    // CONNECT that reached the router before the old connection's last
    // packets, so taken as a takeover even after a DISCONNECT; up to a
    // quarter of the rounds without TLS). QoS 1 allows that; a copy later,
    // a third, or one not marked DUP is a bug.
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for (msg_id, dup, on) in &receipts {
        let Some(&round) = rounds.get(msg_id.as_str()) else {
            panic!("a receipt for no round: {msg_id}");
        };
        let n = copies.entry(msg_id).or_default();
        *n += 1;
        let first = *n == 1 && *on == round && !dup;
        let again = *n == 2 && session == Session::Kept && *on == round + 1 && *dup;
        assert!(
            first || again,
            "{msg_id} (round {round}): copy {n}, DUP {dup}, on connection {on}"
        );
    }
    assert_eq!(copies.len(), 3 * ROUNDS, "a receipt for every round");
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = ?1", [device]),
        3 * ROUNDS as i64,
        "every round's uplink stored once"
    );
}

/// Reads until the `stored` receipt for `msg_id` comes (true) or `timeout`
/// passes, noting every receipt read in `seen` (msg_id, DUP, connection
/// `on`).
async fn stored_receipt(
    raw: &mut RawMqtt,
    msg_id: &str,
    timeout: Duration,
    on: usize,
    seen: &mut Vec<(String, bool, usize)>,
) -> bool {
    raw.read_publishes(timeout, |p| {
        let r: Value = serde_json::from_slice(&p.payload).unwrap_or(Value::Null);
        seen.push((r["msg_id"].as_str().unwrap_or("").to_string(), p.dup, on));
        r["msg_id"] == json!(msg_id) && r["status"] == "stored"
    })
    .await
}
