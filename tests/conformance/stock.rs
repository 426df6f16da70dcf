//! The clients plants use, unchanged: Mosquitto's `mosquitto_rr`,
//! `mosquitto_sub` and `mosquitto_pub` with `-V 31`, `-V 311` and `-V 5`,
//! each as a device on its own topics.

use std::time::Duration;

use serde_json::{json, Value};

use super::runner::{tool, Running};
use super::{v, Gw};

const SECS_10: Duration = Duration::from_secs(10);

at_levels!(mosquitto_rr_gets_its_stored_receipt: v31 => "31", v311 => "311", v5 => "5");

/// `mosquitto_rr -t devices/X/up/t -e devices/X/ack -i X`: it subscribes to
/// its `ack`, publishes the envelope (in MQTT 5 with a response topic and
/// correlation data, which ferry accepts and does not act on) and prints
/// the `stored` receipt; the uplink is stored and sent north.
async fn mosquitto_rr_gets_its_stored_receipt(level: &str) {
    let mut gw = Gw::start("gw-conf-rr", |o| o).await;
    let device = format!("rr-{level}");
    let msg_id = format!("{}-rr", gw.boot);
    let port = gw.port().to_string();
    let envelope = json!({"msg_id": msg_id, "payload": {"t": 1}}).to_string();
    let (status, out, err) = tool(
        "mosquitto_rr",
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
            &format!("devices/{device}/up/t"),
            "-e",
            &format!("devices/{device}/ack"),
            "-m",
            &envelope,
            "-W",
            "5",
        ],
        SECS_10,
    )
    .await;
    assert_eq!(status, Some(0), "mosquitto_rr -V {level}: {out}{err}");
    let receipt: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        receipt,
        json!({"msg_id": msg_id, "status": "stored", "seq": 1})
    );
    let north = gw.north_ids(&device, SECS_10, |ids| !ids.is_empty()).await;
    assert_eq!(north, vec![msg_id]);
}

at_levels!(mosquitto_sub_gets_a_downlink_batch: v31 => "31", v311 => "311", v5 => "5");

/// `mosquitto_sub -t devices/X/inbox -i X`: a downlink the backend sends
/// comes as a batch.
async fn mosquitto_sub_gets_a_downlink_batch(level: &str) {
    let gw = Gw::start("gw-conf-sub-cli", |o| o).await;
    let device = format!("sub-{level}");
    let msg_id = format!("{}-down", gw.boot);
    let mut sub = Running::start(
        "mosquitto_sub",
        &[
            "-V",
            v(level),
            "-h",
            "127.0.0.1",
            "-p",
            &gw.port().to_string(),
            "-i",
            &device,
            "-q",
            "1",
            "-t",
            &format!("devices/{device}/inbox"),
            "-C",
            "1",
            "-W",
            "10",
        ],
    );
    // Stored whether the device is there yet or not: the batch comes once
    // its inbox subscription makes it ready.
    let downlinks = gw.downlinks("sub-cli-downlinks");
    downlinks.send_down(&[&device], json!({"msg_id": msg_id, "payload": "hello"}));
    let lines = sub.lines_until(SECS_10, |l| l.contains(&msg_id)).await;
    let batch: Value = lines
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no batch for mosquitto_sub -V {level}: {lines:?}"));
    assert_eq!(batch["messages"][0]["msg_id"], msg_id.as_str(), "{batch}");
    assert_eq!(batch["messages"][0]["payload"], "hello", "{batch}");
    assert_eq!(sub.close().await, Some(0));
}

at_levels!(mosquitto_pub_gets_its_stored_receipt: v31 => "31", v311 => "311", v5 => "5");

/// `mosquitto_pub` cannot subscribe, so it gets its receipt through a
/// kept session (`-c`): `mosquitto_sub -c -E` subscribes to the device's
/// `ack` once and leaves; `mosquitto_pub -c -l -d` resumes that session,
/// publishes the envelope and (its debug output says) receives a PUBLISH
/// on its `ack` of the size of its `stored` receipt; a resend of the same
/// envelope by `mosquitto_rr` is answered with that receipt, seq 1.
async fn mosquitto_pub_gets_its_stored_receipt(level: &str) {
    let gw = Gw::start("gw-conf-pub", |o| o).await;
    let device = format!("pub-{level}");
    let msg_id = format!("{}-pub", gw.boot);
    let port = gw.port().to_string();
    let ack = format!("devices/{device}/ack");
    let up = format!("devices/{device}/up/t");
    let common = [
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
        "-c",
    ];
    let (status, out, err) = tool(
        "mosquitto_sub",
        &[&common[..], &["-t", &ack, "-E"]].concat(),
        SECS_10,
    )
    .await;
    assert_eq!(status, Some(0), "mosquitto_sub -c -E: {out}{err}");

    let mut publisher = Running::start(
        "mosquitto_pub",
        &[&common[..], &["-t", &up, "-l", "-d"]].concat(),
    );
    let envelope = json!({"msg_id": msg_id, "payload": {"t": 1}}).to_string();
    publisher.send_line(&envelope);
    let on_ack = format!("'{ack}'");
    let lines = publisher
        .lines_until(SECS_10, |l| {
            l.contains("received PUBLISH") && l.contains(&on_ack)
        })
        .await;
    let got = lines
        .iter()
        .find(|l| l.contains("received PUBLISH") && l.contains(&on_ack))
        .unwrap_or_else(|| panic!("mosquitto_pub -V {level} got no receipt: {lines:#?}"))
        .clone();
    assert_eq!(publisher.close().await, Some(0));
    assert_eq!(gw.stored(&device, &msg_id), 1);

    // The same envelope again (a device resends until it has `stored`):
    // answered with its receipt, whose size is what mosquitto_pub got.
    let (status, out, err) = tool(
        "mosquitto_rr",
        &[
            &common[..6],
            &[
                "-i", &device, "-q", "1", "-t", &up, "-e", &ack, "-m", &envelope, "-W", "5",
            ],
        ]
        .concat(),
        SECS_10,
    )
    .await;
    assert_eq!(status, Some(0), "{out}{err}");
    let receipt = out.trim();
    assert_eq!(
        serde_json::from_str::<Value>(receipt).unwrap(),
        json!({"msg_id": msg_id, "status": "stored", "seq": 1})
    );
    assert!(
        got.ends_with(&format!("({} bytes))", receipt.len())),
        "mosquitto_pub's receipt is the `stored` one ({} bytes): {got}",
        receipt.len()
    );
    assert_eq!(gw.stored(&device, &msg_id), 1, "stored once");
}
