//! Downlink rows: messages stored once, per-device queues with contiguous
//! seqs, durable cursors and per-delivery states. Every function runs inside
//! the writer's open transaction and returns what its commit makes true,
//! including every delivery whose state it changed; the receipt of each is
//! committed in the outbox ([`super::outbox`]) in the same transaction.
//! The records and the words of every reason are in
//! [`super::record::downlink`].
//!
//! Seqs from a device are its own word: they are bound saturated ([`sql`])
//! and reach no further than `devices.sent_upto`, the last seq read into a
//! batch for it, raised in the transaction that reads the batch.

use bytes::Bytes;
use rusqlite::{params, OptionalExtension, Transaction};

use super::clock::Now;
use super::error::StoreError;
use super::outbox;
use super::refusal::HEAD;
use crate::ids::{DeviceId, Seq};
use crate::state::DeliveryState;
use crate::store::record::downlink::{
    reason, BatchEntry, BatchRead, CursorMove, Cursors, DeliveryEvent, Swept,
};

mod intake;
mod known;
mod replay;
mod rows;

use rows::{history, message_msg_id, message_of, msg_id, seq, sql, state};

pub use intake::intake;

type Result<T> = std::result::Result<T, StoreError>;

/// `(seq, state, msg_id, body, expires_ms)` of one queue entry.
type QueueRow = (i64, String, String, Vec<u8>, Option<i64>);

pub fn cursors(tx: &Transaction<'_>, device: &DeviceId) -> Result<Cursors> {
    Ok(tx
        .prepare_cached(
            "SELECT down_seq, delivered_upto, read_upto FROM devices WHERE device = ?1",
        )?
        .query_row([device.as_str()], |r| {
            Ok(Cursors {
                head: seq(r.get(0)?),
                delivered_upto: seq(r.get(1)?),
                read_upto: seq(r.get(2)?),
            })
        })
        .optional()?
        .unwrap_or_default())
}

