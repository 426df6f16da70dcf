//! Plain devices (`south.plain_topics`): a stock `mosquitto_pub`, which
//! knows nothing of envelopes, publishes on a plant's own topic tree and
//! its PUBACK/PUBCOMP is its `stored`; the backend reads each publish
//! once per msg_id, under the device the topic names, on stream `plain`.

use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use super::runner::tool;
use super::{v, Gw};

const SECS_10: Duration = Duration::from_secs(10);
const SECS_20: Duration = Duration::from_secs(20);

/// QoS 0, 1 and 2 from `mosquitto_pub` on `plant/line3/{device}/temp`,
/// one a JSON number and one text that is not JSON (carried base64): each
/// stored once under `device`, north on stream `plain` with its topic and
/// QoS, in the order sent; the tool exits 0 (it got its PUBACK/PUBCOMP).
async fn mosquitto_pub_as_a_plain_device(level: &str) {
    let mut gw = Gw::start("gw-plain", |o| {
        o.with(|c| c.south.plain_topics = vec!["plant/+/{device}/#".to_string()])
    })
    .await;
    let device = format!("press-{level}");
    let topic = format!("plant/line3/{device}/temp");
    let port = gw.port().to_string();
    let sent: [(&str, &str); 3] = [("0", "21.5"), ("1", "not json"), ("2", "{\"t\":22}")];
    for (qos, body) in sent {
        let (status, out, err) = tool(
            "mosquitto_pub",
            &[
                "-V",
                v(level),
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-i",
                &format!("tool-{level}"),
                "-q",
                qos,
                "-t",
                &topic,
                "-m",
                body,
            ],
            SECS_10,
        )
        .await;
        assert_eq!(status, Some(0), "mosquitto_pub -q {qos}: {out}{err}");
    }
    let got = gw
        .backend
        .messages_until(SECS_20, |all| {
            let mut ids: Vec<&str> = all.iter().map(|m| m.msg_id()).collect();
            ids.dedup();
            ids.len() >= 3
        })
        .await;
    let mut firsts: Vec<&Value> = Vec::new();
    for m in &got {
        assert!(
            m.topic.ends_with(&format!("/up/{device}/plain")),
            "north topic {}: {}",
            m.topic,
            m.body
        );
        if !firsts.iter().any(|f| f["msg_id"] == m.body["msg_id"]) {
            firsts.push(&m.body);
        }
    }
    assert_eq!(firsts.len(), 3, "three plain publishes north: {got:?}");
    for (i, (qos, body)) in sent.iter().enumerate() {
        let m = firsts[i];
        let text = m.to_string();
        assert_eq!(m["device"], device.as_str(), "{text}");
        assert_eq!(m["topic"], topic.as_str(), "{text}");
        assert_eq!(m["qos"].as_u64(), qos.parse::<u64>().ok(), "{text}");
        assert_eq!(m["seq"].as_u64(), Some(i as u64 + 1), "{text}");
        match serde_json::from_str::<Value>(body) {
            Ok(json) => assert_eq!(m["payload"], json, "{text}"),
            Err(_) => {
                let b64 = base64::engine::general_purpose::STANDARD.encode(body);
                assert_eq!(m["payload_b64"], b64.as_str(), "{text}")
            }
        }
        let msg_id = m["msg_id"].as_str().expect("msg_id");
        assert!(msg_id.starts_with("p."), "{text}");
        assert_eq!(gw.stored(&device, msg_id), 1, "{msg_id} stored once");
    }
}

at_levels!(mosquitto_pub_as_a_plain_device: v31 => "31", v311 => "311", v5 => "5");
