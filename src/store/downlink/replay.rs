//! Downlink deliveries sent again by `ferry dlq replay` (see
//! `ops::dlq::down`): taken in the downlink sweep's transaction.

use rusqlite::{params, OptionalExtension, Transaction};

use super::rows::{message_msg_id, seq};
use crate::ids::DeviceId;
use crate::state::DeliveryState;
use crate::store::clock::Now;
use crate::store::error::StoreError;
use crate::store::record::downlink::DeliveryEvent;

type Result<T> = std::result::Result<T, StoreError>;

/// Takes the replays `ferry dlq replay` asked for (`down_replay_request`):
/// each delivery its device nacked moves, with its history, to a new seq
/// at the head of the device's queue, `stored` again, and its dead letter
/// goes. The device's cursor is past the old seq (the CLI checked, and
/// cursors never move back), so no batch sees a gap; the device takes it
/// as any new delivery. A request whose delivery is no longer dead is
/// dropped.
pub(super) fn take(tx: &Transaction<'_>, now: Now) -> Result<Vec<DeliveryEvent>> {
    let now_ms = now.wall_ms;
    type Asked = (i64, Option<String>, Option<String>, Option<String>);
    let asked: Vec<Asked> = tx
        .prepare_cached(
            "SELECT r.dead_letter_id, d.device, d.topic, d.reason FROM down_replay_request r
             LEFT JOIN dead_letter d ON d.id = r.dead_letter_id ORDER BY r.dead_letter_id LIMIT 1000",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut events = Vec::new();
    for (dead_letter, device, topic, why) in asked {
        tx.prepare_cached("DELETE FROM down_replay_request WHERE dead_letter_id = ?1")?
            .execute([dead_letter])?;
        let old = topic
            .as_deref()
            .and_then(|t| t.strip_prefix("seq "))
            .and_then(|s| s.parse::<i64>().ok());
        let (Some(device), Some(old)) = (device.and_then(|d| DeviceId::new(d).ok()), old) else {
            continue;
        };
        let mid: Option<i64> = tx
            .prepare_cached(
                "SELECT message_id FROM down_delivery WHERE device = ?1 AND seq = ?2 AND state = 'dead'",
            )?
            .query_row(params![device.as_str(), old], |r| r.get(0))
            .optional()?;
        let Some(mid) = mid else { continue };
        let new: i64 = tx
            .prepare_cached(
                "UPDATE devices SET down_seq = down_seq + 1 WHERE device = ?1 RETURNING down_seq",
            )?
            .query_row([device.as_str()], |r| r.get(0))?;
        tx.prepare_cached(
            "UPDATE down_delivery SET seq = ?3, state = 'stored', at_ms = ?4, at_store_ms = ?5
             WHERE device = ?1 AND seq = ?2",
        )?
        .execute(params![device.as_str(), old, new, now_ms, now.store_ms])?;
        tx.prepare_cached("UPDATE down_history SET seq = ?3 WHERE device = ?1 AND seq = ?2")?
            .execute(params![device.as_str(), old, new])?;
        tx.prepare_cached(
            "INSERT INTO down_history (device, seq, at_ms, state, detail) VALUES (?1, ?2, ?3, 'stored', ?4)",
        )?
        .execute(params![
            device.as_str(),
            new,
            now_ms,
            format!(
                "replayed: dead letter {dead_letter} ({}), was seq {old}",
                why.unwrap_or_default()
            )
        ])?;
        tx.prepare_cached("DELETE FROM dead_letter WHERE id = ?1")?
            .execute([dead_letter])?;
        events.push(DeliveryEvent {
            device,
            seq: seq(new),
            msg_id: message_msg_id(tx, mid)?,
            state: DeliveryState::Stored,
            reason: None,
        });
    }
    Ok(events)
}
