//! The certificate recipe in docs/SECURITY.md, run as written but for its
//! two first lines: the gateway's name and address become `ferry-gw.test`
//! and 127.0.0.2 (an address no other test uses, and not the `localhost`
//! the recipe once hard-coded). The test runs the ```` ```sh recipe ````
//! block with `sh -e` in a temp dir (openssl only), starts ferry with the
//! files it made (`south.tls`: server certificate, client CA, CRL) on a
//! TLS listener at 127.0.0.2, and connects as a plant would:
//! `mosquitto_rr` **by IP address** (libmosquitto then sends the IP as
//! SNI, which the embedded broker must not refuse) with the device
//! certificate, whose CN is the device id. The revoked device's
//! certificate is refused. Without a client CA, `--cafile` alone by IP is
//! `stored` too, and `openssl s_client` verifies the certificate by its
//! name, and refuses it for `localhost`.

use std::path::Path;
use std::process::Command;

use crate::support::{Ferry, FerryOpts, Mosquitto};

/// The gateway's name and address the test gives the recipe.
const GW_DNS: &str = "ferry-gw.test";
const GW_IP: &str = "127.0.0.2";

/// The commands of the recipe block in docs/SECURITY.md, with the test's
/// name and address on its `GW_DNS=` and `GW_IP=` lines.
fn recipe() -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/SECURITY.md"))
            .expect("read docs/SECURITY.md");
    let start = doc.find("```sh recipe\n").expect("a ```sh recipe block") + 13;
    let len = doc[start..].find("\n```\n").expect("the block's end");
    let block = &doc[start..start + len];
    let mut set = (false, false);
    let lines: Vec<String> = block
        .lines()
        .map(|l| {
            if l.starts_with("GW_DNS=") {
                set.0 = true;
                format!("GW_DNS={GW_DNS}")
            } else if l.starts_with("GW_IP=") {
                set.1 = true;
                format!("GW_IP={GW_IP}")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert_eq!(
        set,
        (true, true),
        "the recipe sets GW_DNS and GW_IP: {block}"
    );
    lines.join("\n")
}

/// Ferry's TLS listeners for the recipe's files: one on 127.0.0.1 (the
/// harness checks readiness there), one on the recipe's address.
fn listeners() -> Vec<ferry::config::RawListener> {
    vec![
        crate::support::listener("127.0.0.1:0", "tls"),
        crate::support::listener(&format!("{GW_IP}:0"), "tls"),
    ]
}

fn port_at(ferry: &Ferry, i: usize) -> u16 {
    let listen = &ferry.config.south.listeners[i].listen;
    listen
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("a port")
}

/// `openssl s_client` to 127.0.0.1:`port` checking the certificate for
/// `name` against `ca.pem`: whether it verified.
fn verifies_as(dir: &Path, port: u16, name: &str) -> (bool, String) {
    let out = tokio::task::block_in_place(|| {
        Command::new("openssl")
            .current_dir(dir)
            .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
            .args(["-servername", name, "-verify_hostname", name])
            .args(["-CAfile", "ca.pem", "-verify_return_error", "-brief"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run openssl s_client")
    });
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (
        out.status.success() && text.contains("Verification: OK"),
        text,
    )
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
        "-V", "5", "-h", GW_IP, "-p", &port, "--cafile", "ca.pem", "-i", id, "-q", "1", "-t", &up,
        "-e", &ack, "-m", &envelope, "-W", "5",
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
        c.south.listeners = listeners();
    }));

    let (code, out) = uplink_by_ip(dir.path(), port_at(&ferry, 1), "press-7", "recipe-1", true);
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
        c.south.listeners = listeners();
    }));
    let (code, out) = uplink_by_ip(dir.path(), port_at(&open, 1), "press-9", "recipe-3", false);
    assert_eq!(code, Some(0), "press-9 by IP, --cafile only: {out}");
    assert!(out.contains("\"stored\""), "no stored receipt: {out}");
    let (ok, said) = verifies_as(dir.path(), open.south_port, GW_DNS);
    assert!(ok, "the certificate verifies for its name {GW_DNS}: {said}");
    let (ok, said) = verifies_as(dir.path(), open.south_port, "localhost");
    assert!(!ok, "and not for localhost: {said}");

    let (code, out) = uplink_by_ip(dir.path(), port_at(&ferry, 1), "press-8", "recipe-2", true);
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
