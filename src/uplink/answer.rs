//! Answering a device once its publish is settled: the receipt the
//! store's answer calls for, then the south broker's ack (external mode),
//! in arrival order; and what intake keeps of each message meanwhile.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use super::limits::{Lines, Sender};
use crate::clip::Clip;
use crate::dead_letter::Direction;
use crate::ids::{DeviceId, MsgId};
use crate::metrics::{self, Stage};
use crate::protocol::envelope::Rejection;
use crate::protocol::receipt::Receipt;
use crate::protocol::topics::Topics;
use crate::south::{Ack, SouthSender};
use crate::state::MessageState;
use crate::store::record::uplink::{IntakeOutcome, ToEngine};
use crate::store::{StoreError, Timing};

/// A store answer and who it is for.
pub(super) enum Answer {
    Stored {
        device: DeviceId,
        result: Result<(IntakeOutcome, Timing), StoreError>,
    },
    Rejected {
        device: Option<DeviceId>,
        rejection: Rejection,
        result: Result<i64, StoreError>,
    },
    /// Refused over a limit, before the store: nothing was kept.
    Refused {
        device: DeviceId,
        rejection: Rejection,
    },
}

pub(super) type AnswerFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// What intake keeps of a message until it is answered.
pub(super) struct Taken {
    /// Payload bytes (the unanswered messages' bytes are bounded).
    pub size: usize,
    /// The south broker's ack (external mode), sent after the answer.
    pub ack: Ack,
    /// Whom it counts against in flight.
    pub in_flight: Option<Sender>,
    /// When intake took it, for the `stored` receipt's latency.
    pub at: Instant,
}

/// Answers the device, then acknowledges the message to the south broker
/// (external mode): it is committed, or a store error refused it alone and
/// the device, which got no receipt, resends it as it would a message lost
/// on the way. Once the store is gone, nothing is acknowledged: the site
/// broker sends it again to the next run. False once the engine is gone.
pub(super) async fn finish(
    answer: Answer,
    taken: Taken,
    topics: &Topics,
    south: &SouthSender,
    engine: &mpsc::Sender<ToEngine>,
    lines: &mut Lines,
) -> Result<bool, StoreError> {
    let going = answer_device(answer, taken.at, topics, south, engine, lines).await?;
    south.ack(taken.ack);
    Ok(going)
}

/// Sends the receipt a committed answer calls for. False once the engine
/// is gone; an error once the store is.
async fn answer_device(
    answer: Answer,
    taken_at: Instant,
    topics: &Topics,
    south: &SouthSender,
    engine: &mpsc::Sender<ToEngine>,
    lines: &mut Lines,
) -> Result<bool, StoreError> {
    let (device, receipt, new) = match answer {
        Answer::Stored {
            device,
            result: Ok((IntakeOutcome::Stored(msg), timing)),
        } => {
            metrics::stage_took(Stage::Queued, timing.started - timing.queued);
            metrics::stage_took(Stage::Commit, timing.committed - timing.started);
            let receipt = Receipt::stored(&msg.msg_id, msg.seq);
            let new = ToEngine::Stored {
                msg,
                committed: timing.committed,
            };
            (device, receipt, Some(new))
        }
        Answer::Stored {
            device,
            result: Ok((IntakeOutcome::Duplicate(dup), _)),
        } => {
            if dup.state == MessageState::Stored {
                // The engine answers it (see `ToEngine::Duplicate`).
                let dup = ToEngine::Duplicate {
                    device,
                    msg_id: dup.msg_id,
                    seq: dup.seq,
                };
                return Ok(engine.send(dup).await.is_ok());
            }
            (device, dup.receipt(), None)
        }
        Answer::Stored {
            device,
            result: Err(e),
        } => {
            if e.is_fatal() {
                return Err(e);
            }
            warn!(event = "uplink_not_stored", device = %device, error = %e, "uplink not stored; the device will resend");
            return Ok(true);
        }
        Answer::Rejected {
            device,
            rejection,
            result: Ok(dead_letter),
        } => {
            // "-": published on a topic that names no valid device.
            metrics::rejected(Direction::Up, rejection.code);
            let named = device.as_ref().map_or("-", DeviceId::as_str);
            if lines.admit(&device, Instant::now()) {
                warn!(event = "uplink_rejected", device = named, msg_id = rejection.msg_id.as_ref().map(MsgId::as_str), reason = %Clip(&rejection.reason()), dead_letter, "uplink rejected");
            }
            let Some(device) = device else {
                return Ok(true);
            };
            (
                device,
                Receipt::rejected(rejection.msg_id.as_ref(), rejection.reason(), dead_letter),
                None,
            )
        }
        Answer::Refused { device, rejection } => {
            metrics::rejected(Direction::Up, rejection.code);
            (
                device,
                Receipt::refused(rejection.msg_id.as_ref(), rejection.reason()),
                None,
            )
        }
        Answer::Rejected { result: Err(e), .. } => {
            if e.is_fatal() {
                return Err(e);
            }
            warn!(event = "uplink_reject_not_dead_lettered", error = %e, "rejected uplink could not be dead-lettered");
            return Ok(true);
        }
    };
    // Counted before the device can hear of it.
    if new.is_some() {
        metrics::stored(Direction::Up, 1);
        metrics::stored_receipt_took(taken_at.elapsed());
    }
    south
        .publish(
            &device,
            topics.device_ack(&device),
            Bytes::from(receipt.to_bytes()),
        )
        .await;
    Ok(match new {
        Some(new) => {
            if let ToEngine::Stored { committed, .. } = &new {
                metrics::stage_took(Stage::Receipt, committed.elapsed());
            }
            engine.send(new).await.is_ok()
        }
        None => true,
    })
}
