//! The north side of downlinks: an upstream broker restart, malformed
//! envelopes, a repeated downlink, and a burst the broker held.

use super::*;

both_modes!(downlinks_sent_across_an_upstream_broker_restart_are_all_queued_once_and_delivered);
async fn downlinks_sent_across_an_upstream_broker_restart_are_all_queued_once_and_delivered(
    mode: Mode,
) {
    const N: usize = 300;
    const DEVICE: &str = "panel-storm";
    let mut mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-down-bounce", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, Duration::from_secs(2)).await;
    let boot = boot_id();
    let mut device = device_client(ferry.south_port, DEVICE);
    connected(&mut device, DEVICE).await;
    let consumer = tokio::spawn(async move {
        let mut inbox = Inbox::default();
        take_inbox(&mut device, SECS_60, true, &mut inbox, |i| {
            i.handed.len() >= N
        })
        .await;
        // Anything handed twice would show up here.
        inbox_until(&mut device, QUIET, true, &mut inbox, |_| false).await;
        inbox
    });

    let ids: Vec<String> = (1..=N).map(|i| format!("st-{boot}-{i:04}")).collect();
    for (i, id) in ids.iter().enumerate() {
        if i == N / 3 {
            mq.stop();
        }
        if i == 2 * N / 3 {
            mq.restart();
        }
        north.send(&[DEVICE], id, json!({"i": i}));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let inbox = consumer.await.expect("device task");
    let handed: Vec<&str> = inbox.handed.iter().map(|m| m.msg_id.as_str()).collect();
    assert_eq!(
        handed.iter().collect::<HashSet<_>>().len(),
        handed.len(),
        "the device was handed a message twice"
    );
    assert_eq!(
        handed.iter().copied().collect::<HashSet<_>>(),
        ids.iter().map(String::as_str).collect::<HashSet<_>>(),
        "the device got every downlink"
    );
    assert_eq!(
        inbox.seqs(),
        (1..=N as u64).collect::<Vec<_>>(),
        "handed in seq order, contiguous"
    );

    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM down_delivery", []),
        N as i64,
        "each downlink queued once"
    );
    assert_eq!(
        ferry.query_i64("SELECT count(DISTINCT seq) FROM down_delivery", []),
        N as i64
    );
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM down_message", []),
        N as i64
    );
    eventually(
        SECS_20,
        "every delivery is `delivered` in the store",
        || {
            ferry.query_i64(
                "SELECT count(*) FROM down_delivery WHERE state = 'delivered'",
                [],
            ) == N as i64
        },
    )
    .await;
    // Each downlink was answered north (its `stored` may have been lost with
    // the broker; the resend is then answered with its current status).
    // `delivered` receipts are not counted: those of confirms made while
    // the broker was down are held and published when ferry is back, which
    // can be before the backend (clean session) has subscribed again, and
    // nothing ever repeats a `delivered`. Delivery is checked on the device
    // and in the store above.
    north
        .expect(SECS_30, "an answer for every downlink", |r| {
            r.iter()
                .filter(|r| matches!(status(r), "stored" | "delivered"))
                .map(key_of)
                .collect::<HashSet<_>>()
                .len()
                == N
        })
        .await;
    let answered: HashSet<Key> = north.receipts.iter().map(key_of).collect();
    assert!(
        ids.iter().all(|id| answered.contains(&key(id, DEVICE))),
        "a downlink without an answer"
    );
}

