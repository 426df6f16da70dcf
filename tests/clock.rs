//! ferry under a wrong or stepped wall clock (libfaketime preloaded into
//! the real binary, Mosquitto on the real clock): `ttl_s`, retention and
//! the backlog age count time in the store, and no retry, sweep or
//! confirm timeout waits on the wall clock.

use std::time::{Duration, Instant};

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
use serde_json::{json, Value};

use crate::support::faketime::FakeClock;
use crate::support::receipts::{eventually, ids_with, status};
use crate::support::{logged, now_ms, Backend, Device, Ferry, FerryOpts, Mosquitto};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_30: Duration = Duration::from_secs(30);
const DAY_MS: i64 = 86_400_000;

#[test]
fn the_fake_clock_is_installed_and_moves_the_wall_clock_only() {
    let clock = FakeClock::new("-365d");
    let behind = now_ms() as i64 - clock.read_ms();
    assert!(
        (364 * DAY_MS..366 * DAY_MS).contains(&behind),
        "a process under `-365d` reads a wall clock {behind} ms behind"
    );
    clock.set("+0");
    assert!((now_ms() as i64 - clock.read_ms()).abs() < 5_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uplinks_stored_a_year_behind_with_a_ttl_are_all_delivered_once_the_clock_is_right() {
    let gw = "gw-clock-year";
    let clock = FakeClock::new("-365d");
    let mut mq = Mosquitto::start();
    mq.stop();
    let mut ferry = Ferry::start(clock.on(FerryOpts::new(gw, mq.port)));
    let mut device = Device::connect(ferry.south_port, "clk-year").await;
    let ids: Vec<String> = (0..20).map(|i| format!("year-{i}")).collect();
    for id in &ids {
        let body = json!({"msg_id": id, "payload": 1, "ttl_s": 3600}).to_string();
        device.publish_raw(&device.up_topic("t"), body).await;
    }
    let got = device
        .receipts_until(SECS_30, |all| ids_with(all, "stored").len() == ids.len())
        .await;
    assert_eq!(ids_with(&got, "stored").len(), ids.len(), "{got:?}");
    let stored_ts = got[0]["ts"].as_i64().unwrap_or_default();
    assert!(
        now_ms() as i64 - stored_ts > 364 * DAY_MS,
        "receipts carry the (wrong) wall clock: {}",
        got[0]
    );
    // Measured from the last persisted mark, at most 10 s old.
    let left = ferry.query_i64(
        "SELECT min(expires_ms) - (SELECT store_ms FROM store_clock) FROM uplink",
        [],
    );
    assert!(
        (3_500_000..=3_611_000).contains(&left),
        "an hour left on the store clock, whatever the wall clock says: {left} ms"
    );

    // NTP syncs while ferry is down: it comes back a year later on the
    // wall clock, a few seconds later on the store clock.
    // The first session goes: shadowed, it would stay alive and reconnect,
    // and two sessions of one client id take the connection from each
    // other over and over.
    drop(device);
    assert!(ferry.terminate(SECS_10), "ferry stops cleanly");
    clock.set("+0");
    ferry.restart();
    let mut device = Device::connect(ferry.south_port, "clk-year").await;
    mq.restart();
    let _backend = Backend::connect_auto_ack(mq.port, gw).await;
    let got = device
        .receipts_until(SECS_30, |all| {
            ids_with(all, "delivered").len() == ids.len() || !ids_with(all, "failed").is_empty()
        })
        .await;
    assert!(ids_with(&got, "failed").is_empty(), "none expired: {got:?}");
    assert_eq!(ids_with(&got, "delivered").len(), ids.len(), "{got:?}");
    assert_eq!(ferry.query_i64("SELECT count(*) FROM dead_letter", []), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_stepped_back_an_hour_stops_no_retry_no_ttl_no_confirm_timeout_and_no_alert() {
    let gw = "gw-clock-back";
    let clock = FakeClock::new("+0");
    let mut mq = Mosquitto::start();
    let ferry = Ferry::start(clock.on(FerryOpts::new(gw, mq.port).with(|c| {
        c.downlink.confirm_timeout_ms = 1000;
        c.alerts.north_down_s = 2;
    })));
    let mut backend = BackendClient::connect(BackendOptions::new("127.0.0.1", mq.port, gw));
    let mut events = Events::default();
    events
        .until(&mut backend, "the gateway online", |e| e.online)
        .await;
    let mut device = Device::connect(ferry.south_port, "clk-up").await;
    let mut inbox =
        DeviceClient::connect(DeviceOptions::new("127.0.0.1", ferry.south_port, "clk-in"));

    // Before the step: an uplink the backend will nack once, one with a
    // short ttl it never acks, a downlink with a short ttl for a device
    // that is offline, one for a device that never confirms it.
    for body in [
        json!({"msg_id": "retried", "payload": 1}),
        json!({"msg_id": "short", "payload": 2, "ttl_s": 3}),
    ] {
        device
            .publish_raw(&device.up_topic("t"), body.to_string())
            .await;
    }
    let got = device
        .receipts_until(SECS_10, |all| ids_with(all, "stored").len() == 2)
        .await;
    assert_eq!(ids_with(&got, "stored").len(), 2, "{got:?}");
    backend.send_down(
        &["clk-off"],
        json!({"msg_id": "down-short", "payload": 1, "ttl_s": 3}),
    );
    backend.send_down(&["clk-in"], json!({"msg_id": "unconfirmed", "payload": 1}));
    events
        .until(&mut backend, "both downlinks stored", |e| {
            e.receipt("down-short", "stored") && e.receipt("unconfirmed", "stored")
        })
        .await;

    // NTP steps the wall clock back an hour.
    clock.set("-1h");
    let stepped = Instant::now();

    // The retry: nacked with retry once, then acked.
    events
        .until(&mut backend, "`retried` sent north", |e| {
            e.uplinks("retried") >= 1
        })
        .await;
    backend.nack("clk-up", "retried", "busy", true).unwrap();
    events
        .until(&mut backend, "`retried` sent again", |e| {
            e.uplinks("retried") >= 2
        })
        .await;
    backend.ack_ok("clk-up", "retried").unwrap();

    // The ttls run out on time, on the store clock (3 s, plus a 5 s sweep
    // for the downlink), not an hour late.
    events
        .until(&mut backend, "`down-short` expired", |e| {
            e.receipt("down-short", "expired")
        })
        .await;
    let mut receipts = got;
    receipts.extend(
        device
            .receipts_until(SECS_10, |all| {
                all.iter()
                    .any(|r| r["msg_id"] == "retried" && status(r) == "delivered")
                    && all
                        .iter()
                        .any(|r| r["msg_id"] == "short" && status(r) == "failed")
            })
            .await,
    );
    let of = |id: &str| -> Vec<&str> {
        receipts
            .iter()
            .filter(|r| r["msg_id"] == id)
            .map(status)
            .collect()
    };
    assert_eq!(of("retried"), ["stored", "delivered"], "{receipts:?}");
    assert_eq!(of("short"), ["stored", "failed"], "{receipts:?}");
    assert!(
        stepped.elapsed() < Duration::from_secs(15),
        "all within seconds of the step: {:?}",
        stepped.elapsed()
    );

    // The unconfirmed batch is sent again after its 1 s confirm timeout.
    let deadline = Instant::now() + SECS_10;
    let (mut handed, mut again) = (0, 0);
    while again == 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, inbox.events.recv()).await {
            Ok(Some(DeviceEvent::Inbox {
                messages,
                duplicates,
                ..
            })) => {
                handed += messages.len();
                again += duplicates;
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    assert_eq!(
        (handed, again >= 1),
        (1, true),
        "handed once, resent after the timeout"
    );
    inbox.confirm(1);
    events
        .until(&mut backend, "`unconfirmed` delivered", |e| {
            e.receipt("unconfirmed", "delivered")
        })
        .await;

    // The upstream goes away: north_down is raised after
    // alerts.north_down_s (2 s) and the next look (every 5 s), not an hour
    // late.
    assert_eq!(logged(&ferry.log(), "alert_raised", "north_down"), 0);
    mq.stop();
    let down = Instant::now();
    eventually(Duration::from_secs(20), "north_down raised", || {
        logged(&ferry.log(), "alert_raised", "north_down") == 1
    })
    .await;
    assert!(
        down.elapsed() < Duration::from_secs(12),
        "raised {:?} after the upstream went away",
        down.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_dead_letters_made_a_year_behind_outlive_the_step_and_raise_no_backlog_alert() {
    let gw = "gw-clock-keep";
    let clock = FakeClock::new("-365d");
    let mut mq = Mosquitto::start();
    // Everything at its shortest: a day of retention, ten minutes of backlog.
    let opts = FerryOpts::new(gw, mq.port).with(|c| {
        c.store.retention_days = 1;
        c.store.dead_letter_retention_days = 1;
        c.alerts.backlog_age_s = 600;
    });
    let mut ferry = Ferry::start(clock.on(opts));
    let backend = Backend::connect_auto_ack(mq.port, gw).await;
    let mut device = Device::connect(ferry.south_port, "clk-keep").await;

    // A year behind: four uplinks delivered, two malformed ones dead-lettered,
    // and, with north gone, one waiting.
    let delivered = ["kept-0", "kept-1", "kept-2", "aged"];
    for id in delivered {
        device.publish_envelope("t", id, json!(1)).await;
    }
    let got = device
        .receipts_until(SECS_30, |all| ids_with(all, "delivered").len() == 4)
        .await;
    assert_eq!(ids_with(&got, "delivered").len(), 4, "{got:?}");
    for _ in 0..2 {
        device.publish_raw(&device.up_topic("t"), "{not json").await;
    }
    eventually(SECS_10, "two dead letters", || {
        ferry.query_i64("SELECT count(*) FROM dead_letter", []) == 2
    })
    .await;
    drop(backend);
    mq.stop();
    device.publish_envelope("t", "waiting", json!(1)).await;
    let got = device
        .receipts_until(SECS_10, |all| ids_with(all, "stored").contains("waiting"))
        .await;
    assert!(ids_with(&got, "stored").contains("waiting"), "{got:?}");
    assert!(ferry.terminate(SECS_10), "ferry stops cleanly");

    // One delivered uplink and one dead letter made truly old: two days
    // before on the store clock as well.
    {
        let conn = rusqlite::Connection::open(ferry.data_dir.join("ferry.db")).unwrap();
        conn.execute_batch(&format!(
            "UPDATE uplink SET done_store_ms = done_store_ms - {two_days} WHERE msg_id = 'aged';
             UPDATE dead_letter SET at_store_ms = at_store_ms - {two_days}
                 WHERE id = (SELECT min(id) FROM dead_letter);",
            two_days = 2 * DAY_MS
        ))
        .unwrap();
    }

    // NTP syncs while ferry is down: everything is a year old on the wall
    // clock, seconds old in the store.
    clock.set("+0");
    ferry.restart();
    eventually(SECS_10, "a prune after the restart", || {
        logged(&ferry.log(), "pruned", "") > 0
    })
    .await;
    let uplinks = |sql: &str| ferry.query_i64(sql, []);
    assert_eq!(
        uplinks("SELECT count(*) FROM uplink WHERE msg_id = 'aged'"),
        0,
        "old on both clocks: pruned"
    );
    assert_eq!(
        uplinks("SELECT count(*) FROM uplink WHERE msg_id LIKE 'kept-%' AND state = 'delivered'"),
        3,
        "delivered a year ago on the wall clock, seconds ago in the store: kept"
    );
    assert_eq!(
        uplinks("SELECT count(*) FROM dead_letter"),
        1,
        "the fresh dead letter is kept"
    );
    assert_eq!(
        uplinks("SELECT count(*) FROM uplink WHERE msg_id = 'waiting' AND state = 'stored'"),
        1
    );

    // The alerts look at once and every 5 s: two looks, and the waiting
    // uplink, a year old on the wall clock, is not a backlog_age.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let log = ferry.log();
    assert_eq!(
        logged(&log, "alert_raised", "backlog_age"),
        0,
        "{}",
        ferry.log_tail()
    );
    let status = crate::ops::cli_json(&ferry, &["status"]);
    let age = status["uplink_oldest_age_s"].as_f64().unwrap_or(f64::MAX);
    assert!(
        age < 600.0,
        "ferry status counts the age in the store: {status}"
    );
}

/// What the backend heard.
#[derive(Default)]
struct Events {
    online: bool,
    receipts: Vec<Value>,
    uplinks: Vec<String>,
}

impl Events {
    fn receipt(&self, msg_id: &str, wanted: &str) -> bool {
        self.receipts
            .iter()
            .any(|r| r["msg_id"] == msg_id && status(r) == wanted)
    }

    fn uplinks(&self, msg_id: &str) -> usize {
        self.uplinks.iter().filter(|m| *m == msg_id).count()
    }

    /// Takes events until `done` holds; panics after 30 s.
    async fn until(
        &mut self,
        backend: &mut BackendClient,
        what: &str,
        done: impl Fn(&Events) -> bool,
    ) {
        let deadline = Instant::now() + SECS_30;
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, backend.events.recv()).await {
                Ok(Some(BackendEvent::Status(s))) => self.online = s.online,
                Ok(Some(BackendEvent::Receipt(r))) => {
                    self.receipts.push(serde_json::to_value(&r).unwrap())
                }
                Ok(Some(BackendEvent::Uplink(m))) => {
                    self.uplinks.push(m.envelope.msg_id.to_string())
                }
                Ok(Some(BackendEvent::Connected)) => {}
                Ok(None) => panic!("the backend client stopped"),
                Err(_) => panic!(
                    "no {what} within 30 s; receipts {:?}, uplinks {:?}",
                    self.receipts, self.uplinks
                ),
            }
        }
    }
}
