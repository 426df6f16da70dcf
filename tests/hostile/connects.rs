//! CONNECTs a device firmware should never send, each answered the way
//! MQTT 3.1.1 says, and none able to grow ferry's log without bound:
//! - a client id that can be no device id (too long, a wildcard or a
//!   slash, empty) gets CONNACK 2, also when the CONNECT is too large to
//!   read (skipped on the wire, not a reset);
//! - a second CONNECT on one connection closes it (§3.1.0-2), after what
//!   came before it was handled;
//! - 2,000 refused CONNECTs with a 60,000-byte client id, 400 publishes on
//!   a 60,000-byte topic and 400 SUBSCRIBEs to a 60,000-byte filter add a
//!   few kB to the log, and are all answered and counted; of the CONNECTs,
//!   the address's first 10 a minute are logged one by one and the rest
//!   in one `refusals_suppressed` line once the minute is over.

use std::time::Duration;

use rumqttc::{ConnectReturnCode, Packet};
use serde_json::json;

use crate::support::access::{Access, AuthMode};
#[cfg(feature = "system-tests")]
use crate::support::faketime::FakeClock;
use crate::support::receipts::eventually;
use crate::support::{boot_id, device_topics, Ferry, FerryOpts, Mosquitto, RawMqtt};

/// The log level ferry ships with.
const SHIPPED_LOG_LEVEL: &str = "info,rumqttd=warn,rustls::msgs::handshake=error";

/// The size of ferry's log file now.
fn log_size(ferry: &Ferry) -> u64 {
    std::fs::metadata(&ferry.log_path).map_or(0, |m| m.len())
}

/// Asserts that the log grew by less than 64 kB since it was `before`.
fn assert_log_grew_little(ferry: &Ferry, before: u64, what: &str) {
    let grown = log_size(ferry) - before;
    assert!(
        grown < 64 * 1024,
        "{what} grew the log by {grown} bytes\n{}",
        ferry.log_tail()
    );
}

/// A CONNECT with `client_id` (and a password as long, in password mode)
/// on a fresh socket: the CONNACK's code, or why there is none.
async fn connack_for(
    access: &Access,
    port: u16,
    client_id: &str,
) -> Result<ConnectReturnCode, String> {
    let mut connect = rumqttc::Connect::new(client_id);
    connect.keep_alive = 30;
    if access.mode == AuthMode::Password {
        connect.set_login(client_id, client_id);
    }
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    RawMqtt::try_connect_packet(Box::new(stream), connect)
        .await
        .map(|(_, ack)| ack.code)
}

each_auth_mode!(
    a_client_id_that_can_be_no_device_id_gets_connack_2:
    anonymous = Anonymous,
    with_passwords = Password
);

async fn a_client_id_that_can_be_no_device_id_gets_connack_2(mode: AuthMode) {
    let access = Access::new(mode);
    let mq = Mosquitto::start();
    let ferry = Ferry::start(access.opts(FerryOpts::new("gw-ids", mq.port), &["id-ok"]));
    let ids = [
        "x".repeat(65_535),
        "x".repeat(60_000),
        "x".repeat(65),
        "a/b".to_string(),
        "a+".to_string(),
        String::new(),
    ];
    for id in &ids {
        let got = connack_for(&access, ferry.south_port, id).await;
        assert_eq!(
            got,
            Ok(ConnectReturnCode::BadClientId),
            "a client id of {} bytes ({:?}...)",
            id.len(),
            &id[..id.len().min(8)]
        );
    }
    // The one limit is the id, not its neighbours: a device id of 64
    // bytes still connects.
    let longest = "d".repeat(64);
    let got = connack_for(&access, ferry.south_port, &longest).await;
    let expected = match mode {
        // Not in the password file: refused for that, not for its id.
        AuthMode::Password => ConnectReturnCode::BadUserNamePassword,
        _ => ConnectReturnCode::Success,
    };
    assert_eq!(got, Ok(expected));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connect_closes_the_connection_after_what_came_before_it() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-second", mq.port));
    let topics = device_topics("second-1");
    let mut raw = RawMqtt::connect(ferry.south_port, "second-1", 30).await;
    let msg_id = format!("{}-before", boot_id());
    let up = raw.publish(
        &topics.up("t"),
        json!({"msg_id": msg_id, "payload": 1}).to_string(),
    );
    // Encoded apart (rumqttc writes a CONNECT's flags at an offset from
    // the start of the buffer), written in one go.
    let mut bytes = bytes::BytesMut::new();
    up.write(&mut bytes, usize::MAX).expect("encode");
    let mut again = bytes::BytesMut::new();
    Packet::Connect(rumqttc::Connect::new("second-1"))
        .write(&mut again, usize::MAX)
        .expect("encode");
    bytes.extend_from_slice(&again);
    raw.write_raw(&bytes).await.expect("written");
    assert!(
        raw.closed_within(Duration::from_secs(5)).await,
        "a second CONNECT closes the connection"
    );
    eventually(
        Duration::from_secs(10),
        "the uplink before it stored",
        || ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'second-1'", []) == 1,
    )
    .await;
    // The device comes back on a new connection as usual.
    RawMqtt::connect(ferry.south_port, "second-1", 30).await;
}

// Under libfaketime (the refusal log's window is moved on a minute at
// once): the `system-tests` feature's.
#[cfg(feature = "system-tests")]
each_auth_mode!(
    two_thousand_refused_connects_with_a_huge_client_id_add_little_to_the_log_and_are_all_counted:
    anonymous = Anonymous,
    with_passwords = Password
);

