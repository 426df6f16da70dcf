//! What a repeated downlink is answered with, per addressed device.

use rusqlite::{params, OptionalExtension, Transaction};

use crate::ids::DeviceId;
use crate::store::error::StoreError;

type Result<T> = std::result::Result<T, StoreError>;

/// The `(seq, state)` of the delivery to `device` of the message stored as
/// `message_id` (`None`: not stored), or, once the disk budget pruned it,
/// of its dedup key among `kept` (`(device, seq, state)` each); `None` if
/// the device was never queued it.
pub(super) fn delivery(
    tx: &Transaction<'_>,
    message_id: Option<i64>,
    kept: &[(String, i64, String)],
    device: &DeviceId,
) -> Result<Option<(i64, String)>> {
    if let Some((_, s, st)) = kept.iter().find(|(d, _, _)| d == device.as_str()) {
        return Ok(Some((*s, st.clone())));
    }
    let Some(id) = message_id else {
        return Ok(None);
    };
    Ok(tx
        .prepare_cached(
            "SELECT seq, state FROM down_delivery WHERE message_id = ?1 AND device = ?2",
        )?
        .query_row(params![id, device.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}
