//! The writer's downlink ops: each applied in the batch's transaction,
//! with the answer that takes its reply out of the op after the commit.

use rusqlite::Transaction;
use tracing::warn;

use super::super::clock::Now;
use super::super::{downlink, outbox, DownOp, Op, Reply, StoreError};
use super::{settle, Answer};

/// `store_ms`: the store clock of the batch, which stamps what it writes.
pub(super) fn apply_down(
    tx: &Transaction<'_>,
    op: &DownOp,
    store_ms: i64,
) -> rusqlite::Result<Answer> {
    let at = |wall_ms: i64| Now { wall_ms, store_ms };
    /// An answer that takes the reply out of the down op it was made for.
    fn answer<T: Send + 'static>(
        r: Result<T, StoreError>,
        take: fn(DownOp) -> Option<Reply<T>>,
    ) -> rusqlite::Result<Answer> {
        let v = settle(r)?;
        Ok(Box::new(move |op| {
            if let Op::Down(down) = op {
                if let Some(reply) = take(down) {
                    let _ = reply.send(v);
                }
            }
        }))
    }
    match op {
        DownOp::Intake(msg, _) => answer(downlink::intake(tx, msg, store_ms), |op| match op {
            DownOp::Intake(_, reply) => Some(reply),
            _ => None,
        }),
        DownOp::Batch {
            device,
            after,
            limit,
            now,
            ..
        } => answer(
            downlink::read_batch(tx, device, *after, *limit, *now),
            |op| match op {
                DownOp::Batch { reply, .. } => Some(reply),
                _ => None,
            },
        ),
        DownOp::Advance {
            device,
            upto,
            read,
            now_ms,
            ..
        } => answer(
            downlink::advance(tx, device, *upto, *read, at(*now_ms)),
            |op| match op {
                DownOp::Advance { reply, .. } => Some(reply),
                _ => None,
            },
        ),
        DownOp::Nack {
            device,
            seq,
            reason,
            now_ms,
            ..
        } => answer(
            downlink::nack(tx, device, *seq, reason, at(*now_ms)),
            |op| match op {
                DownOp::Nack { reply, .. } => Some(reply),
                _ => None,
            },
        ),
        DownOp::Cursors { device, .. } => answer(downlink::cursors(tx, device), |op| match op {
            DownOp::Cursors { reply, .. } => Some(reply),
            _ => None,
        }),
        DownOp::Sweep { now, .. } => answer(downlink::sweep_expired(tx, *now), |op| match op {
            DownOp::Sweep { reply, .. } => Some(reply),
            _ => None,
        }),
        DownOp::Reject { dl, receipt, .. } => {
            answer(outbox::reject(tx, dl, receipt, store_ms), |op| match op {
                DownOp::Reject { reply, .. } => Some(reply),
                _ => None,
            })
        }
        DownOp::Refuse { receipt, .. } => answer(outbox::put(tx, receipt), |op| match op {
            DownOp::Refuse { reply, .. } => Some(reply),
            _ => None,
        }),
        DownOp::OutboxPage { from, limit, .. } => {
            answer(outbox::page(tx, *from, *limit), |op| match op {
                DownOp::OutboxPage { reply, .. } => Some(reply),
                _ => None,
            })
        }
        DownOp::ReceiptsSent(ids) => {
            if let Err(e) = settle(outbox::delete(tx, ids))? {
                warn!(event = "receipts_not_deleted", error = %e, "acknowledged receipts not deleted; they will be sent again");
            }
            Ok(Box::new(|_| {}))
        }
        DownOp::ReceiptDead { id, dl, .. } => {
            answer(outbox::dead_letter(tx, *id, dl, store_ms), |op| match op {
                DownOp::ReceiptDead { reply, .. } => Some(reply),
                _ => None,
            })
        }
    }
}
