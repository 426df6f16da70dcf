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
use crate::dead_letter::{DeadLetter, Direction};
use crate::ids::{DeviceId, MsgId};
use crate::metrics::{self, Stage};
use crate::protocol::envelope::{RejectCode, Rejection};
use crate::protocol::now_ms;
use crate::protocol::receipt::Receipt;
use crate::protocol::topics::Topics;
use crate::south::{Ack, SouthMessage, SouthSender};
use crate::state::MessageState;
use crate::store::record::uplink::{IntakeOutcome, ToEngine};
use crate::store::refusal::Refusal;
use crate::store::{Store, StoreError, Timing};

/// Where intake's answers go: devices (their receipts), the engine (new
/// messages) and the store (which receipts are out).
#[derive(Clone, Copy)]
pub(super) struct To<'a> {
    pub topics: &'a Topics,
    pub south: &'a SouthSender,
    pub engine: &'a mpsc::Sender<ToEngine>,
    pub store: &'a Store,
}

/// A store answer and who it is for.
pub(super) enum Answer {
    Stored {
        device: DeviceId,
        result: Result<(IntakeOutcome, Timing), StoreError>,
        /// A plain uplink: its PUBACK is its only receipt.
        plain: bool,
    },
    Rejected {
        device: Option<DeviceId>,
        rejection: Rejection,
        result: Result<Refusal, StoreError>,
    },
    /// Refused over a limit, before the store: nothing was kept.
    Refused {
        device: DeviceId,
        rejection: Rejection,
    },
    /// Not kept, and not acknowledged: the device sends it again (a plain
    /// publish that waited for room when shutdown began).
    Withheld,
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
    to: &To<'_>,
    lines: &mut Lines,
) -> Result<bool, StoreError> {
    if let Answer::Withheld = answer {
        drop(taken.ack);
        return Ok(true);
    }
    let going = answer_device(answer, taken.at, to, lines).await?;
    let south = to.south;
    south.ack(taken.ack);
    Ok(going)
}

/// Sends the receipt a committed answer calls for. False once the engine
/// is gone; an error once the store is.
async fn answer_device(
    answer: Answer,
    taken_at: Instant,
    to: &To<'_>,
    lines: &mut Lines,
) -> Result<bool, StoreError> {
    let To {
        topics,
        south,
        engine,
        store,
    } = *to;
    let mut receipt_out = true;
    let (device, receipt, new) = match answer {
        Answer::Stored {
            device,
            result: Ok((IntakeOutcome::Stored(msg), timing)),
            plain,
        } => {
            receipt_out = !plain;
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
            ..
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
            result: Ok((IntakeOutcome::AtBudget { msg_id, detail }, _)),
            ..
        } => {
            let rejection = Rejection {
                code: RejectCode::DiskBudget,
                detail,
                msg_id: Some(msg_id),
            };
            refused(device, rejection)
        }
        Answer::Stored {
            device,
            result: Err(e),
            ..
        } => {
            if e.is_fatal() {
                return Err(e);
            }
            warn!(event = "uplink_not_stored", device = %device, error = %e, "uplink not stored; the device will resend");
            return Ok(true);
        }
        Answer::Rejected {
            device: Some(device),
            rejection,
            result: Ok(Refusal::AtBudget { detail }),
        } => {
            let rejection = Rejection {
                code: RejectCode::DiskBudget,
                detail,
                ..rejection
            };
            refused(device, rejection)
        }
        // Nobody to answer, nothing kept.
        Answer::Rejected {
            device: None,
            result: Ok(Refusal::AtBudget { .. }),
            ..
        } => {
            metrics::rejected(Direction::Up, RejectCode::DiskBudget);
            return Ok(true);
        }
        Answer::Rejected {
            device,
            rejection,
            result:
                Ok(Refusal::Filed {
                    id: dead_letter,
                    summary,
                }),
        } => {
            if let Some(summary) = summary {
                summary.report();
            }
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
        Answer::Refused { device, rejection } => refused(device, rejection),
        Answer::Withheld => return Ok(true),
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
    if receipt_out {
        south
            .publish(
                &device,
                topics.device_ack(&device),
                Bytes::from(receipt.to_bytes()),
            )
            .await;
    }
    Ok(match new {
        Some(new) => {
            if let ToEngine::Stored { committed, msg } = &new {
                metrics::stage_took(Stage::Receipt, committed.elapsed());
                // Its `stored` is out: a refill may read it now.
                store.receipted(msg.id);
            }
            engine.send(new).await.is_ok()
        }
        None => true,
    })
}

/// The receipt of a publish refused with a retryable reason (`rate`,
/// `disk_budget`): nothing was kept.
fn refused(device: DeviceId, rejection: Rejection) -> (DeviceId, Receipt, Option<ToEngine>) {
    metrics::rejected(Direction::Up, rejection.code);
    let receipt = Receipt::refused(rejection.msg_id.as_ref(), rejection.reason());
    (device, receipt, None)
}

/// Files a publish refused at the door as a dead letter (against its
/// sender's share, `store::refusal`), answered once that is committed.
pub(super) fn reject(
    store: &Store,
    device: Option<DeviceId>,
    rejection: Rejection,
    msg: &SouthMessage,
) -> AnswerFuture {
    let dl = DeadLetter {
        direction: Direction::Up,
        device: device
            .as_ref()
            .map(|d| d.to_string())
            .or_else(|| msg.publisher.clone())
            .or_else(|| raw_device(&msg.topic)),
        msg_id: rejection.msg_id.as_ref().map(MsgId::to_string),
        topic: msg.topic.clone(),
        reason: rejection.reason(),
        raw: msg.payload.clone(),
        at_ms: now_ms(),
    };
    let dead_letter = store.reject(dl);
    Box::pin(async move {
        Answer::Rejected {
            device,
            rejection,
            result: dead_letter.await,
        }
    })
}

/// The second topic level as written, for the dead-letter row of a bad topic.
fn raw_device(topic: &str) -> Option<String> {
    topic.split('/').nth(1).map(str::to_string)
}
