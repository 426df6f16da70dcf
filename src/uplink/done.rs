//! The engine's side of the store's answers: what a commit, a refill, a
//! sweep or a lookup it waited for means for the devices and the scheduler.

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Done, Engine};
use crate::clip::Clip;
use crate::dead_letter::Direction;
use crate::ids::{DeviceId, MsgId};
use crate::metrics;
use crate::protocol::now_ms;
use crate::protocol::receipt::Receipt;
use crate::state::MessageState;
use crate::store::record::uplink::Moved;
use crate::store::record::uplink::EXPIRED_REASON;
use crate::store::StoreError;

impl Engine {
    /// A move to a final state committed (or not): the device's receipt.
    async fn on_moved(
        &mut self,
        device: DeviceId,
        msg_id: MsgId,
        to: MessageState,
        reason: Option<String>,
        result: Result<Option<Moved>, StoreError>,
    ) {
        match result {
            Ok(Some(moved)) => {
                let receipt = match to {
                    MessageState::Delivered => {
                        metrics::delivered(Direction::Up, 1);
                        metrics::delivery_took(Direction::Up, now_ms() - moved.stored_ms);
                        Receipt::delivered(&msg_id, moved.seq)
                    }
                    _ => {
                        metrics::dead_lettered(Direction::Up, 1);
                        let reason = reason.unwrap_or_default();
                        warn!(event = "uplink_dead_lettered", device = %device, msg_id = %msg_id, seq = moved.seq.0, attempts = moved.attempts, reason = %Clip(&reason), "uplink dead-lettered");
                        Receipt::failed(&msg_id, moved.seq, reason)
                    }
                };
                self.send_receipt(&device, receipt).await;
            }
            Ok(None) => {
                debug!(device = %device, msg_id = %msg_id, to = %to, "no move: not stored (already final or unknown)")
            }
            Err(e) => {
                warn!(event = "uplink_transition_not_committed", device = %device, msg_id = %msg_id, error = %e, "could not commit a transition; will read the device back");
                self.scheduler.on_store_failed(&device);
            }
        }
    }

    /// Applies a store answer; an error only once the store is gone.
    pub(super) async fn on_done(&mut self, done: Done) -> Result<(), StoreError> {
        let done = match done {
            Done::Moved { result: Err(e), .. }
            | Done::Delivered { result: Err(e), .. }
            | Done::Loaded { result: Err(e), .. }
            | Done::Expired(Err(e))
            | Done::Replayed(Err(e))
            | Done::LookedUp { result: Err(e), .. }
                if e.is_fatal() =>
            {
                return Err(e)
            }
            done => done,
        };
        match done {
            Done::Moved {
                device,
                msg_id,
                to,
                reason,
                result,
            } => self.on_moved(device, msg_id, to, reason, result).await,
            Done::Delivered { moved, result } => match result {
                Ok(results) => {
                    for ((device, msg_id), result) in moved.into_iter().zip(results) {
                        self.on_moved(device, msg_id, MessageState::Delivered, None, result)
                            .await;
                    }
                }
                Err(e) => {
                    warn!(event = "uplink_transition_not_committed", messages = moved.len(), error = %e, "could not commit the moves to delivered; will read the devices back");
                    for (device, _) in moved {
                        self.scheduler.on_store_failed(&device);
                    }
                }
            },
            Done::LookedUp { device, result } => {
                let receipt = match result {
                    Ok(Some(dup)) => dup.receipt(),
                    Ok(None) => return Ok(()),
                    Err(e) => {
                        warn!(event = "uplink_duplicate_not_answered", device = %device, error = %e, "duplicate not answered; the device will resend");
                        return Ok(());
                    }
                };
                self.send_receipt(&device, receipt).await;
            }
            Done::Expired(Ok(expired)) => {
                metrics::expired(Direction::Up, expired.len() as u64);
                metrics::dead_lettered(Direction::Up, expired.len() as u64);
                for (device, msg_id, moved) in expired {
                    warn!(event = "uplink_dead_lettered", device = %device, msg_id = %msg_id, seq = moved.seq.0, attempts = moved.attempts, reason = EXPIRED_REASON, "uplink dead-lettered");
                    self.scheduler.forget(&device, &msg_id);
                    let receipt = Receipt::failed(&msg_id, moved.seq, EXPIRED_REASON);
                    self.send_receipt(&device, receipt).await;
                }
            }
            Done::Expired(Err(e)) => {
                warn!(event = "uplink_expiry_failed", error = %e, "uplink expiry sweep failed")
            }
            Done::Replayed(Ok(msgs)) => {
                for msg in msgs {
                    info!(event = "uplink_replayed", device = %msg.device, msg_id = %msg.msg_id, seq = msg.seq.0, "uplink replayed from the dead letters");
                    let store_ms = self.store.clock().store_ms();
                    self.scheduler.on_replayed(msg, Instant::now(), store_ms);
                }
            }
            Done::Replayed(Err(e)) => {
                warn!(event = "uplink_replay_failed", error = %e, "could not take the replays asked for")
            }
            Done::Loaded {
                device,
                limit,
                result,
            } => match result {
                Ok(msgs) => {
                    let store_ms = self.store.clock().store_ms();
                    self.scheduler
                        .on_loaded(&device, msgs, limit, Instant::now(), store_ms)
                }
                Err(e) => {
                    warn!(event = "uplink_pending_not_read", device = %device, error = %e, "could not read pending messages");
                    self.scheduler.on_store_failed(&device);
                }
            },
        }
        Ok(())
    }
}
