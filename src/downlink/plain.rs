//! Plain devices' downlinks (`south.plain_down`, docs/PROTOCOL.md "Plain
//! downlinks"): a device that subscribed to its command topic is sent its
//! downlinks one at a time, in seq order, as the bare payload at QoS 1,
//! each tagged with its seq; its PUBACK, reported by the broker, moves its
//! cursor like a `confirm`, committed before the `delivered` receipt goes
//! north.

use tracing::{info, warn};

use super::Downlink;
use crate::ids::{DeviceId, Seq};
use crate::protocol::now_ms;
use crate::protocol::plain_down::raw_payload;
use crate::state::DeliveryState;
use crate::store::record::downlink::{reason, BatchEntry};

impl Downlink {
    /// Sends what a read brought for a plain device (one entry, the
    /// scheduler's batch for it). An entry that expired or was
    /// dead-lettered while it waited is not sent: the cursor moves past
    /// it (its receipt went north when it changed state). One whose body
    /// has nothing to send bare is dead-lettered with a reason.
    pub(super) async fn send_plain(&mut self, device: &DeviceId, entries: &[BatchEntry]) {
        let Some(topic) = self.settings.plain_down.as_ref().map(|d| d.topic(device)) else {
            return;
        };
        for entry in entries {
            let payload = match entry.state {
                DeliveryState::Stored | DeliveryState::Delivered | DeliveryState::Read => {
                    entry.body.as_deref().map(raw_payload)
                }
                DeliveryState::Expired | DeliveryState::Dead => None,
            };
            match payload {
                Some(Some(payload)) => {
                    let bytes = payload.len();
                    self.south
                        .publish_plain(device, topic.clone(), payload, entry.seq)
                        .await;
                    info!(event = "plain_downlink_sent", device = %device, seq = entry.seq.0, msg_id = %entry.msg_id, bytes, "plain downlink sent bare on the device's command topic");
                }
                Some(None) => {
                    warn!(event = "plain_downlink_unsendable", device = %device, seq = entry.seq.0, msg_id = %entry.msg_id, "a downlink for a plain device has no payload to send bare; dead-lettered");
                    let moved = self.store.nack(
                        device.clone(),
                        entry.seq,
                        reason::NOT_PLAIN.to_string(),
                        now_ms(),
                    );
                    self.commit_move(device, moved);
                }
                None => self.on_plain_delivered(device, entry.seq),
            }
        }
    }

    /// The device acknowledged plain downlink `seq` (or it is a tombstone
    /// to step over): commit the cursor move; its outcome releases the next.
    pub(super) fn on_plain_delivered(&mut self, device: &DeviceId, seq: Seq) {
        let moved = self.store.advance(device.clone(), seq, false, now_ms());
        self.commit_move(device, moved);
    }
}
