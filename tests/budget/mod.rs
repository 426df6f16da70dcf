//! The disk budget and the dead letters as shared resources, against the
//! real binary and a real Mosquitto: one peer's refusals fill only its own
//! share of the dead letters (`shares`), a resend is answered as the
//! duplicate it is at the budget, in both directions (`duplicates`), and
//! the store does not overshoot the budget between two measures
//! (`overshoot`).

mod duplicates;
mod overshoot;
mod shares;

use std::time::Duration;

use serde_json::Value;

use crate::support::Device;

fn reason(r: &Value) -> &str {
    r["reason"].as_str().unwrap_or("")
}

/// The receipt for `msg_id`, or a panic naming it.
async fn receipt(device: &mut Device, msg_id: &str) -> Value {
    let (r, _) = device
        .next_receipt_for(msg_id, Duration::from_secs(15))
        .await;
    r.unwrap_or_else(|| panic!("no receipt for {msg_id}"))
}
