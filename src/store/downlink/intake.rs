//! A downlink from the backend in: stored once, queued for every addressed
//! device that does not have it yet, each known device answered with its
//! delivery's current state; at the disk budget, what is known is still
//! answered and nothing new is written.

use rusqlite::{params, OptionalExtension, Transaction};

use super::known;
use super::rows::{history, message_msg_id, seq, state};
use crate::store::error::StoreError;
use crate::store::outbox;

type Result<T> = std::result::Result<T, StoreError>;
use crate::ids::DeviceId;
use crate::protocol::envelope::RejectCode;
use crate::protocol::receipt::NorthReceipt;
use crate::state::DeliveryState;
use crate::store::budget::Budget;
use crate::store::record::downlink::{
    reason, DeliveryEvent, DownIntake, DownIntakeOutcome, OutboxReceipt,
};

/// Stores the message once and queues it for every addressed device that
/// does not have it yet; `store_ms` (the store clock) stamps what it
/// writes beside `msg.stored_ms`.
pub fn intake(
    tx: &Transaction<'_>,
    msg: &DownIntake,
    budget: &Budget,
    store_ms: i64,
) -> Result<DownIntakeOutcome> {
    let existing: Option<i64> = tx
        .prepare_cached("SELECT id FROM down_message WHERE msg_id = ?1")?
        .query_row([msg.msg_id.as_str()], |r| r.get(0))
        .optional()?;
    // A message pruned under the disk budget left a key per delivery:
    // its devices are answered from those, never queued it again.
    let kept = match existing {
        Some(_) => Vec::new(),
        None => crate::store::keys::downlink(tx, &msg.msg_id)?,
    };
    let mut message_id = existing;
    let mut out = DownIntakeOutcome::default();
    let mut refused = Vec::new();
    for device in &msg.to {
        if let Some((s, st)) = known::delivery(tx, message_id, &kept, device)? {
            let event = DeliveryEvent {
                device: device.clone(),
                seq: seq(s),
                msg_id: msg.msg_id.clone(),
                state: state(&st)?,
                reason: None,
            };
            out.queued.push((event, false));
            continue;
        }
        // At the budget a device the store knows is answered; a new
        // delivery (and the message, the first time) is not written.
        let body_cost = match message_id {
            Some(_) => 0,
            None => (msg.body.len() + 2 * msg.msg_id.as_str().len()) as u64 + 96,
        };
        if !budget.admit(body_cost + 2 * device.as_str().len() as u64 + 64) {
            refused.push(device.clone());
            continue;
        }
        let message_id = match message_id {
            Some(id) => id,
            None => {
                tx.prepare_cached("INSERT INTO down_message (msg_id, body, stored_ms, expires_ms, received_ms, stored_store_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?
                    .execute(params![msg.msg_id.as_str(), &msg.body[..], msg.stored_ms, msg.expires_ms, msg.received_ms, store_ms])?;
                let id = tx.last_insert_rowid();
                message_id = Some(id);
                id
            }
        };
        tx.prepare_cached(
            "INSERT INTO devices (device) VALUES (?1) ON CONFLICT (device) DO NOTHING",
        )?
        .execute([device.as_str()])?;
        let s: i64 = tx
            .prepare_cached(
                "UPDATE devices SET down_seq = down_seq + 1 WHERE device = ?1 RETURNING down_seq",
            )?
            .query_row([device.as_str()], |r| r.get(0))?;
        tx.prepare_cached(
            "INSERT INTO down_delivery (device, seq, message_id, state, at_ms, at_store_ms) VALUES (?1, ?2, ?3, 'stored', ?4, ?5)",
        )?
        .execute(params![device.as_str(), s, message_id, msg.stored_ms, store_ms])?;
        let event = DeliveryEvent {
            device: device.clone(),
            seq: seq(s),
            msg_id: msg.msg_id.clone(),
            state: DeliveryState::Stored,
            reason: None,
        };
        out.queued.push((event, true));
        // The queue keeps `queue_cap` undelivered deliveries: the one that
        // many places back loses its automatic resend.
        let old = s - msg.queue_cap as i64;
        if old >= 1 {
            let pushed: Option<i64> = tx
                .prepare_cached(
                    "UPDATE down_delivery SET state = 'expired', at_ms = ?3, at_store_ms = ?4
                     WHERE device = ?1 AND seq = ?2 AND state = 'stored' RETURNING message_id",
                )?
                .query_row(
                    params![device.as_str(), old, msg.stored_ms, store_ms],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(mid) = pushed {
                out.expired.push(DeliveryEvent {
                    device: device.clone(),
                    seq: seq(old),
                    msg_id: message_msg_id(tx, mid)?,
                    state: DeliveryState::Expired,
                    reason: Some(reason::queue_cap(msg.queue_cap)),
                });
            }
        }
    }
    let new = out.queued.iter().filter(|(_, new)| *new).map(|(e, _)| e);
    history(tx, new.chain(&out.expired), msg.stored_ms)?;
    let queued = out.queued.iter().map(|(e, _)| e);
    out.receipts = outbox::report(tx, queued.chain(&out.expired), msg.stored_ms)?;
    out.refused = refused.len();
    out.receipts.extend(refuse_at_budget(
        tx,
        msg,
        &refused,
        out.queued.is_empty(),
        budget,
    )?);
    Ok(out)
}

/// The `rejected` receipts of the deliveries of `msg` refused at the disk
/// budget: one for the message when `all` were (naming the device if the
/// topic did), else one per refused device.
fn refuse_at_budget(
    tx: &Transaction<'_>,
    msg: &DownIntake,
    refused: &[DeviceId],
    all: bool,
    budget: &Budget,
) -> Result<Vec<OutboxReceipt>> {
    let receipt = |device: Option<&DeviceId>| NorthReceipt {
        msg_id: Some(msg.msg_id.to_string()),
        device: device.map(DeviceId::to_string),
        status: "rejected",
        seq: None,
        ts: msg.stored_ms,
        reason: Some(format!(
            "{}: {}",
            RejectCode::DiskBudget.as_str(),
            budget.refusal_detail()
        )),
    };
    match refused {
        [] => Ok(Vec::new()),
        [first, ..] if all => {
            let named = msg.by_topic.then_some(first);
            Ok(vec![outbox::put(tx, &receipt(named))?])
        }
        some => some
            .iter()
            .map(|d| outbox::put(tx, &receipt(Some(d))))
            .collect(),
    }
}
