//! Intake: device publishes in, receipts out, new messages on to the engine.
//!
//! Every accepted or rejected message is sent to the store at once (so the
//! writer can group many into one commit) and answered in the order the
//! commits complete, which is the order they arrived. Nothing is answered
//! before its commit; a store error answers nothing, and the device resends.
//!
//! Once shutdown begins, intake takes no more device publishes (the devices
//! send again what was not answered), answers what it took, and returns:
//! the engine and the downlink task see their input close.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::record::{Intake, IntakeOutcome, ToEngine};
use crate::dead_letter::DeadLetter;
use crate::downlink::DeviceControl;
use crate::ids::{DeviceId, MsgId};
use crate::protocol::control::ControlKind;
use crate::protocol::envelope::{parse_uplink, sniff_msg_id, RejectCode, Rejection};
use crate::protocol::receipt::Receipt;
use crate::protocol::topics::{DeviceTopic, TopicError, Topics};
use crate::protocol::{now_ms, publish_packet_len};
use crate::shutdown::Shutdown;
use crate::south::{Ack, Inbound, SouthMessage, SouthSender};
use crate::state::MessageState;
use crate::store::{Store, StoreError};

/// Messages sent to the store and not yet answered, at most, and their
/// payload bytes: past either, intake waits (and the broker, soon after,
/// holds the devices back).
pub const MAX_UNANSWERED: usize = 16_384;
const MAX_UNANSWERED_BYTES: usize = 32 << 20;

/// Device publishes over the broker's limit, counted.
pub static OVERSIZED_FROM_DEVICES: AtomicU64 = AtomicU64::new(0);
/// Device publishes outside the sender's own topics, counted.
pub static UNAUTHORIZED_FROM_DEVICES: AtomicU64 = AtomicU64::new(0);

pub struct IntakeConfig {
    pub gateway: Arc<str>,
    pub max_payload_bytes: usize,
    /// `north.max_packet_bytes`: a message whose north packet would be
    /// larger can never be published, so it is refused at the door.
    pub max_north_packet: usize,
    /// Where device control messages (confirm, pull, ...) go.
    pub controls: mpsc::Sender<DeviceControl>,
}

/// A store answer and who it is for.
enum Answer {
    Stored {
        device: DeviceId,
        result: Result<IntakeOutcome, StoreError>,
    },
    Rejected {
        device: Option<DeviceId>,
        rejection: Rejection,
        result: Result<i64, StoreError>,
    },
}

type AnswerFuture = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// Runs until shutdown begins, the south side closes or the store stops.
pub async fn run(
    cfg: IntakeConfig,
    topics: Topics,
    store: Store,
    mut inbound: Inbound,
    south: SouthSender,
    engine: mpsc::Sender<ToEngine>,
    mut shutdown: Shutdown,
) -> Result<(), StoreError> {
    let mut unanswered: FuturesOrdered<AnswerFuture> = FuturesOrdered::new();
    // Payload bytes and south ack of each unanswered message, in the same
    // order.
    let mut sizes: VecDeque<(usize, Ack)> = VecDeque::new();
    let mut bytes = 0usize;
    loop {
        let room = unanswered.len() < MAX_UNANSWERED && bytes < MAX_UNANSWERED_BYTES;
        tokio::select! {
            // Answers first: they free room and carry receipts.
            biased;
            Some(answer) = unanswered.next(), if !unanswered.is_empty() => {
                let (size, ack) = sizes.pop_front().unwrap_or_default();
                bytes -= size;
                if !finish(answer, ack, &topics, &south, &engine).await? {
                    return Ok(());
                }
            }
            _ = shutdown.begun() => {
                info!(unanswered = unanswered.len(), "device intake stopped; answering what was taken");
                break;
            }
            msg = inbound.recv(), if room => match msg {
                Some(msg) => {
                    let (size, ack) = (msg.payload.len(), msg.ack);
                    match accept(&cfg, &topics, &store, msg).await {
                        Some(fut) => {
                            unanswered.push_back(fut);
                            sizes.push_back((size, ack));
                            bytes += size;
                        }
                        // Handed on (a control message) or ignored.
                        None => south.ack(ack),
                    }
                }
                None => break,
            },
        }
    }
    // Answer what was already sent to the store before stopping.
    while let Some(answer) = unanswered.next().await {
        let (_, ack) = sizes.pop_front().unwrap_or_default();
        finish(answer, ack, &topics, &south, &engine).await?;
    }
    Ok(())
}

