//! What only MQTT 5 has: Paho's `test_client_topic_alias`,
//! `test_flow_control1` and `test_maximum_packet_size` on the device's own
//! topics, and the broker's reserved `ferry-` user properties.

use serde_json::{json, Value};

use super::runner::run;
use super::{code, packets, prop, Gw};

/// The DISCONNECT reason a case's connection was closed with.
fn disconnect_reason(report: &Value) -> &Value {
    let d = packets(report, "DISCONNECT");
    assert_eq!(d.len(), 1, "one DISCONNECT from the broker: {report}");
    assert_eq!(report["closed"], true, "then closed: {report}");
    &d[0]["reason"]
}

/// test_client_topic_alias: aliases 1 and 32 set with a topic and then
/// used with an empty one reach their topics (stored with their streams);
/// alias 0 and 33 end the connection with DISCONNECT 0x94; an alias never
/// set, and one set on an earlier connection of a kept session, with 0x82.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_alias_reaches_its_topic_and_a_bad_one_ends_the_connection() {
    let gw = Gw::start("gw-conf-alias", |o| o).await;
    let boot = gw.boot.clone();
    let r = run("topic_alias", gw.port(), "alias-a", "5", &[("boot", &boot)]).await;
    assert_eq!(prop(&r["connack"], "TopicAliasMaximum"), 32, "{r}");
    for (i, receipt) in r["stored"].as_array().unwrap().iter().enumerate() {
        assert_eq!(receipt["status"], "stored", "a{}: {r}", i + 1);
    }
    assert_eq!(r["open"], true, "{r}");
    for (id, stream) in [
        ("a1", "aliased"),
        ("a2", "aliased"),
        ("a3", "top"),
        ("a4", "top"),
    ] {
        let got: String = gw
            .ferry
            .db()
            .query_row(
                "SELECT stream FROM uplink WHERE device = 'alias-a' AND msg_id = ?1",
                [format!("{boot}-{id}")],
                |row| row.get(0),
            )
            .unwrap_or_else(|e| panic!("{id} not stored: {e}"));
        assert_eq!(got, stream, "{id}");
    }
    assert_eq!(r["resumed"]["session_present"], true, "{r}");
    assert_eq!(
        disconnect_reason(&r["stale"]),
        0x82,
        "an alias of the last connection"
    );
    assert_eq!(disconnect_reason(&r["zero"]), 0x94, "alias 0");
    assert_eq!(disconnect_reason(&r["over"]), 0x94, "alias 33");
    assert_eq!(disconnect_reason(&r["unset"]), 0x82, "an alias never set");
    for id in ["stale", "zero", "over", "unset"] {
        assert_eq!(gw.stored("alias-a", &format!("{boot}-{id}")), 0, "{id}");
    }
}

/// test_flow_control1: a device with receive maximum 2 that acknowledges
/// nothing has 2 receipts in flight and no more; each PUBACK lets one more
/// come; all four uplinks are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_maximum_holds_the_receipts_in_flight() {
    let gw = Gw::start("gw-conf-flow", |o| o).await;
    let boot = gw.boot.clone();
    let r = run(
        "receive_maximum",
        gw.port(),
        "flow-a",
        "5",
        &[("boot", &boot)],
    )
    .await;
    assert_eq!(r["before_ack"], 2, "{r}");
    assert_eq!(r["after_one_ack"], 3, "{r}");
    assert_eq!(r["after_all_acks"], 4, "{r}");
    let ids: Vec<String> = (0..4).map(|i| format!("{boot}-f{i}")).collect();
    assert_eq!(r["stored"], json!(ids), "{r}");
}

/// test_maximum_packet_size: the CONNACK's maximum packet size is
/// `south.max_payload_bytes` + 1024; an uplink over the payload limit, and
/// one over the maximum packet size, are answered `rejected` (too large)
/// and the connection goes on; with the device's own maximum packet size
/// of 128, a receipt that fits comes, one that does not is left out (the
/// uplink is stored all the same) and the next comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maximum_packet_size_holds_both_ways() {
    let gw = Gw::start("gw-conf-size", |o| {
        o.with(|c| c.south.max_payload_bytes = 2048)
    })
    .await;
    let boot = gw.boot.clone();
    let r = run(
        "maximum_packet_size",
        gw.port(),
        "size-a",
        "5",
        &[
            ("boot", &boot),
            ("max_payload", "2048"),
            ("client_max", "128"),
        ],
    )
    .await;
    assert_eq!(prop(&r["connack"], "MaximumPacketSize"), 2048 + 1024, "{r}");
    for k in ["big", "huge"] {
        assert_eq!(r[k]["status"], "rejected", "{k}: {r}");
        assert!(
            r[k]["reason"].as_str().unwrap().starts_with("too_large"),
            "{k}: {r}"
        );
    }
    assert_eq!(r["big_open"], true, "{r}");
    assert_eq!(r["huge_report"]["closed"], false, "{r}");
    assert_eq!(code(&r["small_connack"]), 0, "{r}");
    assert_eq!(r["short_1"]["status"], "stored", "{r}");
    assert_eq!(r["short_2"]["status"], "stored", "{r}");
    assert_eq!(
        r["long_receipt"],
        Value::Null,
        "over the device's 128 bytes: {r}"
    );
    assert_eq!(r["open"], true, "{r}");
    let long_id = r["long_id"].as_str().unwrap();
    assert_eq!(
        gw.stored("size-a", long_id),
        1,
        "stored though its receipt was too large"
    );
    assert_eq!(r["acks"].as_array().unwrap().len(), 3, "{r}");
}

/// User properties named `ferry-...` are the broker's own marks: a device
/// claiming to be an oversized publish of another device's, on its topic,
/// is stored as its own small publish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_devices_ferry_properties_are_stripped() {
    let gw = Gw::start("gw-conf-marks", |o| o).await;
    let boot = gw.boot.clone();
    let r = run(
        "reserved_properties",
        gw.port(),
        "marks-a",
        "5",
        &[("boot", &boot), ("other", "marks-b")],
    )
    .await;
    assert_eq!(r["receipt"]["status"], "stored", "{r}");
    assert_eq!(gw.stored("marks-a", &format!("{boot}-marked")), 1);
    assert_eq!(
        gw.ferry
            .query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'marks-b'", []),
        0
    );
    assert_eq!(
        gw.ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []),
        0
    );
}
