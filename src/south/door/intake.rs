//! Intake: device publishes in, receipts out, new messages on to the engine.
//!
//! A publish over one of its sender's limits ([`super::limits`]: its rate,
//! its uplinks in flight) is refused at once, before anything else is
//! looked at: an uplink is answered `rejected` with reason `rate` and not
//! stored (the device resends it), a control is held or dropped. The
//! limits are on what devices send, not on what a site broker replays:
//! a message marked `replayed` (external mode, [`crate::south::backlog`])
//! is taken like any other but counts against neither.
//!
//! An uplink's MQTT 5 user properties and message expiry are judged with
//! its envelope ([`with_publish`]): past a bound of the properties it is
//! answered `rejected` and dead-lettered like any malformed message.
//!
//! Every other message is sent to the store at once (so the
//! writer can group many into one commit) and answered in the order the
//! commits complete, which is the order they arrived. Nothing is answered
//! before its commit; a store error answers nothing, and the device resends.
//! The answering itself is in `answer.rs`.
//!
//! Once shutdown begins, intake takes no more device publishes (the devices
//! send again what was not answered), answers what it took, and returns:
//! the engine and the downlink task see their input close.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesOrdered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::answer::{finish, reject, Answer, AnswerFuture, Taken, To};
pub use super::judged::IntakeConfig;
use super::judged::{too_large_north, Verdict};
use super::limits::{Limits, Lines, Rate, Sender};
use super::route::Route;
use crate::clip::{self, Clip};
use crate::config::MAX_UNANSWERED;
use crate::dead_letter::Direction;
use crate::ids::DeviceId;
use crate::metrics::{self, Count};
use crate::protocol::control::{self, parse_control, Control, ControlKind, Status};
use crate::protocol::depth::{nested_deeper_than, MAX_DEPTH};
use crate::protocol::envelope::{parse_uplink, sniff_msg_id, with_publish, RejectCode, Rejection};
use crate::protocol::topics::Topics;
use crate::shutdown::Shutdown;
use crate::south::{DeviceControl, Inbound, SouthMessage, SouthSender};
use crate::status_file::LiveEvent;
use crate::store::record::uplink::{Intake, ToEngine};
use crate::store::{Store, StoreError};

/// Messages sent to the store and not yet answered, at most
/// ([`MAX_UNANSWERED`]), and their payload bytes: past either, intake waits
/// (and the broker, soon after, holds the devices back).
const MAX_UNANSWERED_BYTES: usize = 32 << 20;

/// How often buckets that are full again are freed (and the statuses held
/// for them passed on).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

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
    // Payload bytes, south ack, in-flight sender and arrival of each
    // unanswered message, in the same order.
    let mut sizes: VecDeque<Taken> = VecDeque::new();
    let mut bytes = 0usize;
    let mut limits = Limits::new(cfg.rate, cfg.max_inflight_per_device);
    let mut limits_changed = cfg.limits_changed.clone();
    // Lines about one device's bad publishes, at most so many a minute.
    let mut lines = Lines::default();
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let room = unanswered.len() < MAX_UNANSWERED && bytes < MAX_UNANSWERED_BYTES;
        tokio::select! {
            // Answers first: they free room and carry receipts.
            biased;
            Some(answer) = unanswered.next(), if !unanswered.is_empty() => {
                let taken = sizes.pop_front().expect("one per unanswered message");
                bytes -= taken.size;
                if let Some(sender) = &taken.in_flight {
                    limits.answered(sender);
                }
                let to = To { topics: &topics, south: &south, engine: &engine, store: &store };
                if !finish(answer, taken, &to, &mut lines).await? {
                    return Ok(());
                }
            }
            _ = shutdown.begun() => {
                info!(event = "device_intake_stopped", unanswered = unanswered.len(), "device intake stopped; answering what was taken");
                break;
            }
            (rate, max) = crate::live::next(&mut limits_changed) => limits.set(rate, max),
            _ = sweep.tick() => {
                for (device, online) in limits.sweep(Instant::now()) {
                    forward(&cfg, device, ControlKind::Status, status_body(online)).await;
                }
                summarise_lines(&mut lines);
            }
            msg = inbound.recv(), if room => match msg {
                Some(mut msg) => {
                    let (size, ack, at) = (msg.payload.len(), std::mem::take(&mut msg.ack), Instant::now());
                    match accept(&cfg, &topics, &store, (&mut limits, &mut lines), msg, &shutdown).await {
                        Verdict::Answer { answer, in_flight } => {
                            unanswered.push_back(answer);
                            sizes.push_back(Taken { size, ack, in_flight, at });
                            bytes += size;
                        }
                        Verdict::Done => south.ack(ack),
                        // Not acknowledged: the device's connection ends
                        // and it sends the publish again.
                        Verdict::Withheld => drop(ack),
                    }
                }
                None => break,
            },
        }
    }
    // Answer what was already sent to the store before stopping.
    while let Some(answer) = unanswered.next().await {
        let taken = sizes.pop_front().expect("one per unanswered message");
        let to = To {
            topics: &topics,
            south: &south,
            engine: &engine,
            store: &store,
        };
        finish(answer, taken, &to, &mut lines).await?;
    }
    Ok(())
}