/// Reads up to `limit` queue entries after `after`; a stored delivery whose
/// ttl has passed by `now` (store clock) is expired on the way and sent as
/// a tombstone.
pub fn read_batch(
    tx: &Transaction<'_>,
    device: &DeviceId,
    after: Seq,
    limit: usize,
    now: Now,
) -> Result<BatchRead> {
    let now_ms = now.wall_ms;
    let mut out = BatchRead {
        head: cursors(tx, device)?.head,
        ..Default::default()
    };
    let rows: Vec<QueueRow> = tx
        .prepare_cached(
            "SELECT d.seq, d.state, m.msg_id, m.body, m.expires_ms FROM down_delivery d
             JOIN down_message m ON m.id = d.message_id
             WHERE d.device = ?1 AND d.seq > ?2 ORDER BY d.seq LIMIT ?3",
        )?
        .query_map(params![device.as_str(), sql(after), limit as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (s, st, id, body, expires_ms) in rows {
        let mut st = state(&st)?;
        let id = msg_id(id)?;
        if st == DeliveryState::Stored && expires_ms.is_some_and(|e| e <= now.store_ms) {
            st.check_move(DeliveryState::Expired)?;
            tx.prepare_cached("UPDATE down_delivery SET state = 'expired', at_ms = ?3, at_store_ms = ?4 WHERE device = ?1 AND seq = ?2")?
                .execute(params![device.as_str(), s, now_ms, now.store_ms])?;
            st = DeliveryState::Expired;
            out.expired.push(DeliveryEvent {
                device: device.clone(),
                seq: seq(s),
                msg_id: id.clone(),
                state: st,
                reason: Some(reason::TTL.into()),
            });
        }
        let body = matches!(
            st,
            DeliveryState::Stored | DeliveryState::Delivered | DeliveryState::Read
        )
        .then(|| Bytes::from(body));
        out.entries.push(BatchEntry {
            seq: seq(s),
            msg_id: id,
            state: st,
            body,
        });
    }
    if let Some(last) = out.entries.last() {
        tx.prepare_cached("UPDATE devices SET sent_upto = max(sent_upto, ?2) WHERE device = ?1")?
            .execute(params![device.as_str(), sql(last.seq)])?;
    }
    history(tx, &out.expired, now_ms)?;
    out.receipts = outbox::report(tx, &out.expired, now_ms)?;
    Ok(out)
}

/// The last seq of `device` read into a batch ([`read_batch`]): as far as
/// anything was sent to it, so as far as its confirm, read or nack reaches.
fn sent_upto(tx: &Transaction<'_>, device: &DeviceId) -> Result<Seq> {
    Ok(tx
        .prepare_cached("SELECT sent_upto FROM devices WHERE device = ?1")?
        .query_row([device.as_str()], |r| r.get(0))
        .optional()?
        .map_or(Seq(0), seq))
}

/// Moves the confirm cursor to `upto` (never backwards, never past what
/// was sent: a device's word for a seq it was never sent marks nothing
/// delivered), and with `read` the read cursor too, at `now`.
pub fn advance(
    tx: &Transaction<'_>,
    device: &DeviceId,
    upto: Seq,
    read: bool,
    now: Now,
) -> Result<CursorMove> {
    let now_ms = now.wall_ms;
    let mut c = cursors(tx, device)?;
    let upto = upto.min(sent_upto(tx, device)?).min(c.head);
    let mut events = Vec::new();
    let mut delivered_after_ms = Vec::new();
    if upto > c.delivered_upto {
        let step = Step {
            cursor: "delivered_upto",
            from: DeliveryState::Stored,
            to: DeliveryState::Delivered,
        };
        for (event, stored_ms) in step.apply(tx, device, c.delivered_upto, upto, now)? {
            delivered_after_ms.push(now_ms - stored_ms);
            events.push(event);
        }
        c.delivered_upto = upto;
    }
    if read && upto > c.read_upto {
        let step = Step {
            cursor: "read_upto",
            from: DeliveryState::Delivered,
            to: DeliveryState::Read,
        };
        events.extend(
            step.apply(tx, device, c.read_upto, upto, now)?
                .into_iter()
                .map(|(event, _)| event),
        );
        c.read_upto = upto;
    }
    events.sort_by_key(|e| (e.seq, e.state == DeliveryState::Read));
    history(tx, &events, now_ms)?;
    let receipts = outbox::report(tx, &events, now_ms)?;
    Ok(CursorMove {
        cursors: c,
        confirmed: Some(upto),
        events,
        delivered_after_ms,
        receipts,
    })
}

/// One cursor's move: deliveries in `from` within the range go to `to`.
struct Step {
    /// The `devices` column holding the cursor.
    cursor: &'static str,
    from: DeliveryState,
    to: DeliveryState,
}

impl Step {
    /// Moves the deliveries in `(after, upto]` and the cursor to `upto`;
    /// each moved with its message's `stored_ms`.
    fn apply(
        &self,
        tx: &Transaction<'_>,
        device: &DeviceId,
        after: Seq,
        upto: Seq,
        now: Now,
    ) -> Result<Vec<(DeliveryEvent, i64)>> {
        self.from.check_move(self.to)?;
        let moved: Vec<(i64, i64)> = tx
            .prepare_cached(
                "UPDATE down_delivery SET state = ?5, at_ms = ?4, at_store_ms = ?7
                 WHERE device = ?1 AND seq > ?2 AND seq <= ?3 AND state = ?6 RETURNING seq, message_id",
            )?
            .query_map(
                params![device.as_str(), sql(after), sql(upto), now.wall_ms, self.to.as_str(), self.from.as_str(), now.store_ms],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .collect::<rusqlite::Result<_>>()?;
        let mut events = Vec::with_capacity(moved.len());
        for (s, mid) in moved {
            let (msg_id, stored_ms) = message_of(tx, mid)?;
            let event = DeliveryEvent {
                device: device.clone(),
                seq: seq(s),
                msg_id,
                state: self.to,
                reason: None,
            };
            events.push((event, stored_ms));
        }
        tx.prepare_cached(&format!(
            "UPDATE devices SET {} = ?2 WHERE device = ?1",
            self.cursor
        ))?
        .execute(params![device.as_str(), sql(upto)])?;
        Ok(events)
    }
}

/// The device can never take delivery `at`: dead-letter it for this device
/// with `reason` (worded by the caller, [`reason::nacked`]). If it is the
/// next one after the cursor, the cursor moves past it. A delivery never
/// sent to the device is not its to refuse: that nack changes nothing.
pub fn nack(
    tx: &Transaction<'_>,
    device: &DeviceId,
    at: Seq,
    reason: &str,
    now: Now,
) -> Result<CursorMove> {
    let now_ms = now.wall_ms;
    if at > sent_upto(tx, device)? {
        return Ok(CursorMove {
            cursors: cursors(tx, device)?,
            ..CursorMove::default()
        });
    }
    let dead: Option<i64> = tx
        .prepare_cached(
            "UPDATE down_delivery SET state = 'dead', at_ms = ?3, at_store_ms = ?4
             WHERE device = ?1 AND seq = ?2 AND state IN ('stored', 'delivered') RETURNING message_id",
        )?
        .query_row(params![device.as_str(), sql(at), now_ms, now.store_ms], |r| r.get(0))
        .optional()?;
    let mut c = cursors(tx, device)?;
    let Some(mid) = dead else {
        return Ok(CursorMove {
            cursors: c,
            ..CursorMove::default()
        });
    };
    let id = message_msg_id(tx, mid)?;
    tx.prepare_cached(
        "INSERT INTO dead_letter (at_ms, direction, device, msg_id, reason, topic, raw, raw_bytes, at_store_ms)
         SELECT ?1, 'down', ?2, msg_id, ?3, ?4, substr(body, 1, ?7), length(body), ?6 FROM down_message WHERE id = ?5",
    )?
    .execute(params![
        now_ms,
        device.as_str(),
        reason,
        format!("seq {}", at.0),
        mid,
        now.store_ms,
        HEAD as i64
    ])?;
    if at == c.delivered_upto.next() {
        c.delivered_upto = at;
        tx.prepare_cached("UPDATE devices SET delivered_upto = ?2 WHERE device = ?1")?
            .execute(params![device.as_str(), sql(at)])?;
    }
    let event = DeliveryEvent {
        device: device.clone(),
        seq: at,
        msg_id: id,
        state: DeliveryState::Dead,
        reason: Some(reason.to_string()),
    };
    history(tx, [&event], now_ms)?;
    let receipts = outbox::report(tx, [&event], now_ms)?;
    Ok(CursorMove {
        cursors: c,
        confirmed: None,
        events: vec![event],
        delivered_after_ms: Vec::new(),
        receipts,
    })
}

/// Expires every stored delivery of messages whose ttl passed by `now`
/// (store clock); what it writes down is stamped with both clocks.
pub fn sweep_expired(tx: &Transaction<'_>, now: Now) -> Result<Swept> {
    let now_ms = now.wall_ms;
    let due: Vec<(i64, String)> = tx
        .prepare_cached(
            "SELECT id, msg_id FROM down_message WHERE expires_ms IS NOT NULL AND swept = 0 AND expires_ms <= ?1 LIMIT 1000",
        )?
        .query_map([now.store_ms], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut events = Vec::new();
    for (mid, id) in due {
        let id = msg_id(id)?;
        let moved: Vec<(String, i64)> = tx
            .prepare_cached(
                "UPDATE down_delivery SET state = 'expired', at_ms = ?2, at_store_ms = ?3
                 WHERE message_id = ?1 AND state = 'stored' RETURNING device, seq",
            )?
            .query_map(params![mid, now_ms, now.store_ms], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        for (d, s) in moved {
            if let Ok(device) = DeviceId::new(d) {
                events.push(DeliveryEvent {
                    device,
                    seq: seq(s),
                    msg_id: id.clone(),
                    state: DeliveryState::Expired,
                    reason: Some(reason::TTL.into()),
                });
            }
        }
        tx.prepare_cached("UPDATE down_message SET swept = 1 WHERE id = ?1")?
            .execute([mid])?;
    }
    history(tx, &events, now_ms)?;
    let replayed = replay::take(tx, now)?;
    let reported = events.iter().chain(&replayed);
    let receipts = outbox::report(tx, reported, now_ms)?;
    Ok(Swept {
        events,
        replayed,
        receipts,
    })
}
