//! Plain downlinks (`south.plain_down`): `mosquitto_sub`, which knows
//! nothing of inbox batches, subscribes to its command topic and gets the
//! backend's downlinks one by one, bare, in seq order; its PUBACK is its
//! `delivered`, which the backend hears as a receipt.

use std::time::Duration;

use ferry::client::backend::{BackendClient, BackendEvent};
use serde_json::{json, Value};

use super::runner::{tool, Running};
use super::{v, Gw};
use crate::support::receipts::eventually;

const SECS_10: Duration = Duration::from_secs(10);
const SECS_20: Duration = Duration::from_secs(20);

async fn plain_gateway(name: &str) -> Gw {
    Gw::start(name, |o| {
        o.with(|c| {
            c.south.plain_topics = vec!["plant/+/{device}/#".to_string()];
            c.south.plain_down = Some("plant/cmd/{device}".to_string());
        })
    })
    .await
}

/// Waits until `device` has `n` downlinks stored.
async fn stored(gw: &Gw, device: &str, n: i64) {
    eventually(SECS_10, "the downlinks are stored", || {
        gw.ferry.query_i64(
            "SELECT COUNT(*) FROM down_delivery WHERE device = ?1",
            [device],
        ) == n
    })
    .await;
}

/// The backend's receipts until every one of `ids` is `delivered`: the
/// seq of each, in the order of `ids`.
async fn delivered_seqs(backend: &mut BackendClient, ids: &[&str]) -> Vec<u64> {
    let deadline = tokio::time::Instant::now() + SECS_20;
    let mut seen: Vec<Value> = Vec::new();
    let seq_of = |seen: &[Value], id: &str| {
        seen.iter()
            .find(|r| r["status"] == "delivered" && r["msg_id"] == id)
            .and_then(|r| r["seq"].as_u64())
    };
    while ids.iter().any(|id| seq_of(&seen, id).is_none()) {
        match tokio::time::timeout_at(deadline, backend.events.recv()).await {
            Ok(Some(BackendEvent::Receipt(r))) => {
                seen.push(serde_json::to_value(&r).expect("a receipt is JSON"))
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("the backend client stopped"),
            Err(_) => panic!("no `delivered` for every one of {ids:?}: {seen:#?}"),
        }
    }
    ids.iter()
        .map(|id| seq_of(&seen, id).expect("seen"))
        .collect()
}

/// Two downlinks stored while the device is away (a text one and a JSON
/// one) reach `mosquitto_sub` on `plant/cmd/{device}` once it subscribes,
/// bare and in order; each PUBACK comes back north as `delivered`, seq 1
/// and 2; a third (bytes) sent while it is there follows at once.
async fn a_plain_downlink_reaches_mosquitto_sub_and_its_puback_is_delivered(level: &str) {
    let gw = plain_gateway("gw-plain-down").await;
    let device = format!("valve-{level}");
    let topic = format!("plant/cmd/{device}");
    let mut downlinks = gw.downlinks(&format!("plain-down-{level}"));
    let (a, b) = (format!("{}-a", gw.boot), format!("{}-b", gw.boot));
    downlinks.send_down(&[&device], json!({"msg_id": a, "payload": "OPEN"}));
    downlinks.send_down(&[&device], json!({"msg_id": b, "payload": {"rpm": 1200}}));
    stored(&gw, &device, 2).await;
    let port = gw.port().to_string();
    let mut sub = Running::start(
        "mosquitto_sub",
        &[
            "-V",
            v(level),
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-i",
            &device,
            "-q",
            "1",
            "-t",
            &topic,
            "-v",
            "-C",
            "3",
            "-W",
            "15",
        ],
    );
    let mut lines = sub.lines_until(SECS_20, |l| l.contains("rpm")).await;
    assert_eq!(
        delivered_seqs(&mut downlinks, &[&a, &b]).await,
        [1, 2],
        "each PUBACK is its `delivered`"
    );
    // And one sent while it is there goes at once.
    let c = format!("{}-c", gw.boot);
    downlinks.send_down(&[&device], json!({"msg_id": c, "payload_b64": "Q0xPU0U="}));
    lines.extend(sub.lines_until(SECS_20, |l| l.contains("CLOSE")).await);
    assert_eq!(
        lines,
        [
            format!("{topic} OPEN"),
            format!("{topic} {{\"rpm\":1200}}"),
            format!("{topic} CLOSE")
        ],
        "bare, in seq order"
    );
    assert_eq!(sub.close().await, Some(0), "mosquitto_sub got all three");
    assert_eq!(delivered_seqs(&mut downlinks, &[&c]).await, [3]);
}

at_levels!(a_plain_downlink_reaches_mosquitto_sub_and_its_puback_is_delivered:
    v31 => "31", v311 => "311", v5 => "5");

/// A device with a kept session (`mosquitto_sub -c -E` subscribes and
/// leaves) is sent nothing while away; a downlink stored then reaches it
/// once when it comes back with its session, and is `delivered` only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_downlink_waits_for_its_device_to_return_with_its_session() {
    let gw = plain_gateway("gw-plain-down-sess").await;
    let device = "valve-sess";
    let topic = format!("plant/cmd/{device}");
    let port = gw.port().to_string();
    let common = [
        "-V",
        "311",
        "-h",
        "127.0.0.1",
        "-p",
        &port,
        "-i",
        device,
        "-q",
        "1",
        "-c",
        "-t",
        &topic,
    ];
    let (status, out, err) = tool("mosquitto_sub", &[&common[..], &["-E"]].concat(), SECS_10).await;
    assert_eq!(status, Some(0), "mosquitto_sub -c -E: {out}{err}");
    let mut downlinks = gw.downlinks("plain-down-sess");
    let id = format!("{}-away", gw.boot);
    downlinks.send_down(&[device], json!({"msg_id": id, "payload": "CLOSE"}));
    stored(&gw, device, 1).await;
    let state = || {
        gw.ferry.query_i64(
            "SELECT COUNT(*) FROM down_delivery WHERE device = ?1 AND state = 'stored'",
            [device],
        )
    };
    assert_eq!(state(), 1, "not delivered while the device is away");
    let (status, out, err) = tool(
        "mosquitto_sub",
        &[&common[..], &["-v", "-C", "1", "-W", "15"]].concat(),
        SECS_20,
    )
    .await;
    assert_eq!(status, Some(0), "back with its session: {out}{err}");
    assert_eq!(out.trim_end(), format!("{topic} CLOSE"), "{err}");
    assert_eq!(delivered_seqs(&mut downlinks, &[&id]).await, [1]);
    assert_eq!(state(), 0, "delivered in the store");
}
