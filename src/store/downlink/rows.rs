//! The small readers and writers every downlink request shares: seqs in
//! and out of SQL, a row's msg_id and state read back (a value this build
//! cannot read is an error, never a guess), a delivery's history.

use rusqlite::{params, Transaction};

use crate::ids::{MsgId, Seq};
use crate::state::DeliveryState;
use crate::store::error::StoreError;
use crate::store::record::downlink::DeliveryEvent;

type Result<T> = std::result::Result<T, StoreError>;

pub(super) fn seq(v: i64) -> Seq {
    Seq(v.max(0) as u64)
}

/// A seq as an SQL parameter. Seqs the store assigns fit an i64 (SQLite's
/// INTEGER); one past `i64::MAX` can only be a device's word (`pull
/// {"after": 2^63}`, a `confirm` or `nack` as large) and is past every seq
/// the store holds, so it saturates there. A plain `as i64` would wrap it
/// to a negative number, before every seq: a pull after it would replay
/// the whole queue.
pub(super) fn sql(s: Seq) -> i64 {
    i64::try_from(s.0).unwrap_or(i64::MAX)
}

pub(super) fn msg_id(s: String) -> Result<MsgId> {
    MsgId::new(s.as_str()).map_err(|e| StoreError::CorruptRow {
        table: "down_message",
        detail: format!("msg_id {s:?}: {e}"),
    })
}

/// A delivery's state as written; a name this build does not know is an
/// error, never taken for `stored`.
pub(super) fn state(s: &str) -> Result<DeliveryState> {
    DeliveryState::parse(s).ok_or_else(|| StoreError::CorruptRow {
        table: "down_delivery",
        detail: format!("unknown state {s:?}"),
    })
}

/// Appends each delivery's change to its history (`down_history`), in the
/// transaction that makes it.
pub(super) fn history<'a>(
    tx: &Transaction<'_>,
    events: impl IntoIterator<Item = &'a DeliveryEvent>,
    at_ms: i64,
) -> Result<()> {
    let mut stmt = tx.prepare_cached(
        "INSERT INTO down_history (device, seq, at_ms, state, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for e in events {
        stmt.execute(params![
            e.device.as_str(),
            sql(e.seq),
            at_ms,
            e.state.as_str(),
            e.reason
        ])?;
    }
    Ok(())
}

pub(super) fn message_msg_id(tx: &Transaction<'_>, message_id: i64) -> Result<MsgId> {
    Ok(message_of(tx, message_id)?.0)
}

/// A downlink message's msg_id and when it was stored.
pub(super) fn message_of(tx: &Transaction<'_>, message_id: i64) -> Result<(MsgId, i64)> {
    let (s, stored_ms): (String, i64) = tx
        .prepare_cached("SELECT msg_id, stored_ms FROM down_message WHERE id = ?1")?
        .query_row([message_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok((msg_id(s)?, stored_ms))
}
