//! A backend on ferry's client library: acks every uplink after
//! "committing" it, sends one downlink and prints its receipts.
//!
//! cargo run --example backend -- [upstream_port] [gateway_id] [device_id]

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};
use ferry::ids::MsgId;
use ferry::protocol::envelope::WireEnvelope;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port = args.next().and_then(|p| p.parse().ok()).unwrap_or(1884);
    let gateway = args.next().unwrap_or_else(|| "edge-01".into());
    let device = args.next().unwrap_or_else(|| "press-7".into());
    let mut backend = BackendClient::try_connect(BackendOptions::new("127.0.0.1", port, gateway))?;
    let order = WireEnvelope::json(
        MsgId::new(format!("order-{}", std::process::id()))?,
        serde_json::json!("shift B starts 14:00"),
    );
    backend.send_downlink(&[&device], order);
    while let Some(event) = backend.events.recv().await {
        match event {
            BackendEvent::Uplink(message) => {
                println!(
                    "uplink #{} from {} on {}: {:?}",
                    message.seq, message.device, message.stream, message.envelope.payload
                );
                // Commit to the backend's database here, then ack.
                backend.ack_message(&message);
            }
            BackendEvent::Receipt(r) => println!(
                "receipt: {} for {:?} at {:?}: {}",
                r.status,
                r.msg_id,
                r.device,
                r.reason.unwrap_or_default()
            ),
            other => println!("{other:?}"),
        }
    }
    Ok(())
}
