//! Dedup keys: what a delivered message leaves when the disk budget prunes
//! it before its retention ([`super::prune`]), so that a resend of it is
//! answered as the duplicate it is and not stored or queued again.

use rusqlite::{OptionalExtension, Transaction};

use super::error::StoreError;
use super::record::uplink::Duplicate;
use crate::ids::{DeviceId, MsgId, Seq};
use crate::state::MessageState;

type Result<T> = std::result::Result<T, StoreError>;

/// The uplink `(device, msg_id)` by its key: delivered, under its seq.
pub(super) fn uplink(
    tx: &Transaction<'_>,
    device: &DeviceId,
    msg_id: &MsgId,
) -> Result<Option<Duplicate>> {
    let seq: Option<i64> = tx
        .prepare_cached("SELECT seq FROM uplink_key WHERE device = ?1 AND msg_id = ?2")?
        .query_row([device.as_str(), msg_id.as_str()], |r| r.get(0))
        .optional()?;
    Ok(seq.map(|seq| Duplicate {
        msg_id: msg_id.clone(),
        seq: Seq(seq as u64),
        state: MessageState::Delivered,
        reason: None,
    }))
}

/// The downlink `msg_id`'s deliveries by their keys: `(device, seq,
/// state)` each, none if it was never pruned early.
pub(super) fn downlink(tx: &Transaction<'_>, msg_id: &MsgId) -> Result<Vec<(String, i64, String)>> {
    Ok(tx
        .prepare_cached("SELECT device, seq, state FROM down_key WHERE msg_id = ?1")?
        .query_map([msg_id.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?)
}
