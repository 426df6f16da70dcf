//! Replaying a downlink delivery its device nacked.
//!
//! The device's confirm cursor is past the nacked seq (a nack of the next
//! one moves it; a nack further ahead waits for the device to confirm past
//! it), and a device drops what it has already confirmed, so the delivery
//! cannot go again under its old seq. It goes under a new one at the head
//! of the device's queue, with the same msg_id: the CLI checks it can and
//! asks (`down_replay_request`); the gateway's writer moves the delivery,
//! its history with it, and deletes the dead letter, in one transaction
//! (`store::downlink::take_replays`). The backend gets `stored` with the
//! new seq, then `delivered` (or `failed` again).

use rusqlite::{params, Connection, OptionalExtension};

use crate::store::clock as store_clock;

/// The seq a nacked delivery's dead letter names (its topic is `seq N`);
/// `None` for a downlink refused at the door.
pub(super) fn seq_of(topic: Option<&str>) -> Option<i64> {
    topic?.strip_prefix("seq ")?.parse().ok()
}

/// Why delivery `seq` of `device` cannot be replayed now, if it cannot.
/// Its ttl is judged on the store clock, as the gateway judges it.
pub(super) fn check(
    conn: &Connection,
    device: Option<&str>,
    seq: i64,
) -> rusqlite::Result<Option<String>> {
    let Some(device) = device else {
        return Ok(Some("it names no device".into()));
    };
    let found: Option<(String, i64, Option<i64>)> = conn
        .query_row(
            "SELECT d.state, v.delivered_upto, m.expires_ms FROM down_delivery d
             JOIN devices v ON v.device = d.device JOIN down_message m ON m.id = d.message_id
             WHERE d.device = ?1 AND d.seq = ?2",
            params![device, seq],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    Ok(match found {
        None => Some(format!(
            "delivery seq {seq} of {device} is no longer in the store (pruned, or replayed already); the backend must send it again"
        )),
        Some((state, _, _)) if state != "dead" => Some(format!(
            "delivery seq {seq} of {device} is {state}, not dead (replayed already?)"
        )),
        Some((_, cursor, _)) if cursor < seq => Some(format!(
            "{device} has not confirmed past seq {seq} yet (its cursor is at {cursor}); replay it once it has"
        )),
        Some((_, _, Some(expires))) if expires <= store_clock::read_now(conn)? => {
            Some("its ttl_s passed; the backend must send it again".into())
        }
        Some(_) => None,
    })
}
