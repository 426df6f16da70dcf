//! Plain devices at the door: a publish on one of `south.plain_topics`
//! (docs/PROTOCOL.md, "Plain devices") is stored as it came, with no
//! envelope to judge, and its PUBACK (PUBREC) is its only receipt.
//!
//! - Its `msg_id` is ferry's own ([`crate::protocol::plain::PlainIds`]): `p.{run}.{number}`, the
//!   run unique per gateway start, the number the broker's
//!   ([`crate::south::SouthMessage::number`]), which a resend (DUP) of a
//!   publish never acknowledged keeps: the store answers it as the
//!   duplicate it is, and it is not stored twice.
//! - Nothing tells a plain device `rejected`, so it is never refused with
//!   a reason it could act on: over a per-device limit its PUBACK is
//!   withheld and its connection closed ([`withhold`]): the device sends
//!   it again. At the disk budget it waits for room, its PUBACK with it.
//!   A publish that can never be stored (too large) is dead-lettered and
//!   acknowledged, as an envelope's would be.

use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::answer::{reject, Answer, AnswerFuture};
use super::judged::{too_large_north, IntakeConfig, Verdict};
use super::limits::{Lines, Sender};
use crate::clip::Clip;
use crate::ids::{DeviceId, MsgId};
use crate::metrics::{self, Count};
use crate::protocol::envelope::{with_publish, Envelope, RejectCode, Rejection};
use crate::protocol::plain::{plain_envelope, PLAIN_STREAM};
use crate::protocol::topics::Topics;
use crate::shutdown::Shutdown;
use crate::south::SouthMessage;
use crate::store::record::uplink::{Intake, IntakeOutcome};

/// How often a plain publish waiting at the disk budget looks again.
const BUDGET_POLL: Duration = Duration::from_millis(500);

/// Counts a plain publish as it comes.
pub(super) fn count(msg: &SouthMessage) {
    metrics::count(Count::PlainFromDevices);
    if msg.qos == Some(0) {
        metrics::count(Count::PlainQos0FromDevices);
    }
}

/// What judging a plain publish needs of intake.
pub(super) struct Store<'a> {
    pub cfg: &'a IntakeConfig,
    pub topics: &'a Topics,
    pub store: &'a crate::store::Store,
    pub shutdown: &'a Shutdown,
}

/// A plain publish over a per-device limit (`detail`): not acknowledged,
/// so its device's connection ends and it is sent again (QoS 1, 2); a
/// QoS 0 one is not kept. Counted, and said at most so often per device.
pub(super) fn withhold(
    lines: &mut Lines,
    sender: Sender,
    detail: String,
    msg: &SouthMessage,
) -> Verdict {
    let total = metrics::count(Count::PlainWithheldFromDevices);
    if lines.admit(&sender, Instant::now()) {
        let device = sender.as_ref().map_or("-", DeviceId::as_str);
        warn!(event = "plain_publish_withheld", device, topic = %Clip(&msg.topic), qos = msg.qos, detail = %Clip(&detail), total, "plain device over its limit: publish not acknowledged and its connection closed (QoS 0: not kept); the device sends it again");
    }
    Verdict::Withheld
}

/// Stores a plain publish of `device`, answered once it is committed.
pub(super) fn judge(to: Store<'_>, device: DeviceId, msg: &SouthMessage) -> AnswerFuture {
    let msg_id = to.cfg.plain.of(msg.number);
    if let Some(rejection) = oversized(to.cfg, &msg_id, msg) {
        return reject(to.store, Some(device), rejection, msg);
    }
    let envelope = plain_envelope(msg_id, &msg.topic, &msg.payload, msg.qos, msg.retain);
    stored(to, device, PLAIN_STREAM, envelope, msg)
}

/// Why a publish over the largest packet a device may send is refused.
pub(super) fn oversized(
    cfg: &IntakeConfig,
    msg_id: &MsgId,
    msg: &SouthMessage,
) -> Option<Rejection> {
    let size = msg.oversize?;
    Some(Rejection {
        code: RejectCode::TooLarge,
        detail: format!(
            "{size} bytes > {}, the largest packet a device may send \
             (south.max_payload_bytes + 1024)",
            crate::south::max_packet_bytes(cfg.max_payload_bytes)
        ),
        msg_id: Some(msg_id.clone()),
    })
}

/// Stores `envelope`, a publish of `device` with no envelope of its own
/// (plain, Sparkplug), on `stream`: answered once it is committed, waiting
/// at the disk budget.
pub(super) fn stored(
    to: Store<'_>,
    device: DeviceId,
    stream: &str,
    envelope: Envelope,
    msg: &SouthMessage,
) -> AnswerFuture {
    let Store {
        cfg,
        topics,
        store,
        shutdown,
    } = to;
    let envelope = match with_publish(envelope, msg.v5.user.clone(), msg.v5.expiry_s) {
        Ok(envelope) => envelope,
        Err(rejection) => return reject(store, Some(device), rejection, msg),
    };
    let intake = Intake::new(
        &cfg.gateway,
        device.clone(),
        stream.into(),
        envelope,
        store.now(),
    )
    .received_at(msg.received_ms);
    if let Some(rejection) = too_large_north(cfg, topics, &intake) {
        return reject(store, Some(device), rejection, msg);
    }
    let store = store.clone();
    let mut shutdown = shutdown.clone();
    Box::pin(async move {
        loop {
            // At the budget it waits, its PUBACK with it (the device is
            // held back by its own window); at shutdown it is left for the
            // device to send again.
            while store.budget().over() {
                tokio::select! {
                    _ = tokio::time::sleep(BUDGET_POLL) => {}
                    _ = shutdown.begun() => return Answer::Withheld,
                }
            }
            let result = store.intake_timed(intake.clone()).await;
            if !matches!(result, Ok((IntakeOutcome::AtBudget { .. }, _))) {
                return Answer::Stored {
                    device,
                    result,
                    plain: true,
                };
            }
        }
    })
}
