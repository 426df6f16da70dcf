//! The certificate recipe in docs/SECURITY.md, run as written: the test
//! takes the commands from the ```` ```sh recipe ```` block, runs them with
//! `sh -e` in a temp dir (openssl only), starts ferry with the files they
//! made (`south.tls`: server certificate, client CA, CRL), and connects as
//! a plant would: `mosquitto_rr` **by IP address** (libmosquitto then sends
//! "127.0.0.1" as SNI, which the embedded broker must not refuse) with the
//! device certificate, whose CN is the device id. The revoked device's
//! certificate is refused. Without a client CA, `--cafile` alone by IP
//! is `stored` too.

use std::path::Path;
use std::process::Command;

use crate::support::{Ferry, FerryOpts, Mosquitto};

/// The commands of the recipe block in docs/SECURITY.md.
fn recipe() -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/SECURITY.md"))
            .expect("read docs/SECURITY.md");
    let start = doc.find("```sh recipe\n").expect("a ```sh recipe block") + 13;
    let len = doc[start..].find("\n```\n").expect("the block's end");
    doc[start..start + len].to_owned()
}

/// Runs a Mosquitto client to its end: (exit code, stdout and stderr).
fn client(name: &str, dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = tokio::task::block_in_place(|| {
        Command::new(name)
            .current_dir(dir)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("start {name}: {e}"))
    });
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

/// `mosquitto_rr -V 5` by IP as device `id`, trusting `ca.pem`, with the
/// device's certificate (`id.pem`, `id.key`) when `with_cert`: the
/// uplink's receipt, or what went wrong.
fn uplink_by_ip(
    dir: &Path,
    port: u16,
    id: &str,
    msg_id: &str,
    with_cert: bool,
) -> (Option<i32>, String) {
    let envelope = serde_json::json!({"msg_id": msg_id, "payload": {"t": 1}}).to_string();
    let (up, ack) = (format!("devices/{id}/up/t"), format!("devices/{id}/ack"));
    let (cert, key, port) = (format!("{id}.pem"), format!("{id}.key"), port.to_string());
    let mut args = vec![
        "-V",
        "5",
        "-h",
        "127.0.0.1",
        "-p",
        &port,
        "--cafile",
        "ca.pem",
        "-i",
        id,
        "-q",
        "1",
        "-t",
        &up,
        "-e",
        &ack,
        "-m",
        &envelope,
        "-W",
        "5",
    ];
    if with_cert {
        args.extend(["--cert", cert.as_str(), "--key", key.as_str()]);
    }
    client("mosquitto_rr", dir, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_certificate_recipe_works_with_mosquitto_clients_by_ip_address() {
    let dir = tempfile::Builder::new()
        .prefix("ferry-recipe-")
        .tempdir()
        .expect("temp dir");
    let ran = Command::new("sh")
        .args(["-e", "-c", &recipe()])
        .current_dir(dir.path())
        .output()
        .expect("run sh");
    assert!(
        ran.status.success(),
        "the recipe failed: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let file = |name: &str| dir.path().join(name);
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-recipe", mq.port).with(|c| {
        c.south.tls.cert = file("server.pem");
        c.south.tls.key = file("server.key");
        c.south.tls.client_ca = file("ca.pem");
        c.south.tls.crl = file("crl.pem");
    }));

    let (code, out) = uplink_by_ip(dir.path(), ferry.south_port, "press-7", "recipe-1", true);
    assert_eq!(code, Some(0), "press-7 by IP: {out}");
    assert!(out.contains("\"stored\""), "no stored receipt: {out}");
    let stored: i64 = ferry
        .db()
        .query_row(
            "SELECT count(*) FROM uplink WHERE device = 'press-7' AND msg_id = 'recipe-1'",
            [],
            |r| r.get(0),
        )
        .expect("count the uplink");
    assert_eq!(stored, 1);

    // Without a client CA, a device with only --cafile, by IP.
    let open = Ferry::start(FerryOpts::new("gw-recipe-open", mq.port).with(|c| {
        c.south.tls.cert = file("server.pem");
        c.south.tls.key = file("server.key");
    }));
    let (code, out) = uplink_by_ip(dir.path(), open.south_port, "press-9", "recipe-3", false);
    assert_eq!(code, Some(0), "press-9 by IP, --cafile only: {out}");
    assert!(out.contains("\"stored\""), "no stored receipt: {out}");

    let (code, out) = uplink_by_ip(dir.path(), ferry.south_port, "press-8", "recipe-2", true);
    assert_ne!(code, Some(0), "the revoked press-8 connected: {out}");
    assert!(!out.contains("stored"), "{out}");
    // The refusal is logged by the connection's task, maybe after the
    // client has gone: wait for it, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !ferry.log().contains("client certificate refused") {
        assert!(std::time::Instant::now() < deadline, "no refusal logged");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        !ferry.log().contains("Illegal SNI hostname"),
        "{}",
        ferry.log_tail()
    );
}
