//! MQTT.js over WebSocket, as a browser panel or a Node dashboard
//! connects (`south.listeners`, transport "ws", path `/mqtt`): its publish
//! is stored, sent north and answered `stored` and `delivered` over the
//! WebSocket. The client is MQTT.js from the npm registry, installed in
//! tests/js by ./scripts/test.sh (`npm ci`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::{boot_id, Backend, Ferry, FerryOpts, Mosquitto};

fn js_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js")
}

/// Node and MQTT.js, or a panic saying how to get them.
fn require_mqtt_js() -> PathBuf {
    let node = ["/usr/bin/node", "/usr/local/bin/node"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect(
            "the WebSocket test needs Node.js: install it with `apt-get install -y nodejs npm` \
             (or run ./scripts/test.sh, which does)",
        );
    assert!(
        js_dir().join("node_modules/mqtt/package.json").is_file(),
        "the WebSocket test needs MQTT.js in tests/js/node_modules: run `npm ci` in tests/js \
         (or ./scripts/test.sh, which does)"
    );
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_js_over_websocket_stores_and_gets_its_receipts() {
    let node = require_mqtt_js();
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-mqttjs", mq.port).with(|c| {
        c.south.listeners = vec![crate::support::listener("127.0.0.1:0", "ws")];
    }));
    let _backend = Backend::connect_auto_ack(mq.port, "gw-mqttjs").await;
    let msg_id = format!("{}-js", boot_id());
    let port = ferry.south_port.to_string();
    let script = js_dir().join("ws_device.mjs");
    let out = tokio::task::spawn_blocking({
        let msg_id = msg_id.clone();
        move || {
            Command::new(node)
                .arg(script)
                .args([port.as_str(), "panel-js", msg_id.as_str()])
                .output()
                .expect("run node")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let r: Value = serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "no JSON line from MQTT.js ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(r["connack"], 0, "{r}");
    assert!(r["error"].is_null() && r["timeout"].is_null(), "{r}");
    let statuses: Vec<&str> = r["receipts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["msg_id"] == msg_id.as_str())
        .filter_map(|v| v["status"].as_str())
        .collect();
    assert_eq!(statuses, ["stored", "delivered"], "{r}");
    assert_eq!(
        ferry.query_i64(
            "SELECT COUNT(*) FROM uplink WHERE device = 'panel-js' AND msg_id = ?1",
            [&msg_id]
        ),
        1
    );
}
