//! Device controls: `status`, `pull`, `confirm`, `read` and `nack` from a
//! device. Cursor moves are committed before the scheduler or the backend
//! hears of them.

use std::future::Future;

use tokio::time::Instant;
use tracing::{info, warn};

use super::{Done, Downlink};
use crate::clip::{self, Clip};
use crate::ids::DeviceId;
use crate::protocol::control::{parse_control, Control};
use crate::protocol::now_ms;
use crate::south::DeviceControl;
use crate::state::DeliveryState;
use crate::store::record::downlink::{reason, CursorMove};
use crate::store::StoreError;

impl Downlink {
    pub(super) async fn on_control(&mut self, c: DeviceControl) -> Result<(), StoreError> {
        let control = match parse_control(c.kind, &c.payload) {
            Ok(control) => control,
            Err(e) => {
                warn!(event = "device_control_malformed", device = %c.device, error = %clip::display(&e), "ignoring a malformed control message");
                return Ok(());
            }
        };
        let device = c.device;
        let now = now_ms();
        let actions = match control {
            Control::Status { online: true } => self.scheduler.on_online(&device),
            Control::Status { online: false } => {
                self.scheduler.on_offline(&device);
                Vec::new()
            }
            Control::Pull { after, limit } => {
                self.scheduler
                    .on_pull(&device, after, limit, Instant::now())
            }
            Control::Confirm { upto } => {
                let moved = self.store.advance(device.clone(), upto, false, now);
                self.commit_move(&device, moved);
                // A confirm also says the device is there.
                self.scheduler.on_online(&device)
            }
            Control::Read { upto } => {
                let moved = self.store.advance(device.clone(), upto, true, now);
                self.commit_move(&device, moved);
                Vec::new()
            }
            Control::Nack { seq, reason: why } => {
                let moved = self
                    .store
                    .nack(device.clone(), seq, reason::nacked(&why), now);
                self.commit_move(&device, moved);
                Vec::new()
            }
        };
        self.execute(actions).await
    }

    /// Waits for a cursor-moving request; its outcome arrives as `Done::Moved`.
    pub(super) fn commit_move(
        &mut self,
        device: &DeviceId,
        moved: impl Future<Output = Result<CursorMove, StoreError>> + Send + 'static,
    ) {
        let device = device.clone();
        self.pending.push(Box::pin(async move {
            Done::Moved {
                device,
                result: moved.await,
            }
        }));
    }

    /// A confirm, read or nack committed: report it and release what it
    /// frees.
    pub(super) async fn on_moved(
        &mut self,
        device: DeviceId,
        moved: CursorMove,
    ) -> Result<(), StoreError> {
        super::count_events(&moved.events);
        for e in moved
            .events
            .iter()
            .filter(|e| e.state == DeliveryState::Dead)
        {
            warn!(event = "downlink_dead_lettered", device = %e.device, msg_id = %e.msg_id, seq = e.seq.0, reason = %Clip(e.reason.as_deref().unwrap_or("")), "downlink delivery dead-lettered: its device nacked it");
        }
        for ms in &moved.delivered_after_ms {
            crate::metrics::delivery_took(crate::dead_letter::Direction::Down, *ms);
        }
        self.send_receipts(moved.receipts);
        let (released, actions) =
            self.scheduler
                .on_cursor_moved(&device, moved.cursors, moved.confirmed);
        if let Some(o) = released {
            info!(
                event = "downlink_batch_confirmed",
                device = %device,
                first_seq = o.first.0,
                last_seq = o.last.0,
                count = o.size,
                cursor = moved.cursors.delivered_upto.0,
                resends = o.resends,
                confirm_ms = o.sent_at.elapsed().as_millis() as u64,
                "downlink batch confirmed"
            );
        }
        self.execute(actions).await
    }
}