both_modes!(malformed_downlinks_are_rejected_with_a_reason_and_dead_lettered);
async fn malformed_downlinks_are_rejected_with_a_reason_and_dead_lettered(mode: Mode) {
    const DEVICE: &str = "panel-m";
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(
        mode,
        FerryOpts::new("gw-down-bad", mq.port).with(|c| {
            c.groups
                .insert("line3".to_string(), vec!["panel-m".to_string()]);
        }),
    );
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let raw = BareClient::connect(
        mq.port,
        &format!("raw-backend-{}", std::process::id()),
        vec![],
    )
    .await;
    let boot = boot_id();
    let one = north_topics(&ferry.gateway).down_to(&DeviceId::new(DEVICE).unwrap());
    let many = north_topics(&ferry.gateway).down();
    let no_recipient = format!("bad-{boot}-norecipient");
    let unknown_group = format!("bad-{boot}-group");
    let bad_device = format!("bad-{boot}-device");
    let to_not_list = format!("bad-{boot}-to");
    let cases: Vec<(&str, String, Option<&str>, &str)> = vec![
        (
            one.as_str(),
            "{\"msg_id\": \"x\", ".to_string(),
            None,
            "JSON",
        ),
        (
            one.as_str(),
            json!({"payload": 1}).to_string(),
            None,
            "msg_id",
        ),
        (
            many.as_str(),
            json!({"msg_id": no_recipient, "payload": 1}).to_string(),
            Some(&no_recipient),
            "recipient",
        ),
        (
            many.as_str(),
            json!({"msg_id": unknown_group, "payload": 1, "to": ["@nope"]}).to_string(),
            Some(&unknown_group),
            "group",
        ),
        (
            many.as_str(),
            json!({"msg_id": bad_device, "payload": 1, "to": ["no spaces allowed"]}).to_string(),
            Some(&bad_device),
            "device id",
        ),
        (
            many.as_str(),
            json!({"msg_id": to_not_list, "payload": 1, "to": DEVICE}).to_string(),
            Some(&to_not_list),
            "array",
        ),
        (
            one.as_str(),
            json!({"msg_id": "has a space", "payload": 1}).to_string(),
            None,
            "msg_id",
        ),
    ];
    for (n, (topic, body, msg_id, hint)) in cases.iter().enumerate() {
        raw.publish(topic, body.as_bytes()).await;
        north
            .expect(SECS_20, &format!("`rejected` for {body}"), |r| {
                r.iter().filter(|r| status(r) == "rejected").count() > n
            })
            .await;
        let rejected = north
            .receipts
            .iter()
            .filter(|r| status(r) == "rejected")
            .nth(n)
            .expect("checked");
        let expected_id = msg_id.map(Value::from).unwrap_or(Value::Null);
        assert_eq!(rejected["msg_id"], expected_id, "{body} → {rejected}");
        let reason = rejected["reason"].as_str().unwrap_or("");
        assert!(
            reason.contains(hint),
            "the reason for {body} names the problem ({hint}): {rejected}"
        );
        assert_eq!(
            ferry.query_i64(
                "SELECT count(*) FROM dead_letter WHERE direction = 'down' AND raw = ?1 \
                 AND topic = ?2 AND length(reason) > 0",
                rusqlite::params![body.as_bytes(), topic]
            ),
            1,
            "a dead letter for {body}"
        );
    }
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM dead_letter WHERE msg_id = ?1",
            [&unknown_group]
        ),
        1,
        "the dead letter keeps a readable msg_id"
    );
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM down_message", []),
        0,
        "nothing malformed was queued"
    );

    // The gateway goes on: a well-formed downlink to the group is stored.
    let good = format!("ok-{boot}");
    raw.publish(
        &many,
        json!({"msg_id": good, "payload": "fine", "to": ["@line3"]}).to_string(),
    )
    .await;
    north
        .expect(SECS_20, "`stored` for the good downlink", |r| {
            seqs_with(r, "stored").get(&key(&good, DEVICE)) == Some(&1)
        })
        .await;
    assert_eq!(
        ferry.query_i64("SELECT count(*) FROM dead_letter", []),
        cases.len() as i64,
        "one dead letter per malformed downlink"
    );
}

