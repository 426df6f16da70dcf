//! Wills and sessions: Paho's `test_will_message`, `test_will_delay`,
//! `test_redelivery_on_reconnect`, `test_offline_message_queueing` and
//! `test_session_expiry`, on the device's own topics.

use std::time::Duration;

use serde_json::{json, Value};

use super::runner::{run, Case};
use super::{code, prop, Gw};
use crate::support::receipts::eventually;

const SECS_10: Duration = Duration::from_secs(10);

at_levels!(a_will_on_the_devices_own_topic_comes_when_it_drops_not_when_it_disconnects:
    v31 => "31", v311 => "311", v5 => "5");

/// test_will_message: a will on the device's own `up` is published when
/// its socket drops and not when it sends DISCONNECT (the DISCONNECT comes
/// first, so its will would be in the store first); one on its own
/// `status` is accepted; one on another device's topic refuses the
/// CONNECT (0x87, 3.1.x 5). The dropped connection's will was stored as
/// the device's: a resend of the same envelope is answered with its seq.
async fn a_will_on_the_devices_own_topic_comes_when_it_drops_not_when_it_disconnects(level: &str) {
    let mut gw = Gw::start("gw-conf-will", |o| o).await;
    let device = format!("will-{level}");
    let boot = gw.boot.clone();
    let r = run(
        "will",
        gw.port(),
        &device,
        level,
        &[("boot", &boot), ("other", "will-victim")],
    )
    .await;
    for k in ["disconnect_connack", "drop_connack", "status_connack"] {
        assert_eq!(code(&r[k]), 0, "{k}: {r}");
    }
    let refused = if level == "5" { 0x87 } else { 5 };
    assert_eq!(code(&r["foreign_connack"]), refused, "{r}");
    assert_eq!(r["foreign_closed"], true, "{r}");
    let dropped = format!("{boot}-drop");
    assert_eq!(
        r["drop_receipt"],
        json!({"msg_id": dropped, "status": "stored", "seq": 1}),
        "{r}"
    );
    let mut north = gw.north_ids(&device, SECS_10, |ids| !ids.is_empty()).await;
    // Anything more would come within this.
    for id in gw
        .north_ids(&device, Duration::from_millis(300), |_| false)
        .await
    {
        if !north.contains(&id) {
            north.push(id);
        }
    }
    assert_eq!(north, vec![dropped.clone()], "only the dropped one's will");
    assert_eq!(gw.stored(&device, &format!("{boot}-bye")), 0);
    assert_eq!(gw.stored(&device, &format!("{boot}-forged")), 0);
    assert_eq!(gw.stored("will-victim", &format!("{boot}-forged")), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_will_delay_past_the_session_expiry_is_cut_to_it() {
    let gw = Gw::start("gw-conf-will-delay", |o| o).await;
    let will = format!("{}-late", gw.boot);
    // Will delay 60 s, session expiry 0: the session ends with the
    // connection, and the will is published then.
    let r = run(
        "will_delay",
        gw.port(),
        "wd-a",
        "5",
        &[("will", &will), ("delay", "60"), ("expiry", "0")],
    )
    .await;
    assert_eq!(code(&r["connack"]), 0, "{r}");
    eventually(Duration::from_secs(5), "the will is stored at once", || {
        gw.stored("wd-a", &will) == 1
    })
    .await;
}

at_levels!(a_persistent_session_brings_back_what_was_not_acknowledged:
    v31 => "31", v311 => "311", v5 => "5");

/// test_redelivery_on_reconnect and test_offline_message_queueing: a
/// device with a session (3.1.x `clean_session = false`, 5 a session
/// expiry) subscribes once, does not acknowledge a receipt, and drops; a
/// downlink is stored while it is away. Reconnecting with its session it
/// is told session present (3.1 has no such flag), gets the receipt again
/// with DUP, and the downlink, on the subscriptions it kept; a new uplink's
/// receipt comes without a SUBSCRIBE. A clean session then ends it all.
async fn a_persistent_session_brings_back_what_was_not_acknowledged(level: &str) {
    let gw = Gw::start("gw-conf-sess", |o| o).await;
    let device = format!("sess-{level}");
    let boot = gw.boot.clone();
    let mut case = Case::start("redelivery", gw.port(), &device, level, &[("boot", &boot)]);
    case.wait_sync("away").await;
    let down = format!("{boot}-down");
    let downlinks = gw.downlinks("sess-downlinks");
    downlinks.send_down(&[&device], json!({"msg_id": down, "payload": "while away"}));
    eventually(SECS_10, "the downlink is stored", || {
        gw.ferry.query_i64(
            "SELECT COUNT(*) FROM down_delivery WHERE device = ?1",
            [device.as_str()],
        ) == 1
    })
    .await;
    case.resume();
    let r = case.finish().await;

    assert_eq!(r["first"]["session_present"], false, "{r}");
    assert_eq!(r["first_suback"], json!([1, 1]), "{r}");
    let first = format!("{boot}-1");
    assert_eq!(r["unacked"]["msg_id"], first.as_str(), "{r}");
    assert_eq!(code(&r["resumed"]), 0, "{r}");
    assert_eq!(
        r["resumed"]["session_present"],
        level != "31",
        "session present (MQTT 3.1 has no such flag): {r}"
    );
    let again: Vec<&Value> = r["redelivered"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["body"]["msg_id"] == first.as_str())
        .collect();
    assert_eq!(again.len(), 1, "the unacknowledged receipt once more: {r}");
    assert_eq!(again[0]["dup"], true, "marked DUP: {r}");
    assert_eq!(again[0]["body"]["status"], "stored", "{r}");
    let batch = r["redelivered"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["topic"] == format!("devices/{device}/inbox"))
        .unwrap_or_else(|| panic!("no inbox batch on the kept subscription: {r}"));
    assert_eq!(batch["body"]["messages"][0]["msg_id"], down.as_str(), "{r}");
    assert_eq!(r["kept_subscription"]["status"], "stored", "{r}");
    assert_eq!(r["clean"]["session_present"], false, "{r}");
    assert_eq!(r["after_clean"]["session_present"], false, "{r}");
    assert_eq!(
        r["after_clean_messages"],
        json!([]),
        "the clean session left no subscription behind: {r}"
    );
    assert_eq!(
        gw.stored(&device, &format!("{boot}-3")),
        1,
        "stored all the same"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lives_as_long_as_its_expiry_held_to_the_cap() {
    let gw = Gw::start("gw-conf-expiry", |o| {
        o.with(|c| c.south.max_session_expiry_s = 5)
    })
    .await;
    let r = run("session_expiry", gw.port(), "exp-a", "5", &[("cap", "5")]).await;
    let present = |k: &str| {
        r[k]["session_present"]
            .as_bool()
            .unwrap_or_else(|| panic!("{k}: {r}"))
    };
    for k in [
        "zero_first",
        "zero_again",
        "one_first",
        "one_at_once",
        "one_later",
        "over_cap",
        "after_disconnect_zero",
    ] {
        assert_eq!(code(&r[k]), 0, "{k}: {r}");
    }
    assert!(!present("zero_first"));
    assert!(!present("zero_again"), "expiry 0: gone at DISCONNECT: {r}");
    assert!(!present("one_first"));
    assert!(present("one_at_once"), "expiry 1 s: there at once: {r}");
    assert!(!present("one_later"), "expiry 1 s: gone after 1.6 s: {r}");
    assert_eq!(
        prop(&r["over_cap"], "SessionExpiryInterval"),
        5,
        "capped: {r}"
    );
    assert_eq!(
        prop(&r["one_first"], "SessionExpiryInterval"),
        &Value::Null,
        "{r}"
    );
    assert!(
        !present("after_disconnect_zero"),
        "DISCONNECT with expiry 0 ends it: {r}"
    );
}
