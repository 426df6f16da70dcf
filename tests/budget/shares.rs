//! A device flooding malformed envelopes, and a backend sending junk
//! downlinks, each fill only their own share of the dead letters: every
//! other device is still stored, and what a dead letter keeps is bounded.

use std::time::Duration;

use serde_json::json;

use super::{reason, receipt};
use crate::support::receipts::eventually;
use crate::support::{self, boot_id, north_topics, Backend, BareClient, Device, Ferry, FerryOpts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_flooding_refusals_fills_its_own_share_and_every_other_device_is_still_stored() {
    let mosquitto = support::Mosquitto::start();
    let budget: u64 = 8 << 20;
    let opts = FerryOpts::new("gw-shares", mosquitto.port).with(|c| {
        c.store.max_db_bytes = budget;
        c.store.dead_letter_share_rows = 20;
    });
    let ferry = Ferry::start(opts);
    let mut flooder = Device::connect(ferry.south_port, "flooder").await;
    let mut other = Device::connect(ferry.south_port, "press-2").await;
    let boot = boot_id();

    // A bad topic of 10,000 bytes: its dead letter keeps the first 1 KiB.
    let long = "x".repeat(10_000);
    flooder
        .publish_raw(&format!("devices/flooder/up/{long}"), b"{}".to_vec())
        .await;
    let r = flooder
        .next_receipt(Duration::from_secs(10))
        .await
        .expect("a receipt for the bad topic");
    assert_eq!(r["status"], "rejected", "{r}");
    let (topic_len, topic_bytes) = {
        let db = ferry.db();
        db.query_row(
            "SELECT length(topic), topic_bytes FROM dead_letter ORDER BY id LIMIT 1",
            [],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
        )
        .expect("the bad topic's dead letter")
    };
    assert_eq!((topic_len, topic_bytes), (1024, 10_019));

    // 300 malformed envelopes of 60 kB (no payload): 18 MB of refusals,
    // more than twice the budget, at 100 a second (within its rate).
    let junk = "j".repeat(60_000);
    let flood: Vec<String> = (0..300).map(|i| format!("{boot}-f{i:03}")).collect();
    let mut dead_letters = Vec::new();
    for chunk in flood.chunks(10) {
        for id in chunk {
            let body = serde_json::to_vec(&json!({ "msg_id": id, "junk": junk })).unwrap();
            flooder.publish_raw(&flooder.up_topic("t"), body).await;
        }
        for id in chunk {
            let r = receipt(&mut flooder, id).await;
            assert_eq!(r["status"], "rejected", "{r}");
            assert!(reason(&r).starts_with("malformed: "), "{r}");
            dead_letters.push(r["dead_letter"].as_i64().expect("a dead letter id"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // 19 rows of its own (the bad topic was the 20th), then one summary
    // for all the rest.
    let summary = dead_letters[19];
    assert!(dead_letters[..19].iter().all(|id| *id != summary));
    assert!(
        dead_letters[19..].iter().all(|id| *id == summary),
        "{dead_letters:?}"
    );

    // Everyone else is served.
    for i in 0..5 {
        let id = format!("{boot}-ok{i}");
        other.publish_envelope("t", &id, json!({ "i": i })).await;
        let r = receipt(&mut other, &id).await;
        assert_eq!(r["status"], "stored", "{r}\n{}", ferry.log_tail());
    }
    assert_eq!(ferry.admin_get("/readyz").0, 200);

    // What the dead letters hold is bounded: 20 rows of at most 4 KiB of
    // payload each, and the summary counting the other 281.
    assert_eq!(ferry.query_i64("SELECT count(*) FROM dead_letter", []), 21);
    assert!(
        ferry.query_i64("SELECT max(length(raw)) FROM dead_letter", []) <= 4096,
        "a dead letter kept more than its head"
    );
    assert_eq!(
        ferry.query_i64(
            "SELECT count(*) FROM dead_letter WHERE raw_bytes > 60000 AND length(raw_sha256) = 64",
            []
        ),
        20,
        "each malformed one keeps its size and hash"
    );
    assert_eq!(
        ferry.query_i64("SELECT refusals FROM dead_letter WHERE id = ?1", [summary]),
        281
    );
    let log = ferry.log();
    assert_eq!(
        log.matches("event=\"dead_letter_share_full\"").count()
            + log.matches("event=dead_letter_share_full").count(),
        1,
        "{}",
        ferry.log_tail()
    );
    assert!(log.contains("device:flooder"), "{}", ferry.log_tail());
    let m = ferry.metrics();
    assert_eq!(m.value("ferry_refusals_summarised_total"), 281.0);
    assert_eq!(
        m.value(r#"ferry_messages_rejected_total{direction="up",reason="malformed"}"#),
        300.0
    );
    // `ferry dlq show` says what was kept of what was sent.
    let (code, text, err) =
        crate::ops::cli(&ferry.config_path, &["dlq", "show", &summary.to_string()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(text.contains("281 (summary"), "{text}");
    assert!(text.contains("the first 4096 of 60"), "{text}");
    assert!(text.contains("sha256 "), "{text}");
    // `ferry status` names whose refusals they are.
    let (code, text, err) = crate::ops::cli(&ferry.config_path, &["status"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(text.contains("device:flooder: 20 rows"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_sending_junk_downlinks_fills_its_own_share_and_a_good_downlink_is_still_stored()
{
    let mosquitto = support::Mosquitto::start();
    let budget: u64 = 4 << 20;
    let opts = FerryOpts::new("gw-junk", mosquitto.port).with(|c| {
        c.store.max_db_bytes = budget;
        c.store.dead_letter_share_rows = 5;
    });
    let ferry = Ferry::start(opts);
    let backend = Backend::connect(mosquitto.port, "gw-junk").await;
    let mut receipts = BareClient::connect(
        mosquitto.port,
        "junk-receipts",
        vec![north_topics("gw-junk").receipts()],
    )
    .await;
    let boot = boot_id();
    // Ten downlinks of 500 kB without a recipient: 5 MB of refusals, more
    // than the budget.
    let junk = "j".repeat(500_000);
    for i in 0..10 {
        let body = json!({ "msg_id": format!("{boot}-junk{i}"), "payload": junk });
        backend
            .publish_raw("ferry/gw-junk/down", serde_json::to_vec(&body).unwrap())
            .await;
        let r = receipts
            .next_json(Duration::from_secs(15))
            .await
            .unwrap_or_else(|| panic!("no receipt for junk {i}\n{}", ferry.log_tail()));
        assert_eq!(r["status"], "rejected", "{r}");
        assert!(
            reason(&r).starts_with("malformed: ") || reason(&r).starts_with("too_large: "),
            "{r}"
        );
    }
    // Five rows of its own, then one summary of the other five.
    assert_eq!(ferry.query_i64("SELECT count(*) FROM dead_letter", []), 6);
    assert_eq!(
        ferry.query_i64("SELECT max(refusals) FROM dead_letter", []),
        5
    );
    assert!(ferry.query_i64("SELECT max(length(raw)) FROM dead_letter", []) <= 4096);
    // A good downlink is stored.
    let id = format!("{boot}-good");
    backend
        .publish_raw(
            "ferry/gw-junk/down/panel-1",
            serde_json::to_vec(&json!({ "msg_id": id, "payload": "shift B" })).unwrap(),
        )
        .await;
    let r = receipts
        .next_json(Duration::from_secs(15))
        .await
        .expect("a receipt for the good downlink");
    assert_eq!(
        (r["status"].as_str(), r["msg_id"].as_str()),
        (Some("stored"), Some(id.as_str())),
        "{r}"
    );
    eventually(Duration::from_secs(10), "/readyz 200", || {
        ferry.admin_get("/readyz").0 == 200
    })
    .await;
    let (code, text, err) = crate::ops::cli(&ferry.config_path, &["status", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let s: serde_json::Value = serde_json::from_str(&text).expect("status JSON");
    assert_eq!(s["dead_letter_top"][0]["share"], "backend", "{s}");
    assert_eq!(s["dead_letter_top"][0]["summarised"], 5, "{s}");
}