/// Says how many lines about each device were left out in the windows
/// that are over.
fn summarise_lines(lines: &mut Lines) {
    for (sender, suppressed) in lines.sweep(Instant::now()) {
        let device = sender.flatten();
        warn!(
            event = "device_lines_suppressed",
            device = device.as_ref().map_or("-", DeviceId::as_str),
            suppressed,
            window_s = clip::WINDOW.as_secs(),
            "more bad publishes from this device than are logged one by one; all are answered and counted"
        );
    }
}

/// Judges one device publish: over a limit it is refused at once,
/// otherwise it goes to the store (or, a control, to the downlink).
async fn accept(
    cfg: &IntakeConfig,
    topics: &Topics,
    store: &Store,
    (limits, lines): (&mut Limits, &mut Lines),
    msg: SouthMessage,
    shutdown: &Shutdown,
) -> Verdict {
    let route = Route::of(topics, &msg);
    let sender = route.sender();
    if let Some(device) = sender
        .as_ref()
        .filter(|d| limits.report_seen(d, Instant::now()))
    {
        let _ = cfg.seen.send(LiveEvent::DeviceSeen(device.clone()));
    }
    if !matches!(route, Route::Control { .. }) {
        metrics::received(Direction::Up);
    }
    // A Sparkplug edge node's publish is a plain one too, but for its counts.
    let plain = matches!(route, Route::Plain { .. } | Route::Sparkplug { .. });
    match route {
        Route::Plain { .. } => super::plain::count(&msg),
        Route::Sparkplug { .. } => super::sparkplug::count(),
        _ => {}
    }
    // The rate comes first: a publish over it costs no store and no log
    // line of its own, and no parsing but a status's one flag. A nack is not held to it: it is neither
    // cumulative nor repeated, and a confirm past a dropped nack would
    // report that message `delivered` instead of dead-lettered. Nor is what
    // the site broker replays from the backlog it held for ferry (external
    // mode, `south::backlog`): that is not a device sending fast.
    let limited = !msg.replayed && (!plain || !cfg.external);
    if limited
        && !matches!(
            route,
            Route::Control {
                kind: ControlKind::Nack,
                ..
            }
        )
    {
        match limits.rate(&sender, Instant::now()) {
            Rate::Within { held: None } => {}
            Rate::Within { held: Some(online) } => {
                if let Some(device) = &sender {
                    forward(
                        cfg,
                        device.clone(),
                        ControlKind::Status,
                        status_body(online),
                    )
                    .await;
                }
            }
            Rate::Over if plain => {
                return super::plain::withhold(lines, sender, limits.rate_detail(), &msg)
            }
            Rate::Over => return over_rate(limits, route, sender, &msg),
        }
    }
    if let Some(size) = msg.oversize {
        let total = metrics::count(Count::OversizedFromDevices);
        if lines.admit(&sender, Instant::now()) {
            let limit = crate::south::max_packet_bytes(cfg.max_payload_bytes);
            warn!(event = "device_publish_oversized", topic = %Clip(&msg.topic), bytes = size, limit, total, "device publish over the largest packet a device may send (south.max_payload_bytes + 1024)");
        }
    }
    if let Route::Control { device, kind } = route {
        if msg.oversize.is_some() {
            if lines.admit(&sender, Instant::now()) {
                warn!(event = "device_control_oversized", device = %device, topic = %Clip(&msg.topic), "oversized control message ignored");
            }
        } else if nested_deeper_than(&msg.payload, MAX_DEPTH) {
            // Ignored like any malformed control (controls get no receipts).
            let total = metrics::count(Count::NestedTooDeepFromDevices);
            if lines.admit(&sender, Instant::now()) {
                warn!(event = "device_control_too_deep", device = %device, topic = %Clip(&msg.topic), limit = MAX_DEPTH, total, "device control nested too deep; ignored");
            }
        } else {
            forward(cfg, device, kind, msg.payload).await;
        }
        return Verdict::Done;
    }
    // Everything else goes to the store and is answered. At the disk
    // budget the store writes nothing new (dead letters included), but a
    // resend of a message it knows is answered as the duplicate it is:
    // an uplink that names its msg_id goes to the store, which tells the
    // two apart; anything else is refused here.
    // A plain publish waits for room instead (`super::plain`): it has no
    // receipt to be told it was refused.
    if store.budget().over()
        && !plain
        && !(matches!(route, Route::Up { .. }) && sniff_msg_id(&msg.payload).is_some())
    {
        return refuse(
            sender,
            RejectCode::DiskBudget,
            store.budget().refusal_detail(),
            &msg,
        );
    }
    if limited && !limits.admit(&sender) {
        if plain {
            return super::plain::withhold(lines, sender, limits.in_flight_detail(), &msg);
        }
        return refuse(sender, RejectCode::Rate, limits.in_flight_detail(), &msg);
    }
    Verdict::Answer {
        answer: judge(cfg, topics, store, route, lines, &msg, shutdown),
        in_flight: limited.then_some(sender),
    }
}

