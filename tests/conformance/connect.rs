//! CONNECT, CONNACK and keep-alive at every level: Paho's `test_basic`,
//! `test_keepalive` and `test_server_keep_alive`, the v5 CONNACK's
//! properties and codes, and a protocol level ferry does not speak.

use std::time::Duration;

use serde_json::Value;

use super::runner::run;
use super::{code, packets, prop, receipts, Gw};

const SECS_10: Duration = Duration::from_secs(10);

at_levels!(basic_exchange: v31 => "31", v311 => "311", v5 => "5");

/// test_basic: connect, disconnect, connect again with keep-alive 0;
/// subscribe to the own ack at QoS 2 (granted 1); publish at QoS 0, 1 and
/// 2: each stored once, answered `stored` with its own seq, and sent north
/// as the device's.
async fn basic_exchange(level: &str) {
    let mut gw = Gw::start("gw-conf-basic", |o| o).await;
    let device = format!("basic-{level}");
    let boot = gw.boot.clone();
    // The second connection asks for no keep-alive (valid at every level):
    // it is taken, and held to `south.max_keep_alive_s` (600 by default).
    let r = run(
        "basic",
        gw.port(),
        &device,
        level,
        &[("boot", &boot), ("keepalive", "0")],
    )
    .await;
    assert_eq!(code(&r["first_connack"][0]), 0, "{r}");
    assert_eq!(code(&r["connacks"][0]), 0, "{r}");
    if level == "5" {
        assert_eq!(prop(&r["connacks"][0], "ServerKeepAlive"), 600, "{r}");
    }
    assert_eq!(r["connacks"][0]["session_present"], false, "{r}");
    assert_eq!(
        r["subacks"][0],
        serde_json::json!([1]),
        "QoS 2 granted 1: {r}"
    );
    let ids: Vec<String> = serde_json::from_value(r["ids"].clone()).unwrap();
    let got = receipts(&r["messages"]);
    let mut seqs = Vec::new();
    for id in &ids {
        let receipt = got
            .iter()
            .find(|x| x["msg_id"] == id.as_str())
            .unwrap_or_else(|| panic!("no receipt for {id}: {r}"));
        assert_eq!(receipt["status"], "stored", "{receipt}");
        seqs.push(receipt["seq"].as_u64().expect("a seq"));
        assert_eq!(gw.stored(&device, id), 1, "{id} stored once");
    }
    seqs.sort();
    assert_eq!(seqs, vec![1, 2, 3], "one seq each: {r}");
    assert!(
        got.iter().all(|x| x["status"] == "stored"),
        "nothing but the three receipts: {r}"
    );
    assert!(
        packets(&r, "PUBACK").iter().all(|p| p["reason"] == 0),
        "{r}"
    );
    assert_eq!(packets(&r, "PUBREC").len(), 1, "{r}");
    assert_eq!(packets(&r, "PUBCOMP").len(), 1, "{r}");
    let north = gw.north_ids(&device, SECS_10, |ids| ids.len() >= 3).await;
    let mut north_sorted = north.clone();
    north_sorted.sort();
    assert_eq!(north_sorted, ids, "all three north as {device}: {north:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_protocol_level_gets_connack_1_and_is_closed() {
    let gw = Gw::start("gw-conf-levels", |o| o).await;
    let r = run("protocol_levels", gw.port(), "lvl-a", "5", &[]).await;
    assert_eq!(
        r["level6"],
        serde_json::json!({"reply": "20020001", "closed": true}),
        "CONNACK 1 (unacceptable protocol version), then closed: {r}"
    );
    assert_eq!(r["bad_name"]["closed"], true, "{r}");
    assert!(
        !r["bad_name"]["reply"]
            .as_str()
            .unwrap()
            .starts_with("20020000"),
        "no CONNACK 0 for protocol name \"hj\": {r}"
    );
    // MQIsdp level 3 and MQTT level 4: CONNACK 0, session present 0.
    assert_eq!(r["level3"]["reply"], "20020000", "{r}");
    assert_eq!(r["level4"]["reply"], "20020000", "{r}");
    // Level 5: a v5 CONNACK (session present 0, reason 0, properties).
    let v5 = r["level5"]["reply"].as_str().unwrap();
    assert!(v5.starts_with("20") && &v5[4..8] == "0000", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_v5_connack_says_what_the_connection_is_held_to() {
    let gw = Gw::start("gw-conf-connack", |o| {
        o.with(|c| c.south.max_payload_bytes = 3000)
    })
    .await;
    let r = run("connack_properties", gw.port(), "props-a", "5", &[]).await;
    let c = &r["connack"];
    assert_eq!(code(c), 0, "{r}");
    for (name, want) in [
        ("RetainAvailable", 0),
        ("WildcardSubscriptionAvailable", 0),
        ("SharedSubscriptionAvailable", 0),
        ("SubscriptionIdentifierAvailable", 0),
        ("TopicAliasMaximum", 32),
        ("ReceiveMaximum", 256),
        ("MaximumPacketSize", 3000 + 1024),
    ] {
        assert_eq!(prop(c, name), want, "{name}: {c}");
    }
    // Keep-alive 60 is within ferry's default cap (600): not mentioned.
    assert_eq!(prop(c, "ServerKeepAlive"), &Value::Null, "{c}");
    assert_eq!(prop(c, "SessionExpiryInterval"), &Value::Null, "{c}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connack_says_the_keep_alive_it_was_held_to() {
    let gw = Gw::start("gw-conf-ska", |o| o.with(|c| c.south.max_keep_alive_s = 30)).await;
    let r = run(
        "server_keep_alive",
        gw.port(),
        "ska-a",
        "5",
        &[("asks", "0,1,30,31,120")],
    )
    .await;
    for (asked, held) in [
        ("0", Some(30)),
        ("1", None),
        ("30", None),
        ("31", Some(30)),
        ("120", Some(30)),
    ] {
        let c = &r[asked];
        assert_eq!(code(c), 0, "keep-alive {asked}: {c}");
        match held {
            Some(s) => assert_eq!(prop(c, "ServerKeepAlive"), s, "keep-alive {asked}: {c}"),
            None => assert_eq!(
                prop(c, "ServerKeepAlive"),
                &Value::Null,
                "keep-alive {asked}: {c}"
            ),
        }
    }
}

at_levels!(a_silent_device_is_closed_by_its_keep_alive_and_its_will_published:
    v31 => "31", v311 => "311", v5 => "5");

/// test_keepalive: a device with keep-alive 1 s that sends nothing is
/// closed after 1.5 s, and its will, on its own `up`, is stored and sent
/// north as its own.
async fn a_silent_device_is_closed_by_its_keep_alive_and_its_will_published(level: &str) {
    let mut gw = Gw::start("gw-conf-ka", |o| o).await;
    let device = format!("ka-{level}");
    let will = format!("{}-will", gw.boot);
    let r = run(
        "keepalive",
        gw.port(),
        &device,
        level,
        &[("will", &will), ("keepalive", "1"), ("within", "6")],
    )
    .await;
    assert_eq!(code(&r["connack"]), 0, "{r}");
    let after = r["closed_after_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("not closed: {r}"));
    assert!((1.0..4.0).contains(&after), "closed after {after} s: {r}");
    let north = gw.north_ids(&device, SECS_10, |ids| !ids.is_empty()).await;
    assert_eq!(north, vec![will.clone()], "the will, north as {device}");
    assert_eq!(gw.stored(&device, &will), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_pings_stays_connected() {
    let gw = Gw::start("gw-conf-ping", |o| o).await;
    let r = run("pinging", gw.port(), "ping-a", "5", &[("for", "2.5")]).await;
    assert_eq!(r["still_connected"], true, "{r}");
}

at_levels!(a_bad_password_or_client_id_is_refused_in_the_versions_own_code:
    v31 => "31", v311 => "311", v5 => "5");

/// CONNACK codes with `south.auth = "password"`: a bad password is 0x86 in
/// MQTT 5 and 4 in 3.1.x; a client id that is no device id 0x85 / 2; the
/// right password is taken.
async fn a_bad_password_or_client_id_is_refused_in_the_versions_own_code(level: &str) {
    let device = format!("pw-{level}");
    let gw = Gw::start("gw-conf-auth", |o| {
        o.with_passwords(&[(&device, "right-one")])
    })
    .await;
    let r = run(
        "refused_connect",
        gw.port(),
        &device,
        level,
        &[("bad_id", "no:device id"), ("password", "right-one")],
    )
    .await;
    let (bad_password, bad_id) = if level == "5" { (0x86, 0x85) } else { (4, 2) };
    assert_eq!(code(&r["bad_password"]), bad_password, "{r}");
    assert_eq!(code(&r["bad_id"]), bad_id, "{r}");
    assert_eq!(r["bad_password_closed"], true, "{r}");
    assert_eq!(r["bad_id_closed"], true, "{r}");
    assert_eq!(code(&r["good"]), 0, "{r}");
}

at_levels!(over_websocket: v31 => "31", v311 => "311", v5 => "5");

/// MQTT over WebSocket (`south.listeners`, transport "ws", path /mqtt by
/// default) beside a TCP listener: paho over WebSocket at every level
/// publishes at QoS 0, 1 and 2, each stored once and answered `stored`
/// over the WebSocket, and sent north; a handshake on another path is
/// refused.
async fn over_websocket(level: &str) {
    let gw = Gw::start("gw-conf-ws", |o| {
        o.with(|c| {
            c.south.listeners = vec![
                crate::support::listener("127.0.0.1:0", "tcp"),
                crate::support::listener("127.0.0.1:0", "ws"),
            ]
        })
    })
    .await;
    websocket_case(&gw, &format!("ws-{level}"), level, None).await;
}

/// MQTT over WebSocket over TLS (transport "wss", `[south.tls]`): paho
/// checks the gateway's certificate, then the same as over "ws".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_websocket_with_tls() {
    let pki = crate::support::Pki::new("conf-wss");
    let server = pki.server("ferry-south");
    let gw = Gw::start("gw-conf-wss", |o| {
        o.with(|c| {
            c.south.tls.cert = server.cert;
            c.south.tls.key = server.key;
            c.south.listeners = vec![
                crate::support::listener("127.0.0.1:0", "tcp"),
                crate::support::listener("127.0.0.1:0", "wss"),
            ]
        })
    })
    .await;
    let ca = pki.ca.to_string_lossy().into_owned();
    websocket_case(&gw, "wss-5", "5", Some(&ca)).await;
}

/// Runs the `websocket` case on `gw`'s second listener (over TLS with
/// `ca`) and checks what it saw: each QoS stored once and answered
/// `stored` over the WebSocket, and another path refused.
async fn websocket_case(gw: &Gw, device: &str, level: &str, ca: Option<&str>) {
    let port: u16 = gw.ferry.config.south.listeners[1]
        .listen
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap();
    let boot = gw.boot.clone();
    let mut params = vec![("boot", boot.as_str()), ("path", "/mqtt")];
    params.extend(ca.map(|ca| ("ca", ca)));
    let r = run("websocket", port, device, level, &params).await;
    assert_eq!(code(&r["connack"]), 0, "{r}");
    let got = receipts(&r["messages"]);
    for q in 0..3 {
        let msg_id = format!("{boot}-w{q}");
        assert!(
            got.iter()
                .any(|v| v["msg_id"] == msg_id.as_str() && v["status"] == "stored"),
            "no stored receipt over the WebSocket for QoS {q}: {r}"
        );
        assert_eq!(gw.stored(device, &msg_id), 1, "{r}");
    }
    assert!(
        r["wrong_path_connack"].is_null() && r["wrong_path_refused"].is_string(),
        "a handshake on another path is refused: {r}"
    );
}
