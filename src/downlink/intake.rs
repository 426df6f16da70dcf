//! North intake: a downlink envelope from the backend is judged, its
//! recipients resolved (device ids and `@group`s), and stored once for all
//! of them; the backend's PUBACK and the `stored` receipts wait for the
//! commit. A downlink that can never be delivered is dead-lettered and
//! answered `rejected`, its receipt committed with its dead letter.

use bytes::Bytes;
use tracing::{debug, warn};

use super::{Done, Downlink};
use crate::clip::Clip;
use crate::dead_letter::{DeadLetter, Direction};
use crate::ids::{DeviceId, MsgId};
use crate::metrics::{self, Count};
use crate::north::AckToken;
use crate::protocol::depth::MAX_DEPTH;
use crate::protocol::envelope::{parse_downlink, sniff_msg_id, RejectCode, Rejection};
use crate::protocol::receipt::NorthReceipt;
use crate::store::record::downlink::{DownIntake, DownIntakeOutcome, Rejected};
use crate::store::refusal::Refusal;
use crate::store::StoreError;

impl Downlink {
    pub(super) async fn on_downlink(
        &mut self,
        topic: &str,
        payload: Bytes,
        token: AckToken,
        oversize: Option<usize>,
        received_ms: i64,
    ) -> Result<(), StoreError> {
        let now = self.store.now();
        let stored_ms = now.wall_ms;
        metrics::received(Direction::Down);
        let parsed = match oversize {
            // Only its head was kept: too large, by name if it can be read.
            Some(size) => Err(Rejection {
                code: RejectCode::TooLarge,
                detail: format!("{size} bytes > north.max_packet_bytes"),
                msg_id: sniff_msg_id(&payload),
            }),
            None => parse_downlink(&payload, self.settings.max_payload_bytes, stored_ms),
        }
        .and_then(|env| {
            let to = match self.topics.parse_north_down(topic) {
                Some(Some(device)) => vec![device.to_string()],
                _ => env.to.clone(),
            };
            let to = self.resolve(&to).map_err(|detail| Rejection {
                code: RejectCode::Malformed,
                detail,
                msg_id: Some(env.msg_id.clone()),
            })?;
            Ok((env, to))
        });
        match parsed {
            Ok((env, to)) => {
                let msg = DownIntake {
                    msg_id: env.msg_id,
                    body: Bytes::from(env.entry),
                    received_ms,
                    stored_ms,
                    // ttl_s counts time in the store (store::clock).
                    expires_ms: env
                        .ttl
                        .map(|t| now.store_ms.saturating_add(t.as_millis() as i64)),
                    to,
                    by_topic: matches!(self.topics.parse_north_down(topic), Some(Some(_))),
                    queue_cap: self.settings.cfg.queue_cap,
                };
                let stored = self.store.down_intake(msg);
                self.pending.push(Box::pin(async move {
                    Done::Intake {
                        token,
                        result: stored.await,
                    }
                }));
            }
            Err(rejection) => {
                let reason = rejection.reason();
                if rejection.code == RejectCode::NestedTooDeep {
                    let total = metrics::count(Count::NestedTooDeepFromBackend);
                    warn!(
                        event = "downlink_too_deep",
                        topic,
                        limit = MAX_DEPTH,
                        total,
                        "backend downlink nested too deep"
                    );
                }
                let dl = DeadLetter {
                    direction: Direction::Down,
                    device: self
                        .topics
                        .parse_north_down(topic)
                        .flatten()
                        .map(str::to_string),
                    msg_id: rejection.msg_id.as_ref().map(MsgId::to_string),
                    topic: topic.to_string(),
                    reason: reason.clone(),
                    raw: payload,
                    at_ms: stored_ms,
                };
                warn!(event = "downlink_rejected", device = %Clip(dl.device.as_deref().unwrap_or("")), msg_id = %Clip(dl.msg_id.as_deref().unwrap_or("")), topic = %Clip(topic), reason = %Clip(&reason), "downlink rejected");
                let receipt = NorthReceipt {
                    msg_id: dl.msg_id.clone(),
                    device: dl.device.clone(),
                    status: "rejected",
                    seq: None,
                    ts: stored_ms,
                    reason: None,
                };
                let rejected = self.store.reject_downlink(dl, receipt);
                let code = rejection.code;
                self.pending.push(Box::pin(async move {
                    Done::Rejected {
                        token,
                        code,
                        result: rejected.await,
                    }
                }));
            }
        }
        Ok(())
    }

    /// Device ids and `@group`s → distinct devices, in first-named order.
    fn resolve(&self, to: &[String]) -> Result<Vec<DeviceId>, String> {
        let mut out: Vec<DeviceId> = Vec::new();
        for name in to {
            let members = match name.strip_prefix('@') {
                Some(group) => self
                    .settings
                    .groups
                    .get(group)
                    .cloned()
                    .ok_or_else(|| format!("unknown group {name:?}"))?,
                None => vec![DeviceId::new(name.as_str())
                    .map_err(|e| format!("bad device id {name:?}: {e}"))?],
            };
            for m in members {
                if !out.contains(&m) {
                    out.push(m);
                }
            }
        }
        if out.is_empty() {
            return Err("no recipient".into());
        }
        Ok(out)
    }

    /// A downlink committed: acknowledge it upstream, report it, and wake
    /// the devices it is for.
    pub(super) async fn on_stored(
        &mut self,
        token: AckToken,
        result: Result<DownIntakeOutcome, StoreError>,
    ) -> Result<(), StoreError> {
        let out = match result {
            Ok(out) => out,
            Err(e) => {
                warn!(event = "downlink_not_stored", error = %e, "downlink not stored; left unacknowledged for the backend to resend");
                return Ok(());
            }
        };
        self.north.ack(token);
        let mut actions = Vec::new();
        for (event, new) in &out.queued {
            if *new {
                metrics::stored(Direction::Down, 1);
                actions.extend(self.scheduler.on_queued(&event.device, event.seq));
            }
        }
        super::count_events(&out.expired);
        if out.refused > 0 {
            debug!(
                refused = out.refused,
                "downlink deliveries refused: disk budget reached"
            );
            for _ in 0..out.refused {
                metrics::rejected(Direction::Down, RejectCode::DiskBudget);
            }
        }
        self.send_receipts(out.receipts);
        self.execute(actions).await
    }

    /// A rejected downlink's dead letter and receipt committed: acknowledge
    /// it upstream. If they could not be, it stays unacknowledged for the
    /// backend to resend.
    pub(super) fn on_rejected(
        &mut self,
        token: AckToken,
        code: RejectCode,
        result: Result<Rejected, StoreError>,
    ) {
        match result {
            Ok(rejected) => {
                match &rejected.refusal {
                    Refusal::Filed { summary, .. } => {
                        metrics::rejected(Direction::Down, code);
                        if let Some(summary) = summary {
                            summary.report();
                        }
                    }
                    Refusal::AtBudget { .. } => {
                        metrics::rejected(Direction::Down, RejectCode::DiskBudget)
                    }
                }
                self.north.ack(token);
                self.send_receipts([rejected.receipt]);
            }
            Err(e) => {
                warn!(event = "downlink_reject_not_dead_lettered", error = %e, "rejected downlink not dead-lettered; left unacknowledged for the backend to resend")
            }
        }
    }
}
