//! A device on ferry's client library: sends a reading, prints receipts,
//! and takes its inbox, confirming each batch after "committing" it.
//!
//! cargo run --example device -- [south_port] [device_id]

use ferry::client::device::{DeviceClient, DeviceEvent, DeviceOptions};
use ferry::ids::MsgId;
use ferry::protocol::envelope::WireEnvelope;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port = args.next().and_then(|p| p.parse().ok()).unwrap_or(1883);
    let id = args.next().unwrap_or_else(|| "press-7".into());
    let mut device = DeviceClient::try_connect(DeviceOptions::new("127.0.0.1", port, id))?;
    let boot = std::process::id();
    let mut reading = WireEnvelope::json(
        MsgId::new(format!("{boot}-1"))?,
        serde_json::json!({"temp": 81.5}),
    );
    reading.ts = Some(ferry::protocol::now_ms());
    device.send_envelope("line3/temp", &reading);
    while let Some(event) = device.events.recv().await {
        match event {
            DeviceEvent::Receipt(r) => println!(
                "receipt: {:?} {:?} seq {:?} {}",
                r.msg_id.map(|m| m.to_string()),
                r.status,
                r.seq.map(|s| s.0),
                r.reason.unwrap_or_default()
            ),
            DeviceEvent::Inbox {
                messages,
                more,
                duplicates,
            } => {
                for m in &messages {
                    println!(
                        "inbox #{} {}: {}",
                        m.seq,
                        m.msg_id,
                        m.body
                            .as_ref()
                            .map_or("(tombstone)".into(), |b| b.to_string())
                    );
                }
                // Commit to local storage here, then confirm.
                if let Some(last) = messages.last() {
                    device.confirm(last.seq);
                }
                println!(
                    "({} new, {duplicates} duplicates dropped, more: {more})",
                    messages.len()
                );
            }
            other => println!("{other:?}"),
        }
    }
    Ok(())
}