/// Answers the device, then acknowledges the message to the south broker
/// (external mode): it is committed, or a store error refused it alone and
/// the device, which got no receipt, resends it as it would a message lost
/// on the way. Once the store is gone, nothing is acknowledged: the site
/// broker sends it again to the next run. False once the engine is gone.
async fn finish(
    answer: Answer,
    ack: Ack,
    topics: &Topics,
    south: &SouthSender,
    engine: &mpsc::Sender<ToEngine>,
) -> Result<bool, StoreError> {
    let going = answer_device(answer, topics, south, engine).await?;
    south.ack(ack);
    Ok(going)
}

/// Judges one device publish and sends it to the store.
async fn accept(
    cfg: &IntakeConfig,
    topics: &Topics,
    store: &Store,
    msg: SouthMessage,
) -> Option<AnswerFuture> {
    if let Some(size) = msg.oversize {
        let total = OVERSIZED_FROM_DEVICES.fetch_add(1, Ordering::Relaxed) + 1;
        warn!(topic = %msg.topic, bytes = size, limit = cfg.max_payload_bytes, total, "device publish over south.max_payload_bytes");
    }
    if let Some(publisher) = &msg.publisher {
        // Not the sender's own topic: routed nowhere, answered to the
        // sender, kept as a dead letter.
        let total = UNAUTHORIZED_FROM_DEVICES.fetch_add(1, Ordering::Relaxed) + 1;
        warn!(publisher = %publisher, topic = %msg.topic, total, "device publish outside its own topics rejected");
        let mut rejection = Rejection::new(
            RejectCode::Unauthorized,
            format!("{publisher} may not publish on {}", msg.topic),
        );
        rejection.msg_id = sniff_msg_id(&msg.payload);
        let sender = DeviceId::new(publisher.as_str()).ok();
        return Some(reject(store, sender, rejection, &msg));
    }
    let (device, stream) = match topics.parse_device(&msg.topic) {
        Ok((device, DeviceTopic::Up { stream })) => (device, stream),
        Ok((device, _)) if msg.oversize.is_some() => {
            warn!(device = %device, topic = %msg.topic, "oversized control message ignored");
            return None;
        }
        Ok((device, kind)) => {
            let kind = match kind {
                DeviceTopic::Confirm => ControlKind::Confirm,
                DeviceTopic::Pull => ControlKind::Pull,
                DeviceTopic::Read => ControlKind::Read,
                DeviceTopic::Nack => ControlKind::Nack,
                DeviceTopic::Status => ControlKind::Status,
                DeviceTopic::Up { .. } => unreachable!("matched above"),
            };
            if cfg
                .controls
                .send(DeviceControl {
                    device,
                    kind,
                    payload: msg.payload,
                })
                .await
                .is_err()
            {
                debug!("downlink stopped; control message dropped");
            }
            return None;
        }
        Err(e @ (TopicError::NoStream(_) | TopicError::BadStream(..))) => {
            let device = match &e {
                TopicError::NoStream(d) | TopicError::BadStream(d, _) => d.clone(),
                _ => unreachable!("matched above"),
            };
            let mut rejection = Rejection::new(RejectCode::BadTopic, e.to_string());
            rejection.msg_id = sniff_msg_id(&msg.payload);
            return Some(reject(store, Some(device), rejection, &msg));
        }
        Err(e) => {
            let rejection = Rejection::new(RejectCode::BadTopic, e.to_string());
            warn!(topic = %msg.topic, reason = %rejection.reason(), "device publish on a bad topic dead-lettered");
            return Some(reject(store, None, rejection, &msg));
        }
    };
    if let Some(size) = msg.oversize {
        let rejection = Rejection {
            code: RejectCode::TooLarge,
            detail: format!(
                "{size} bytes > south.max_payload_bytes {}",
                cfg.max_payload_bytes
            ),
            msg_id: sniff_msg_id(&msg.payload),
        };
        return Some(reject(store, Some(device), rejection, &msg));
    }
    match parse_uplink(&msg.payload, cfg.max_payload_bytes) {
        Ok(envelope) => {
            let intake = Intake::new(&cfg.gateway, device.clone(), stream, envelope, now_ms());
            let packet = north_packet_len(topics, &intake);
            if packet > cfg.max_north_packet {
                let rejection = Rejection {
                    code: RejectCode::TooLarge,
                    detail: format!(
                        "its north packet would be {packet} bytes > north.max_packet_bytes {}",
                        cfg.max_north_packet
                    ),
                    msg_id: Some(intake.msg_id),
                };
                return Some(reject(store, Some(device), rejection, &msg));
            }
            let stored = store.intake(intake);
            Some(Box::pin(async move {
                Answer::Stored {
                    device,
                    result: stored.await,
                }
            }))
        }
        Err(rejection) => Some(reject(store, Some(device), rejection, &msg)),
    }
}

