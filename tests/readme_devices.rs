//! The README's "Devices as they are", followed as written: its
//! `devices-config` and `devices-sparkplug-config` blocks are the
//! gateway's `[south]` (ports made free), `devices-plain-pub`,
//! `devices-plain-down` and `devices-sparkplug` run with `sh -e` as a
//! plant engineer would paste them (Mosquitto's clients and the Sparkplug
//! example node; 1883, 8083 and 1884 swapped for the test's ports, and the
//! test's own build of the example for `cargo run --release --example`),
//! and the `devices-mqttjs` page runs in headless Chromium with MQTT.js
//! from tests/js (the npm registry's, in place of the page's CDN address).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::quickstart::fenced;
use crate::support::chromium::render_loaded;
use crate::support::receipts::eventually;
use crate::support::{listener, Backend, Ferry, FerryOpts, Mosquitto};

const SECS_20: Duration = Duration::from_secs(20);
const GATEWAY: &str = "edge-01";
const CDN: &str = "https://unpkg.com/mqtt@5.16.0/dist/mqtt.min.js";

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md")
}

/// Runs `script` with `sh -e` to its end, within 20 s: its output, after
/// checking it succeeded.
async fn sh(script: &str) -> String {
    let mut child = Command::new("sh")
        .args(["-e", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sh");
    let started = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > SECS_20 {
            let _ = child.kill();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = tokio::task::block_in_place(|| child.wait_with_output()).expect("output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "`{script}` failed ({}): {said}",
        out.status
    );
    said
}

fn port_of(listen: &str) -> String {
    listen.rsplit_once(':').expect("ADDR:PORT").1.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_devices_as_they_are_run_as_written() {
    for tool in ["mosquitto_pub", "mosquitto_sub"] {
        assert!(
            Path::new("/usr/bin").join(tool).is_file(),
            "the README's examples need {tool}: install it with `apt-get install -y \
             mosquitto-clients` (or run ./scripts/test.sh, which does)"
        );
    }
    let doc = readme();
    let south: toml::Table = toml::from_str(&fenced(&doc, "toml", "devices-config"))
        .expect("the devices-config block is TOML");
    let str_of = |v: &toml::Value| v.as_str().expect("a string").to_string();
    let spb: toml::Table = toml::from_str(&fenced(&doc, "toml", "devices-sparkplug-config"))
        .expect("the devices-sparkplug-config block is TOML");
    let spb_enabled = spb["south"]["sparkplug"]["enabled"]
        .as_bool()
        .expect("south.sparkplug.enabled");
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new(GATEWAY, mq.port).with(|c| {
        c.south.listeners = south["listeners"]
            .as_array()
            .expect("listeners")
            .iter()
            .map(|l| {
                let mut raw = listener("127.0.0.1:0", &str_of(&l["transport"]));
                raw.path = l.get("path").map(str_of).unwrap_or_default();
                raw
            })
            .collect();
        c.south.plain_topics = south["plain_topics"]
            .as_array()
            .expect("plain_topics")
            .iter()
            .map(str_of)
            .collect();
        c.south.plain_down = Some(str_of(&south["plain_down"]));
        c.south.sparkplug.enabled = spb_enabled;
    }));
    let (tcp, ws) = (
        port_of(&ferry.config.south.listeners[0].listen),
        port_of(&ferry.config.south.listeners[1].listen),
    );
    let swap = |text: String| {
        text.replace("1883", &tcp)
            .replace("8083", &ws)
            .replace("1884", &mq.port.to_string())
    };
    let mut backend = Backend::connect_auto_ack(mq.port, GATEWAY).await;

    sh(&swap(fenced(&doc, "sh", "devices-plain-pub"))).await;
    let got = backend
        .messages_until(SECS_20, |all| {
            all.iter().any(|m| m.topic.ends_with("/up/press-7/plain"))
        })
        .await;
    let m = got
        .iter()
        .find(|m| m.topic.ends_with("/up/press-7/plain"))
        .unwrap_or_else(|| panic!("the plain value north: {got:?}"));
    assert_eq!(m.body["topic"], "plant/line3/press-7/temp", "{}", m.body);
    assert_eq!(m.body["payload"], 81.5, "{}", m.body);

    let out = sh(&swap(fenced(&doc, "sh", "devices-plain-down"))).await;
    assert!(out.contains("plant/cmd/valve-3 OPEN"), "{out}");
    eventually(SECS_20, "the command is delivered", || {
        ferry.query_i64(
            "SELECT COUNT(*) FROM down_delivery WHERE device = 'valve-3' AND state = 'delivered'",
            [],
        ) == 1
    })
    .await;

    // The Sparkplug node, the test's build of the example for `cargo run`.
    let node = example("sparkplug_node");
    let script = fenced(&doc, "sh", "devices-sparkplug");
    let cargo_run = "cargo run --release --example sparkplug_node --";
    assert!(script.contains(cargo_run), "{script}");
    let out = sh(&swap(
        script.replace(cargo_run, &node.display().to_string()),
    ))
    .await;
    for line in [
        "NBIRTH seq 0 bdSeq 0: stored",
        "NDATA seq 3 temp 21.5: stored",
        "NDEATH bdSeq 0: stored",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    let got = backend
        .messages_until(SECS_20, |all| {
            all.iter()
                .filter(|m| m.topic.ends_with("/up/line3-edge/spb"))
                .count()
                >= 5
        })
        .await;
    let mut kinds: Vec<(u64, String)> = got
        .iter()
        .filter(|m| m.topic.ends_with("/up/line3-edge/spb"))
        .map(|m| {
            let kind = m.body["sparkplug"]["message_type"].as_str().unwrap_or("?");
            (m.body["seq"].as_u64().unwrap_or(0), kind.to_string())
        })
        .collect();
    kinds.dedup();
    let kinds: Vec<&str> = kinds.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["NBIRTH", "NDATA", "NDATA", "NDATA", "NDEATH"],
        "{got:?}"
    );

    let mqtt_js =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/node_modules/mqtt/dist/mqtt.min.js");
    assert!(
        mqtt_js.is_file(),
        "the page needs MQTT.js in tests/js/node_modules: run `npm ci` in tests/js \
         (or ./scripts/test.sh, which does)"
    );
    let page = swap(fenced(&doc, "html", "devices-mqttjs"));
    assert!(page.contains(CDN), "the page loads MQTT.js from {CDN}");
    // Served by the test over HTTP, MQTT.js from tests/js in place of the
    // CDN's. Headless Chromium dumps the page once it has loaded, which a
    // WebSocket does not hold back: an iframe the test answers only once
    // the panel's note is `delivered` (and a moment more, for the receipt
    // to reach the page) keeps it loading.
    let page = page
        .replace(CDN, "/mqtt.min.js")
        .replace("</body>", "<iframe src=\"/hold\"></iframe></body>");
    let script = std::fs::read(&mqtt_js).expect("read mqtt.min.js");
    let web = serve(page, script, ferry.data_dir.join("ferry.db"));
    let dom = tokio::task::block_in_place(|| render_loaded(&format!("http://127.0.0.1:{web}/")));
    let log = dom
        .split_once("<pre id=\"log\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(log, _)| log)
        .unwrap_or_else(|| panic!("no log on the page: {dom}"));
    let statuses: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| {
            r["msg_id"]
                .as_str()
                .is_some_and(|id| id.starts_with("panel-1-"))
        })
        .filter_map(|r| r["status"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        statuses,
        ["stored", "delivered"],
        "the page's receipts: {log}"
    );
    assert_eq!(
        ferry.query_i64("SELECT COUNT(*) FROM uplink WHERE device = 'panel-1'", []),
        1,
        "the panel's note stored once"
    );
}

/// A small HTTP server on a free port for the page: `/` is `page`,
/// `/mqtt.min.js` is `script`, and `/hold` answers only once the store at
/// `db` has panel-1's note delivered (at most 20 s), then half a second
/// more. It lives as long as the test process; each request is a thread.
fn serve(page: String, script: Vec<u8>, db: std::path::PathBuf) -> u16 {
    use std::io::{Read, Write};
    let server = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the page server");
    let port = server.local_addr().expect("its port").port();
    let page = std::sync::Arc::new(page.into_bytes());
    let script = std::sync::Arc::new(script);
    std::thread::spawn(move || {
        for conn in server.incoming().take(16) {
            let Ok(mut conn) = conn else { continue };
            let (page, script, db) = (page.clone(), script.clone(), db.clone());
            std::thread::spawn(move || {
                let mut request = [0u8; 2048];
                let n = conn.read(&mut request).unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..n]);
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (kind, body): (&str, &[u8]) = match path.as_str() {
                    "/" => ("text/html", page.as_slice()),
                    "/mqtt.min.js" => ("text/javascript", script.as_slice()),
                    "/hold" => {
                        hold(&db);
                        ("text/plain", b"")
                    }
                    _ => ("text/plain", b""),
                };
                let status = if path == "/" || path == "/mqtt.min.js" || path == "/hold" {
                    "200 OK"
                } else {
                    "404 Not Found"
                };
                let _ = conn.write_all(
                    format!(
                        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n",
                        body.len()
                    )
                    .as_bytes(),
                );
                let _ = conn.write_all(body);
            });
        }
    });
    port
}

/// Waits until panel-1's note is delivered in the store at `db` (at most
/// 20 s), then half a second more.
fn hold(db: &Path) {
    let started = std::time::Instant::now();
    let delivered = || {
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|c| {
                c.query_row(
                    "SELECT COUNT(*) FROM uplink WHERE device = 'panel-1' AND state = 'delivered'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .unwrap_or(0)
            == 1
    };
    while !delivered() && started.elapsed() < SECS_20 {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
}

/// The build of example `name` that `cargo build --examples` made: the
/// newest executable under target/debug/examples named `name` or
/// `name-HASH` whose `--help` starts with its own usage (the test harness
/// build `cargo test --examples` makes of it would not).
fn example(name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = crate::support::ferry_binary()
        .parent()
        .expect("target/debug")
        .join("examples");
    let mut found: Vec<(std::time::SystemTime, std::path::PathBuf)> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            let file = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
            let named = file == name
                || file
                    .strip_prefix(name)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|hash| hash.bytes().all(|b| b.is_ascii_hexdigit()));
            named
                && p.metadata()
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    found.sort();
    found
        .into_iter()
        .rev()
        .map(|(_, p)| p)
        .find(|p| {
            Command::new(p)
                .arg("--help")
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).starts_with(&format!("{name} [")))
        })
        .unwrap_or_else(|| {
            panic!(
                "no build of examples/{name}.rs in {}: run `cargo build --examples` \
                 (./scripts/test.sh does; cargo test builds examples as test harnesses only)",
                dir.display()
            )
        })
}
