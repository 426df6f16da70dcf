//! What an operator sees at the shipped log level (`log.level`'s default):
//! devices coming and going and failed TLS handshakes are there, each line
//! names its `event`, and a device that reconnects in a loop cannot fill
//! the log with them.

use std::time::Duration;

use crate::support::receipts::eventually;
use crate::support::{Ferry, FerryOpts, Mosquitto, Pki, RawMqtt};

/// The log level ferry ships with (conf/ferry.toml, `RawLog::default`).
const SHIPPED_LOG_LEVEL: &str = "info,rumqttd=warn,rustls::msgs::handshake=error";

/// The lines at INFO, WARN or ERROR in a text log.
fn named_level_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            [" INFO ", " WARN ", " ERROR "]
                .iter()
                .any(|lvl| l.contains(lvl))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_shipped_level_devices_coming_and_going_and_failed_handshakes_are_logged_by_name() {
    let pki = Pki::new("logs-shipped");
    let server = pki.server("ferry-south");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-logs", mq.port).with(|c| {
        c.log.level = SHIPPED_LOG_LEVEL.into();
        c.south.tls.cert = server.cert;
        c.south.tls.key = server.key;
    }));
    let raw = RawMqtt::connect_tls(ferry.south_port, "press-7", 30, pki.client_config(None)).await;
    drop(raw);
    // Plain MQTT on the TLS port is a failed handshake.
    assert!(RawMqtt::try_connect(ferry.south_port, "plain-1", 30)
        .await
        .is_err());
    eventually(
        Duration::from_secs(10),
        "a disconnect and a failed handshake logged",
        || {
            let log = ferry.log();
            log.contains("event=\"device_disconnected\"")
                && log.contains("event=\"tls_handshake_failed\"")
        },
    )
    .await;
    let log = ferry.log();
    for event in ["device_connected", "device_disconnected"] {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("event=\"{event}\"")) && l.contains("device=press-7")),
            "{event} names the device\n{log}"
        );
    }
    let handshake = log
        .lines()
        .find(|l| l.contains("event=\"tls_handshake_failed\""))
        .unwrap();
    assert!(handshake.contains(" WARN "), "{handshake}");
    assert!(handshake.contains("peer=127.0.0.1:"), "{handshake}");
    let unnamed: Vec<&str> = named_level_lines(&log)
        .into_iter()
        .filter(|l| !l.contains("event="))
        .collect();
    assert!(unnamed.is_empty(), "lines without an event: {unnamed:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_reconnecting_in_a_loop_gets_ten_lines_a_minute_not_one_per_connection() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-flap", mq.port).with(|c| {
        c.log.level = SHIPPED_LOG_LEVEL.into();
    }));
    for _ in 0..30 {
        let raw = RawMqtt::connect(ferry.south_port, "flap-1", 30).await;
        drop(raw);
    }
    // The thirtieth connection is counted, whether logged or not.
    eventually(Duration::from_secs(10), "30 connections counted", || {
        ferry
            .metrics()
            .value("ferry_broker_connects_total{protocol=\"3.1.1\"}")
            >= 30.0
    })
    .await;
    // The last disconnect reaches the log after the count.
    eventually(Duration::from_secs(10), "a disconnect logged", || {
        ferry.log().contains("event=\"device_disconnected\"")
    })
    .await;
    let log = ferry.log();
    let lines = |event: &str| {
        log.lines()
            .filter(|l| l.contains(&format!("event=\"{event}\"")) && l.contains("device=flap-1"))
            .count()
    };
    let (connected, disconnected) = (lines("device_connected"), lines("device_disconnected"));
    assert!(connected >= 1, "the device's connects are logged\n{log}");
    assert!(
        connected + disconnected <= 10,
        "at most 10 lines a minute per device: {connected} + {disconnected}\n{log}"
    );
}
