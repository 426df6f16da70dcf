//! The receipts outbox: every receipt for the backend is a row here,
//! written in the transaction of the state change it reports and deleted
//! once the upstream broker has acknowledged the message that carried it.
//! A crash or a north outage of any length loses none; the downlink task
//! reads them back in pages of bounded size.

use bytes::Bytes;
use rusqlite::{params, Transaction};

use super::budget::Budget;
use super::error::StoreError;
use super::refusal::{self, Kept, Refusal};
use crate::config::RefusalShares;
use crate::protocol::envelope::RejectCode;
use crate::protocol::receipt::NorthReceipt;
use crate::store::record::downlink::{reason, DeliveryEvent, OutboxReceipt, Rejected};

type Result<T> = std::result::Result<T, StoreError>;

/// Commits one receipt.
pub fn put(tx: &Transaction<'_>, receipt: &NorthReceipt) -> Result<OutboxReceipt> {
    let body = serde_json::to_vec(receipt).map_err(|e| StoreError::CorruptRow {
        table: "receipt_outbox",
        detail: format!("a receipt does not serialize: {e}"),
    })?;
    tx.prepare_cached("INSERT INTO receipt_outbox (body) VALUES (?1)")?
        .execute([&body[..]])?;
    Ok(OutboxReceipt {
        id: tx.last_insert_rowid(),
        body: Bytes::from(body),
    })
}

/// Commits the receipt of each event, stamped `ts`.
pub fn report<'a>(
    tx: &Transaction<'_>,
    events: impl IntoIterator<Item = &'a DeliveryEvent>,
    ts: i64,
) -> Result<Vec<OutboxReceipt>> {
    events
        .into_iter()
        .map(|e| put(tx, &NorthReceipt::of(e.delivery(), ts)))
        .collect()
}

/// Up to `limit` receipts with `id >= from`, in id order.
pub fn page(tx: &Transaction<'_>, from: i64, limit: usize) -> Result<Vec<OutboxReceipt>> {
    let rows = tx
        .prepare_cached("SELECT id, body FROM receipt_outbox WHERE id >= ?1 ORDER BY id LIMIT ?2")?
        .query_map(params![from, limit as i64], |r| {
            Ok(OutboxReceipt {
                id: r.get(0)?,
                body: Bytes::from(r.get::<_, Vec<u8>>(1)?),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

/// The upstream acknowledged these receipts.
pub fn delete(tx: &Transaction<'_>, ids: &[i64]) -> Result<()> {
    let mut stmt = tx.prepare_cached("DELETE FROM receipt_outbox WHERE id = ?1")?;
    for id in ids {
        stmt.execute([id])?;
    }
    Ok(())
}

/// A receipt the upstream will never take: out of the outbox and into the
/// dead letters, in one transaction. Returns the dead letter's id.
pub fn dead_letter(tx: &Transaction<'_>, id: i64, dl: &Kept, store_ms: i64) -> Result<i64> {
    delete(tx, &[id])?;
    Ok(refusal::file_unshared(tx, dl, store_ms)?)
}

/// A downlink refused at intake: its dead letter, filed against the
/// backend's share, and its `rejected` receipt (naming the row that holds
/// it), in one transaction; at the disk budget nothing but the receipt,
/// which then says `disk_budget`.
pub fn reject(
    tx: &Transaction<'_>,
    dl: &Kept,
    receipt: &NorthReceipt,
    shares: &RefusalShares,
    budget: &Budget,
    store_ms: i64,
) -> Result<Rejected> {
    let refusal = refusal::file(tx, dl, shares, budget, store_ms)?;
    let reason = match &refusal {
        Refusal::Filed { id, .. } => reason::rejected(&dl.reason, *id),
        Refusal::AtBudget { detail } => format!("{}: {detail}", RejectCode::DiskBudget.as_str()),
    };
    let receipt = NorthReceipt {
        reason: Some(reason),
        ..receipt.clone()
    };
    Ok(Rejected {
        refusal,
        receipt: put(tx, &receipt)?,
    })
}
