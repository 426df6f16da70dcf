//! The downlink at every protocol level the embedded broker speaks (MQTT
//! 3.1, 3.1.1, 5): a backlog stored while the device was away reaches it in
//! order, one batch per confirm, and each confirmed message is `delivered`
//! north; a device that speaks another level gets nothing different.

use super::*;
use crate::support::any_version::{AnyDevice, Level};

async fn a_backlog_reaches_the_device_in_confirmed_batches_and_is_delivered_north(level: Level) {
    const N: u64 = 12;
    let device = format!("dl-{level:?}").to_lowercase();
    let mq = Mosquitto::start();
    let ferry = Ferry::start(
        FerryOpts::new(&format!("gw-dl-{level:?}").to_lowercase(), mq.port)
            .with(|c| c.downlink.batch_size = 5),
    );
    let mut north = North::connect(mq.port, &ferry.gateway, NO_RESEND).await;
    let boot = boot_id();
    for i in 1..=N {
        north.send(&[&device], &format!("v-{boot}-{i:02}"), json!({"n": i}));
    }
    north
        .expect(SECS_30, "every downlink stored", |r| {
            count_with(r, "stored") == N as usize
        })
        .await;

    let mut dev = AnyDevice::connect(level, ferry.south_port, &device).await;
    let granted = dev
        .subscribe(&[
            format!("devices/{device}/ack"),
            format!("devices/{device}/inbox"),
        ])
        .await;
    assert_eq!(granted, vec![true, true], "{level:?}");
    let mut next = 1u64;
    while next <= N {
        let (topic, body) = dev
            .next_message(SECS_30)
            .await
            .unwrap_or_else(|| panic!("{level:?}: no batch from seq {next}"));
        assert_eq!(topic, format!("devices/{device}/inbox"));
        let batch: Value = serde_json::from_slice(&body).unwrap();
        let seqs = batch_seqs(&batch);
        assert!(seqs.len() <= 5, "{level:?}: {batch}");
        assert_eq!(seqs[0], next, "{level:?}: in order, from the cursor");
        next = *seqs.last().unwrap() + 1;
        let confirm = serde_json::to_vec(&json!({"upto": next - 1})).unwrap();
        dev.publish(&format!("devices/{device}/confirm"), confirm)
            .await;
    }
    north
        .expect(SECS_30, "every downlink delivered", |r| {
            count_with(r, "delivered") == N as usize
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_reaches_an_mqtt_31_device_in_confirmed_batches_and_is_delivered_north() {
    a_backlog_reaches_the_device_in_confirmed_batches_and_is_delivered_north(Level::V31).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_reaches_an_mqtt_311_device_in_confirmed_batches_and_is_delivered_north() {
    a_backlog_reaches_the_device_in_confirmed_batches_and_is_delivered_north(Level::V311).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_reaches_an_mqtt_5_device_in_confirmed_batches_and_is_delivered_north() {
    a_backlog_reaches_the_device_in_confirmed_batches_and_is_delivered_north(Level::V5).await;
}