both_modes!(
    a_repeated_downlink_is_answered_with_its_current_status_and_queued_only_for_new_devices
);
async fn a_repeated_downlink_is_answered_with_its_current_status_and_queued_only_for_new_devices(
    mode: Mode,
) {
    let (a, b, c) = ("rep-a", "rep-b", "rep-c");
    let mq = Mosquitto::start();
    let ferry = Ferry::start_in(mode, FerryOpts::new("gw-down-repeat", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let mut dev_a = device_client(ferry.south_port, a);
    connected(&mut dev_a, a).await;
    let msg_id = format!("rep-{boot}");
    north.send(&[a, b], &msg_id, json!("twice"));
    let mut inbox = Inbox::default();
    take_inbox(&mut dev_a, SECS_20, true, &mut inbox, |i| {
        !i.handed.is_empty()
    })
    .await;
    north
        .expect(SECS_20, "`stored` ×2 and `delivered` for rep-a", |r| {
            count_with(r, "stored") == 2 && count_with(r, "delivered") == 1
        })
        .await;
    north.settle(QUIET).await;
    let before = north.receipts.len();

    // The backend sends it again, now naming a third device.
    north.send(&[a, b, c], &msg_id, json!("twice"));
    north
        .expect(SECS_20, "an answer for each of the three", |r| {
            r[before..].iter().map(key_of).collect::<HashSet<_>>().len() == 3
        })
        .await;
    north.settle(QUIET).await;
    let repeat: HashMap<Key, (String, u64)> = north.receipts[before..]
        .iter()
        .map(|r| {
            (
                key_of(r),
                (status(r).to_string(), r["seq"].as_u64().unwrap_or(0)),
            )
        })
        .collect();
    assert_eq!(
        repeat,
        HashMap::from([
            (key(&msg_id, a), ("delivered".to_string(), 1)),
            (key(&msg_id, b), ("stored".to_string(), 1)),
            (key(&msg_id, c), ("stored".to_string(), 1)),
        ]),
        "the repeat is answered with each delivery's current status and original seq"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery d JOIN down_message m ON m.id = d.message_id \
             WHERE m.msg_id = ?1",
            [&msg_id]
        ),
        3,
        "queued once per device"
    );
    assert_eq!(
        ferry.query_i64("SELECT max(down_seq) FROM devices", []),
        1,
        "no device got a second seq"
    );
    inbox_until(&mut dev_a, QUIET, true, &mut inbox, |_| false).await;
    assert_eq!(inbox.seqs(), vec![1], "rep-a got it once");
}

both_modes!(receipts_pending_north_survive_a_sigkill_and_all_reach_the_backend_after_restart);
async fn receipts_pending_north_survive_a_sigkill_and_all_reach_the_backend_after_restart(
    mode: Mode,
) {
    const N: usize = 120;
    const DEVICE: &str = "panel-outbox";
    let mut mq = Mosquitto::start();
    let mut ferry = Ferry::start_in(mode, FerryOpts::new("gw-down-outbox", mq.port));
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    let ids: Vec<String> = (1..=N).map(|i| format!("ob-{boot}-{i:04}")).collect();
    for id in &ids {
        north.send(&[DEVICE], id, json!(1));
    }
    north
        .expect(SECS_60, "`stored` receipts", |r| {
            count_with(r, "stored") == N
        })
        .await;

    // The upstream goes away; the device takes and confirms everything, so
    // every `delivered` receipt waits in ferry's outbox.
    mq.stop();
    let mut device = device_client(ferry.south_port, DEVICE);
    connected(&mut device, DEVICE).await;
    let mut inbox = Inbox::default();
    take_inbox(&mut device, SECS_60, true, &mut inbox, |i| {
        i.handed.len() >= N
    })
    .await;
    eventually(SECS_20, "every delivery `delivered` in the store", || {
        ferry.query_i64(
            "SELECT count(*) FROM down_delivery WHERE state = 'delivered'",
            [],
        ) == N as i64
    })
    .await;
    let waiting = ferry.query_i64("SELECT count(*) FROM receipt_outbox", []);
    assert!(waiting >= N as i64, "{waiting} receipts in the outbox");

    // Killed with all of them unsent; the upstream returns, the backend
    // subscribes again, then ferry starts.
    ferry.kill();
    mq.restart();
    let deadline = Instant::now() + SECS_30;
    loop {
        match tokio::time::timeout(left(deadline), north.client.events.recv()).await {
            Ok(Some(BackendEvent::Connected)) => break,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the backend client stopped"),
            Err(_) => panic!("the backend did not reconnect within 30 s"),
        }
    }
    ferry.restart();
    north
        .expect(SECS_60, "a `delivered` receipt for every downlink", |r| {
            r.iter()
                .filter(|r| status(r) == "delivered")
                .map(key_of)
                .collect::<HashSet<_>>()
                .len()
                == N
        })
        .await;
    let delivered: HashSet<Key> = north
        .receipts
        .iter()
        .filter(|r| status(r) == "delivered")
        .map(key_of)
        .collect();
    assert!(ids.iter().all(|id| delivered.contains(&key(id, DEVICE))));
    eventually(SECS_20, "the outbox empties once acknowledged", || {
        ferry.query_i64("SELECT count(*) FROM receipt_outbox", []) == 0
    })
    .await;
    drop(device);
}

/// Publishes each line of stdin on argv[2] (QoS 1) to the broker on
/// 127.0.0.1:argv[1]; exits 0 once all are acknowledged.
#[cfg(feature = "system-tests")]
const PUBLISH_LINES: &str = r#"
import sys, time, paho.mqtt.client as mqtt
kw = {"client_id": "burst-publisher"}
if hasattr(mqtt, "CallbackAPIVersion"):
    kw["callback_api_version"] = mqtt.CallbackAPIVersion.VERSION2
c = mqtt.Client(**kw)
c.max_inflight_messages_set(200)
c.max_queued_messages_set(0)
c.connect("127.0.0.1", int(sys.argv[1]))
c.loop_start()
while not c.is_connected():
    time.sleep(0.01)
sent = []
for line in sys.stdin:
    sent.append(c.publish(sys.argv[2], line.rstrip("\n"), qos=1))
    if len(sent) % 10000 == 0:  # message ids are 16 bits: never 65,536 out
        for m in sent[-10000:]:
            m.wait_for_publish(60)
for m in sent:
    m.wait_for_publish(60)
c.disconnect()
c.loop_stop()
sys.exit(0 if all(m.is_published() for m in sent) else 1)
"#;

/// A broker that holds more downlinks for ferry than ferry takes in one
/// keep-alive (a long cut-off with the backend sending on, say) sends
/// them all at once when ferry's kept session comes back, with no
/// in-flight limit (the tests' Mosquitto, `max_inflight_messages 0`). The
/// PINGRESP is behind them in the stream: ferry must take them all and
/// keep its link, not drop it on an unanswered ping and start over (it
/// did, after 16 s; in a fault run with a 5-minute cut-off, again and
/// again, while the backend sent its unanswered downlinks again). Its
/// publisher is paho in Python: the `system-tests` feature's.
#[cfg(feature = "system-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_downlinks_the_broker_held_is_taken_on_one_connection() {
    const N: usize = 100_000;
    const DEVICE: &str = "panel-burst";
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start(FerryOpts::new("gw-down-burst", mq.port));
    // Subscribed once: the broker keeps ferry's session while it is away.
    drop(North::connect(mq.port, &ferry.gateway, SECS_30).await);
    assert!(ferry.terminate(SECS_20), "ferry stopped");
    let boot = boot_id();
    let lines: String = (0..N)
        .map(|i| {
            format!(
                "{}\n",
                json!({"msg_id": format!("burst-{boot}-{i:05}"), "payload": i})
            )
        })
        .collect();
    let topic = format!("ferry/{}/down/{DEVICE}", ferry.gateway);
    // paho, which returns once the broker acknowledged every one
    // (`mosquitto_pub -l` had sent only about a third of 100,000 when it
    // exited, here).
    let mut publisher = std::process::Command::new(crate::examples_python::PYTHON)
        .args(["-c", PUBLISH_LINES, &mq.port.to_string(), &topic])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with paho-mqtt (run ./scripts/test.sh, which installs it)");
    use std::io::Write;
    publisher
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    assert!(publisher.wait().unwrap().success(), "the publisher");

    let before = crate::support::north_connects(&ferry.log());
    ferry.restart();
    eventually(
        Duration::from_secs(120),
        "every downlink of the burst stored",
        || ferry.query_i64("SELECT count(*) FROM down_delivery", []) == N as i64,
    )
    .await;
    let log = ferry.log();
    assert_eq!(
        crate::support::north_connects(&log) - before,
        1,
        "the link was lost while taking the burst\n{}",
        ferry.log_tail()
    );
}
