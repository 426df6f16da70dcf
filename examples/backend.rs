//! A backend on ferry's client library: acks every uplink after
//! "committing" it, sends one downlink and prints its receipts.
//!
//! cargo run --example backend -- [upstream_port] [gateway_id] [device_id]

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let port = args.next().and_then(|p| p.parse().ok()).unwrap_or(1884);
    let gateway = args.next().unwrap_or_else(|| "edge-01".into());
    let device = args.next().unwrap_or_else(|| "press-7".into());
    let mut backend = BackendClient::connect(BackendOptions::new("127.0.0.1", port, gateway));
    let msg_id = format!("order-{}", std::process::id());
    backend.send_down(
        &[&device],
        serde_json::json!({"msg_id": msg_id, "payload": "shift B starts 14:00"}),
    );
    while let Some(event) = backend.events.recv().await {
        match event {
            BackendEvent::Uplink(m) => {
                println!("uplink: {m}");
                // Commit to the backend's database here, then ack.
                if let (Some(d), Some(id)) = (m["device"].as_str(), m["msg_id"].as_str()) {
                    backend.ack_ok(d, id);
                }
            }
            BackendEvent::Receipt(r) => println!("receipt: {r}"),
            other => println!("{other:?}"),
        }
    }
}