/// A publish over its sender's rate.
fn over_rate(limits: &mut Limits, route: Route, sender: Sender, msg: &SouthMessage) -> Verdict {
    match route {
        // The device's presence (in external mode the only word of it):
        // the latest is held and passed on once the device is within its
        // rate again, so the gateway never keeps a stale one.
        Route::Control {
            kind: ControlKind::Status,
            ..
        } => {
            if let Ok(Control::Status { online }) = parse_control(ControlKind::Status, &msg.payload)
            {
                limits.hold_status(&sender, online);
            }
            Verdict::Done
        }
        // A confirm, read or pull is dropped, which is safe: an unconfirmed
        // batch is sent again after downlink.confirm_timeout_ms and the
        // device confirms it again (the client library re-confirms a batch
        // that brings nothing new); a read is cumulative, so the next one
        // covers it; a device pulls again on every connect, and embedded
        // presence comes from the broker, external presence from the held
        // status.
        Route::Control { .. } => Verdict::Done,
        _ => refuse(sender, RejectCode::Rate, limits.rate_detail(), msg),
    }
}

/// Answers `rejected` with a retryable reason (`rate`, `disk_budget`)
/// without going to the store: the device keeps the message and resends it
/// after its receipt timeout. A publish with no device to answer is let go
/// (it was counted).
fn refuse(sender: Sender, code: RejectCode, detail: String, msg: &SouthMessage) -> Verdict {
    let Some(device) = sender else {
        return Verdict::Done;
    };
    let rejection = Rejection {
        code,
        detail,
        msg_id: sniff_msg_id(&msg.payload),
    };
    Verdict::Answer {
        answer: Box::pin(std::future::ready(Answer::Refused { device, rejection })),
        in_flight: None,
    }
}

/// Hands a control message to the downlink.
async fn forward(cfg: &IntakeConfig, device: DeviceId, kind: ControlKind, payload: Bytes) {
    if let (Some(live), ControlKind::Status) = (&cfg.presence, kind) {
        if let Ok(Control::Status { online }) = parse_control(kind, &payload) {
            let _ = live.send(if online {
                LiveEvent::DeviceOnline(device.clone())
            } else {
                LiveEvent::DeviceOffline(device.clone())
            });
        }
    }
    let control = DeviceControl {
        device,
        kind,
        payload,
    };
    if cfg.controls.send(control).await.is_err() {
        debug!("downlink stopped; control message dropped");
    }
}

