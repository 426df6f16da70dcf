//! What is stored survives: an upstream outage, and a SIGKILL of ferry.

use super::*;

both_modes!(messages_stored_during_a_ten_second_upstream_outage_are_delivered_after_it);
async fn messages_stored_during_a_ten_second_upstream_outage_are_delivered_after_it(mode: Mode) {
    let mut mq = Mosquitto::start();
    let mut ferry = Ferry::start_in(mode, FerryOpts::new("gw-outage", mq.port));
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-outage").await;
    let boot = boot_id();

    // Warm-up: the whole path works before the outage.
    let mut devices = Vec::new();
    let mut receipts: Vec<Vec<Value>> = Vec::new();
    let mut ids: Vec<Vec<String>> = Vec::new();
    for d in 0..3 {
        let mut device = Device::connect(ferry.south_port, &format!("out-{d}")).await;
        let warm = device.publish_many("t", &boot, "warm", 1).await;
        let got = device
            .receipts_until(SECS_30, |all| ids_with_status(all, "delivered") == 1)
            .await;
        assert_eq!(ids_with_status(&got, "delivered"), 1, "warm-up: {got:?}");
        devices.push(device);
        receipts.push(got);
        ids.push(warm);
    }

    mq.stop();
    let outage = Instant::now();
    for (d, device) in devices.iter().enumerate() {
        let sent = device.publish_many("t", &boot, "out", 50).await;
        ids[d].extend(sent);
    }
    for (d, device) in devices.iter_mut().enumerate() {
        let until = (outage + Duration::from_secs(9)).saturating_duration_since(Instant::now());
        let got = device
            .receipts_until(until, |all| ids_with_status(all, "stored") == 50)
            .await;
        receipts[d].extend(got);
        assert_eq!(
            ids_with_status(&receipts[d], "stored"),
            ids[d].len(),
            "{}: every message is `stored` while upstream is down",
            device.id
        );
        assert_eq!(
            ids_with_status(&receipts[d], "delivered"),
            1,
            "{}: nothing can be delivered while upstream is down",
            device.id
        );
    }
    assert!(
        ferry.is_running(),
        "ferry died during the outage:\n{}",
        ferry.log_tail()
    );
    tokio::time::sleep((outage + SECS_10).saturating_duration_since(Instant::now())).await;

    mq.restart();
    assert!(
        backend.wait_subacks(2, SECS_10).await,
        "backend did not resubscribe after the restart"
    );
    assert_all_delivered(&mut devices, &ids, &mut receipts, Duration::from_secs(45)).await;

    let north = backend
        .messages_until(SECS_10, |all| distinct_north(all) == 153)
        .await;
    assert_eq!(distinct_north(&north), 153, "backend saw every message");
    let outage_ids: HashSet<(&str, &str)> = north
        .iter()
        .map(|m| (m.device(), m.msg_id()))
        .filter(|(_, id)| id.contains("-out"))
        .collect();
    assert_eq!(outage_ids.len(), 150, "backend saw every outage message");
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM dead_letter", []), 0);
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE state <> 'delivered'", []),
        0
    );
}

both_modes!(stored_messages_survive_a_sigkill_and_are_delivered_after_restart_with_their_seqs);
async fn stored_messages_survive_a_sigkill_and_are_delivered_after_restart_with_their_seqs(
    mode: Mode,
) {
    let mq = Mosquitto::start();
    let mut ferry = Ferry::start_in(mode, FerryOpts::new("gw-crash", mq.port));
    let boot = boot_id();

    let mut devices = Vec::new();
    let mut ids = Vec::new();
    for d in 0..2 {
        let device = Device::connect(ferry.south_port, &format!("crash-{d}")).await;
        ids.push(device.publish_many("t", &boot, "c", 25).await);
        devices.push(device);
    }
    let mut stored: HashMap<(String, String), u64> = HashMap::new();
    for device in devices.iter_mut() {
        let got = device
            .receipts_until(SECS_10, |all| ids_with_status(all, "stored") == 25)
            .await;
        assert_eq!(
            ids_with_status(&got, "stored"),
            25,
            "{}: {got:?}",
            device.id
        );
        for r in got.iter().filter(|r| status(r) == "stored") {
            let key = (device.id.clone(), r["msg_id"].as_str().unwrap().to_string());
            stored.insert(key, r["seq"].as_u64().expect("seq"));
        }
    }

    ferry.kill();
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE state = 'stored'", []),
        50,
        "every `stored` message is in the store after SIGKILL"
    );
    ferry.restart();
    // Devices of the embedded broker reconnect to the restarted ferry; a
    // site broker's devices stay connected to it.
    for device in devices.iter_mut().filter(|_| mode == Mode::Embedded) {
        assert!(
            device.wait_subacks(2, Duration::from_secs(15)).await,
            "{} did not reconnect to the restarted ferry",
            device.id
        );
    }
    let mut backend = Backend::connect_auto_ack(mq.port, "gw-crash").await;

    let deadline = Instant::now() + SECS_30;
    for (device, ids) in devices.iter_mut().zip(&ids) {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = device
            .receipts_until(left, |all| ids_with_status(all, "delivered") == 25)
            .await;
        assert_eq!(
            ids_with_status(&got, "delivered"),
            25,
            "{}: {got:?}",
            device.id
        );
        for r in &got {
            let key = (
                device.id.clone(),
                r["msg_id"].as_str().unwrap_or("").to_string(),
            );
            // A site broker sends again what ferry had committed but not
            // yet acknowledged when it was killed: those duplicates are
            // answered `stored` again, before their `delivered`.
            let expected: &[&str] = match mode {
                Mode::Embedded => &["delivered"],
                Mode::External => &["stored", "delivered"],
            };
            assert!(expected.contains(&status(r)), "{r}");
            assert_eq!(
                r["seq"].as_u64(),
                stored.get(&key).copied(),
                "seq kept: {r}"
            );
        }
        for id in ids {
            let mine = receipts_for(&got, id);
            let first_delivered = mine.iter().position(|r| status(r) == "delivered");
            assert!(
                first_delivered
                    .is_some_and(|at| mine[at..].iter().all(|r| status(r) == "delivered")),
                "{id}: receipts in state order: {mine:?}"
            );
        }
    }
    let north = backend
        .messages_until(SECS_10, |all| distinct_north(all) == 50)
        .await;
    assert_eq!(distinct_north(&north), 50);
    for m in &north {
        let key = (m.device().to_string(), m.msg_id().to_string());
        assert_eq!(m.seq(), stored.get(&key).copied(), "north seq for {key:?}");
    }
    assert_eq!(ferry.query_i64("SELECT COUNT(*) FROM uplink", []), 50);
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM (SELECT DISTINCT device, msg_id FROM uplink)",
            []
        ),
        50
    );

    // Seqs are never reused across a restart.
    let last = (0..25)
        .filter_map(|i| stored.get(&("crash-0".to_string(), ids[0][i].clone())))
        .max()
        .copied()
        .expect("crash-0 seqs");
    let fresh = format!("{boot}-after");
    devices[0].publish_envelope("t", &fresh, json!({})).await;
    let (r, _) = devices[0].next_receipt_for(&fresh, SECS_10).await;
    let r = r.expect("`stored` after the restart");
    assert_eq!(status(&r), "stored", "{r}");
    assert_eq!(r["seq"].as_u64(), Some(last + 1), "{r}");
}
