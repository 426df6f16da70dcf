//! A device that reconnects at once, under the same client id, is served
//! every time: the broker takes its old session over (or finds it gone),
//! answers CONNACK 0, and the new connection's subscriptions and receipts
//! work. Before, the old connection's late "gone" notice reached the router
//! after the new connection had taken its slot, and dropped the new one.

use std::time::Duration;

use rumqttc::{ConnectReturnCode, Packet, SubscribeReasonCode};
use serde_json::{json, Value};

use crate::support::access::{Access, AuthMode};
use crate::support::{boot_id, device_topics, Ferry, FerryOpts, Mosquitto, RawMqtt};

/// Rounds per variant.
const ROUNDS: usize = 50;

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
    let access = Access::new(mode);
    let mq = Mosquitto::start();
    let device = "rc-dev";
    let ferry = Ferry::start(access.opts(FerryOpts::new("gw-reconnect", mq.port), &[device]));
    let topics = device_topics(device);
    let boot = boot_id();
    for leave in [Leave::Disconnect, Leave::Drop, Leave::StayOpen] {
        let mut previous: Option<RawMqtt> = None;
        for round in 0..ROUNDS {
            let what = format!("{mode:?}, {leave:?}, round {round}");
            let (mut raw, ack) = access
                .try_connect(ferry.south_port, device, access.connect_packet(device))
                .await
                .unwrap_or_else(|e| {
                    panic!("{what}: {e}\n{}", ferry.log_tail());
                });
            assert_eq!(ack.code, ConnectReturnCode::Success, "{what}");
            if let Some(mut old) = previous.take() {
                assert!(
                    old.closed_within(Duration::from_secs(5)).await,
                    "{what}: the connection taken over is closed"
                );
            }
            let codes = raw.subscribe(&[topics.ack(), topics.inbox()]).await;
            assert!(
                codes
                    .iter()
                    .all(|c| !matches!(c, SubscribeReasonCode::Failure)),
                "{what}: {codes:?}"
            );
            let msg_id = format!("{boot}-{leave:?}-{round}");
            let status = raw.publish(&topics.status(), r#"{"online":true}"#);
            let up = raw.publish(
                &topics.up("t"),
                json!({"msg_id": msg_id, "payload": round}).to_string(),
            );
            raw.send_many([status, up]).await;
            let stored = stored_receipt(&mut raw, &msg_id).await;
            assert!(stored, "{what}: no stored receipt\n{}", ferry.log_tail());
            match leave {
                Leave::Disconnect => raw.send(Packet::Disconnect).await,
                Leave::Drop => {}
                Leave::StayOpen => previous = Some(raw),
            }
        }
    }
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'rc-dev'", []),
        3 * ROUNDS as i64,
        "every round's uplink stored once"
    );
}

/// Reads until the `stored` receipt for `msg_id` comes (true) or 10 s pass.
async fn stored_receipt(raw: &mut RawMqtt, msg_id: &str) -> bool {
    raw.read_publishes(Duration::from_secs(10), |p| {
        let r: Value = serde_json::from_slice(&p.payload).unwrap_or(Value::Null);
        r["msg_id"] == json!(msg_id) && r["status"] == "stored"
    })
    .await
}