fn status_body(online: bool) -> Bytes {
    Bytes::from(control::to_bytes(&Status { online, ts: None }))
}

/// Judges a publish that is not a control and sends it to the store: an
/// uplink to be stored, or a dead letter to be answered `rejected`.
fn judge(
    cfg: &IntakeConfig,
    topics: &Topics,
    store: &Store,
    route: Route,
    lines: &mut Lines,
    msg: &SouthMessage,
    shutdown: &Shutdown,
) -> AnswerFuture {
    let (device, stream) = match route {
        Route::Up { device, stream } => (device, stream),
        Route::Plain { device } => {
            let to = super::plain::Store {
                cfg,
                topics,
                store,
                shutdown,
            };
            return super::plain::judge(to, device, msg);
        }
        Route::Sparkplug { device } => {
            let to = super::plain::Store {
                cfg,
                topics,
                store,
                shutdown,
            };
            return super::sparkplug::judge(to, lines, device, msg);
        }
        Route::Unauthorized { publisher, sender } => {
            let total = metrics::count(Count::UnauthorizedFromDevices);
            if lines.admit(&sender, Instant::now()) {
                warn!(event = "device_publish_unauthorized", publisher = %Clip(&publisher.to_string()), topic = %Clip(&msg.topic), total, "device publish outside its own topics rejected");
            }
            let mut rejection = Rejection::new(
                RejectCode::Unauthorized,
                format!("{publisher} may not publish on {}", msg.topic),
            );
            rejection.msg_id = sniff_msg_id(&msg.payload);
            return reject(store, sender, rejection, msg);
        }
        Route::BadStream { device, error } => {
            let mut rejection = Rejection::new(RejectCode::BadTopic, error.to_string());
            rejection.msg_id = sniff_msg_id(&msg.payload);
            return reject(store, Some(device), rejection, msg);
        }
        Route::BadTopic { error } => {
            let rejection = Rejection::new(RejectCode::BadTopic, error.to_string());
            if lines.admit(&None, Instant::now()) {
                warn!(event = "device_publish_bad_topic", topic = %Clip(&msg.topic), reason = %Clip(&rejection.reason()), "device publish on a bad topic dead-lettered");
            }
            return reject(store, None, rejection, msg);
        }
        Route::Control { .. } => unreachable!("controls are handed on before"),
    };
    if let Some(size) = msg.oversize {
        let rejection = Rejection {
            code: RejectCode::TooLarge,
            detail: format!(
                "{size} bytes > {}, the largest packet a device may send \
                 (south.max_payload_bytes + 1024)",
                crate::south::max_packet_bytes(cfg.max_payload_bytes)
            ),
            msg_id: sniff_msg_id(&msg.payload),
        };
        return reject(store, Some(device), rejection, msg);
    }
    // What an MQTT 5 publish carried beside its envelope is judged with it.
    let v5 = &msg.v5;
    match parse_uplink(&msg.payload, cfg.max_payload_bytes)
        .and_then(|e| with_publish(e, v5.user.clone(), v5.expiry_s))
    {
        Ok(envelope) => {
            let now = store.now();
            let intake = Intake::new(&cfg.gateway, device.clone(), stream, envelope, now)
                .received_at(msg.received_ms);
            if let Some(rejection) = too_large_north(cfg, topics, &intake) {
                return reject(store, Some(device), rejection, msg);
            }
            let stored = store.intake_timed(intake);
            Box::pin(async move {
                Answer::Stored {
                    device,
                    result: stored.await,
                    plain: false,
                }
            })
        }
        Err(rejection) => {
            if rejection.code == RejectCode::NestedTooDeep {
                let total = metrics::count(Count::NestedTooDeepFromDevices);
                warn!(event = "device_envelope_too_deep", device = %device, limit = MAX_DEPTH, total, "device envelope nested too deep");
            }
            reject(store, Some(device), rejection, msg)
        }
    }
}