fn reject(
    store: &Store,
    device: Option<DeviceId>,
    rejection: Rejection,
    msg: &SouthMessage,
) -> AnswerFuture {
    let dl = DeadLetter {
        direction: "up",
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

/// The largest the message's north PUBLISH can be once its seq is spliced in.
fn north_packet_len(topics: &Topics, intake: &Intake) -> usize {
    /// `"seq":` plus a u64 and a comma, in place of nothing.
    const SEQ_FIELD: usize = 7 + 20;
    let topic = topics.north_up(&intake.device, &intake.stream);
    publish_packet_len(topic.len(), intake.body.len() + SEQ_FIELD)
}

/// The second topic level as written, for the dead-letter row of a bad topic.
fn raw_device(topic: &str) -> Option<String> {
    topic.split('/').nth(1).map(str::to_string)
}

/// Sends the receipt a committed answer calls for. False once the engine
/// is gone; an error once the store is.
async fn answer_device(
    answer: Answer,
    topics: &Topics,
    south: &SouthSender,
    engine: &mpsc::Sender<ToEngine>,
) -> Result<bool, StoreError> {
    let (device, receipt, new) = match answer {
        Answer::Stored {
            device,
            result: Ok(IntakeOutcome::Stored(msg)),
        } => (
            device,
            Receipt::stored(&msg.msg_id, msg.seq),
            Some(ToEngine::Stored(msg)),
        ),
        Answer::Stored {
            device,
            result: Ok(IntakeOutcome::Duplicate(dup)),
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
            warn!(device = %device, error = %e, "uplink not stored; the device will resend");
            return Ok(true);
        }
        Answer::Rejected {
            device,
            rejection,
            result: Ok(dead_letter),
        } => {
            warn!(device = ?device.as_ref().map(DeviceId::as_str), reason = %rejection.reason(), dead_letter, "uplink rejected");
            let Some(device) = device else {
                return Ok(true);
            };
            (
                device,
                Receipt::rejected(rejection.msg_id.as_ref(), rejection.reason(), dead_letter),
                None,
            )
        }
        Answer::Rejected { result: Err(e), .. } => {
            if e.is_fatal() {
                return Err(e);
            }
            warn!(error = %e, "rejected uplink could not be dead-lettered");
            return Ok(true);
        }
    };
    south
        .publish(
            &device,
            topics.device_ack(&device),
            Bytes::from(receipt.to_bytes()),
        )
        .await;
    Ok(match new {
        Some(new) => engine.send(new).await.is_ok(),
        None => true,
    })
}