#[cfg(feature = "system-tests")]
async fn two_thousand_refused_connects_with_a_huge_client_id_add_little_to_the_log_and_are_all_counted(
    mode: AuthMode,
) {
    let access = Access::new(mode);
    let mq = Mosquitto::start();
    let opts = FerryOpts::new("gw-noisy", mq.port).with(|c| {
        c.log.level = SHIPPED_LOG_LEVEL.into();
        c.admin.listen = "127.0.0.1:0".into();
    });
    // The refusal log's window is a minute of the monotonic clock, with no
    // knob: ferry runs under a clock the test moves on a minute at once.
    let clock = FakeClock::new("+0");
    let ferry = Ferry::start(clock.on_every_clock(access.opts(opts, &["noisy-ok"])));
    let before = log_size(&ferry);
    let id = "n".repeat(60_000);
    let mut refused = 0;
    for _ in 0..2000 {
        if connack_for(&access, ferry.south_port, &id).await == Ok(ConnectReturnCode::BadClientId) {
            refused += 1;
        }
    }
    assert_eq!(refused, 2000, "every one answered CONNACK 2");
    let metrics = ferry.metrics();
    assert_eq!(
        metrics.value("ferry_broker_client_ids_refused_total"),
        2000.0,
        "all counted"
    );
    assert_log_grew_little(&ferry, before, "2,000 refusals");
    let log = ferry.log();
    assert!(
        log.contains("…(60000 bytes)") || log.contains("client_id_len=60000"),
        "the lines that are logged name the id's length\n{}",
        ferry.log_tail()
    );

    // The first refusals of the address are logged one by one (the event
    // depends on where the CONNECT was refused: too large to read in
    // password mode, its id alone otherwise); once its window is over, one
    // summary line counts the rest.
    let one_by_one = log
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("peer=127.0.0.1:"))
        .count();
    assert_eq!(
        one_by_one,
        rumqttd::refusals::PER_WINDOW as usize,
        "the address's budget, one line each\n{}",
        ferry.log_tail()
    );
    assert!(
        !log.contains("refusals_suppressed"),
        "no summary before the window ends"
    );
    clock.set(&format!("+{}", rumqttd::refusals::WINDOW.as_secs() + 1));
    let mut summary = None;
    eventually(
        Duration::from_secs(20),
        "a refusals_suppressed line",
        || {
            summary = ferry
                .log()
                .lines()
                .find(|l| {
                    l.contains("event=\"refusals_suppressed\"") && l.contains("from=127.0.0.1")
                })
                .map(str::to_string);
            summary.is_some()
        },
    )
    .await;
    let summary = summary.unwrap_or_default();
    assert!(
        summary.contains(&format!("suppressed={} ", 2000 - one_by_one)),
        "the summary counts the refusals beyond the budget: {summary}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hundred_publishes_on_a_huge_topic_add_little_to_the_log_and_are_all_answered() {
    let mq = Mosquitto::start();
    let opts = FerryOpts::new("gw-topics", mq.port).with(|c| {
        c.log.level = SHIPPED_LOG_LEVEL.into();
    });
    let ferry = Ferry::start(opts);
    let before = log_size(&ferry);
    let topics = device_topics("topic-j");
    let mut raw = RawMqtt::connect(ferry.south_port, "topic-j", 30).await;
    raw.subscribe(&[topics.ack()]).await;
    let stream = "s".repeat(60_000);
    let boot = boot_id();
    for i in 0..400 {
        let p = raw.publish(
            &topics.up(&stream),
            json!({"msg_id": format!("{boot}-{i}"), "payload": i}).to_string(),
        );
        raw.send(p).await;
    }
    let mut rejected = 0;
    raw.read_publishes(Duration::from_secs(30), |p| {
        let r: serde_json::Value = serde_json::from_slice(&p.payload).unwrap_or_default();
        rejected += usize::from(r["status"] == "rejected");
        rejected == 400
    })
    .await;
    assert_eq!(rejected, 400, "every publish answered `rejected`");
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM dead_letter WHERE device = 'topic-j'",
            []
        ),
        400,
        "and dead-lettered"
    );
    assert_log_grew_little(&ferry, before, "400 rejected publishes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hundred_refused_subscribes_to_a_huge_filter_add_little_to_the_log_and_are_all_counted(
) {
    let mq = Mosquitto::start();
    let opts = FerryOpts::new("gw-filters", mq.port).with(|c| {
        c.log.level = SHIPPED_LOG_LEVEL.into();
        c.admin.listen = "127.0.0.1:0".into();
    });
    let ferry = Ferry::start(opts);
    let before = log_size(&ferry);
    let mut raw = RawMqtt::connect(ferry.south_port, "filter-j", 30).await;
    let filter = format!("devices/other/{}", "f".repeat(60_000));
    for _ in 0..400 {
        let codes = raw.subscribe(std::slice::from_ref(&filter)).await;
        assert!(
            matches!(codes[..], [rumqttc::SubscribeReasonCode::Failure]),
            "{codes:?}"
        );
    }
    assert_eq!(
        ferry
            .metrics()
            .value("ferry_broker_subscriptions_refused_total"),
        400.0,
        "all counted"
    );
    assert_log_grew_little(&ferry, before, "400 refused subscriptions");
}
