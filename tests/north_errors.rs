//! North failures said in words, with the real binary: a north endpoint
//! that is no MQTT broker (an HTTP server, a port writing garbage) is
//! named so in the log and in the status (`/api/status`, `ferry status`),
//! and two gateways with the same `gateway.id` against one real Mosquitto
//! are told that another client took their session.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::ops::cli;
use crate::support::{Ferry, FerryOpts, Mosquitto};

/// A TCP server on a free loopback port that answers every connection
/// with `answer` and closes it, for at most 60 s (a thread; bounded).
fn not_a_broker(answer: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                    // Take the CONNECT (or whatever came), then answer.
                    let mut buf = [0u8; 512];
                    let _ = stream.read(&mut buf);
                    let _ = stream.write_all(answer);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    port
}

/// Polls `/api/status` until its north `last_error` holds `what`; the
/// status then.
async fn north_error_until(ferry: &Ferry, what: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = ferry.admin_json("/api/status");
        let error = status["north"]["last_error"].as_str().unwrap_or("");
        if error.contains(what) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "north.last_error never said {what:?}: {status}\n--- ferry log ---\n{}",
            ferry.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const HTTP: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 11\r\nConnection: close\r\n\r\nBad Request";
const GARBAGE: &[u8] = b"\x00\x00\x00\x00garbage\xff\xfe\xfd\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_north_endpoint_that_is_no_mqtt_broker_is_named_so_in_the_log_and_the_status() {
    for (name, answer) in [("http", HTTP), ("garbage", GARBAGE)] {
        let port = not_a_broker(answer);
        let ferry = Ferry::start(FerryOpts::new(&format!("gw-not-mqtt-{name}"), port));
        let endpoint = format!("127.0.0.1:{port}");
        let status = north_error_until(&ferry, &format!("not an MQTT broker at {endpoint}")).await;
        assert_eq!(status["north"]["up"], false, "{name}: {status}");
        assert_eq!(
            status["north"]["endpoint"],
            endpoint.as_str(),
            "{name}: {status}"
        );
        assert!(
            status["north"]["last_error_ms"].as_i64().unwrap_or(0) > 0,
            "{name}: {status}"
        );
        let log = ferry.log();
        let line = log
            .lines()
            .find(|l| l.contains("event=\"north_not_mqtt_broker\""))
            .unwrap_or_else(|| panic!("{name}: no north_not_mqtt_broker line:\n{log}"));
        assert!(line.contains("WARN") && line.contains(&endpoint), "{line}");
        assert!(line.len() < 1200, "{name}: a long line: {line}");
        let (code, text, _) = cli(&ferry.config_path, &["status"]);
        assert_eq!(code, Some(0), "{text}");
        assert!(
            text.contains("north: down since")
                && text.contains(&format!("(last tried {endpoint})"))
                && text.contains("last error")
                && text.contains("not an MQTT broker")
                && text.contains(&format!("version: {}, up ", env!("CARGO_PKG_VERSION"))),
            "{name}: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_with_the_same_id_are_told_another_client_took_the_session() {
    same_id_twice("3.1.1", "gw-twin").await;
}

/// MQTT 5: Mosquitto says so with DISCONNECT `SessionTakenOver`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mqtt_5_two_gateways_with_the_same_id_are_told_so_too() {
    same_id_twice("5", "gw-twin-v5").await;
}

async fn same_id_twice(version: &str, gw: &str) {
    let mq = Mosquitto::start();
    let opts = || {
        let mut opts = FerryOpts::new(gw, mq.port);
        opts.config.north.mqtt_version = version.into();
        opts
    };
    let first = Ferry::start(opts());
    let deadline = Instant::now() + Duration::from_secs(20);
    while first.admin_json("/api/status")["north"]["up"] != true {
        assert!(Instant::now() < deadline, "{}", first.log_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = Ferry::start(opts());
    // Each takes the session from the other; the one that sees three
    // connections closed soon after they were accepted says why.
    let taken = format!(
        "another client with this id (ferry-{gw}) took the session on 127.0.0.1:{}; is a second gateway running with gateway.id = {gw}?",
        mq.port
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    let (told, status) = loop {
        let told = [&first, &second].into_iter().find_map(|f| {
            let s = f.admin_json("/api/status");
            (s["north"]["last_error"].as_str() == Some(taken.as_str())).then_some((f, s))
        });
        if let Some(found) = told {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "neither gateway said {taken:?}\n--- first ---\n{}\n--- second ---\n{}",
            first.log_tail(),
            second.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        status["north"]["endpoint"],
        format!("127.0.0.1:{}", mq.port),
        "{status}"
    );
    let log = told.log();
    assert!(
        log.lines()
            .any(|l| l.contains("event=\"north_session_taken\"")
                && l.contains("WARN")
                && l.contains(&format!("gateway.id = {gw}?"))),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_north_login_says_the_broker_refused_it_and_why() {
    // Mosquitto with a password file and no anonymous clients.
    let devices = [("someone".to_string(), "secret".to_string())];
    let mq = Mosquitto::start_site_with(None, &devices);
    let mut opts = FerryOpts::new("gw-refused", mq.port);
    opts.config.north.username = crate::support::mosquitto::SITE_USER.into();
    opts.config.north.password = "not-the-password".into();
    let ferry = Ferry::start(opts);
    let status = north_error_until(&ferry, "refused the connection: not authorized").await;
    let error = status["north"]["last_error"].as_str().unwrap_or("");
    assert!(
        error.starts_with(&format!("127.0.0.1:{} refused the connection", mq.port))
            && error.contains("check north.username and north.password"),
        "{status}"
    );
    let log = ferry.log();
    assert!(
        log.lines()
            .any(|l| l.contains("event=\"north_connect_refused\"")
                && l.contains("reason=\"not authorized\"")),
        "{log}"
    );
}
