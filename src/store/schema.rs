//! The store's schema, as an ordered list of migrations applied by
//! `PRAGMA user_version`. A migration, once shipped, is never edited: a
//! change is a new entry at the end.
//!
//! Pending work is found through the partial index `uplink_pending`, which
//! holds only rows in state `stored`; start-up never scans the whole table.
//! A downlink queue is the `down_delivery` rows of one device, read by its
//! primary key `(device, seq)` from the device's cursor. Receipts for the
//! backend wait in `receipt_outbox` until the upstream acknowledges them.

use std::path::Path;
use std::time::Instant;

use rusqlite::Connection;
use tracing::info;

use super::error::StoreError;

const MIGRATIONS: &[&str] = &[
    // 1: uplink store-and-forward.
    r#"
    CREATE TABLE devices (
        device      TEXT PRIMARY KEY,
        up_seq      INTEGER NOT NULL DEFAULT 0   -- last uplink seq assigned
    ) WITHOUT ROWID;

    CREATE TABLE uplink (
        id              INTEGER PRIMARY KEY,
        device          TEXT NOT NULL,
        msg_id          TEXT NOT NULL,
        seq             INTEGER NOT NULL,
        stream          TEXT NOT NULL,
        state           TEXT NOT NULL,          -- stored | delivered | dead
        body            BLOB NOT NULL,          -- the JSON sent north
        stored_ms       INTEGER NOT NULL,
        expires_ms      INTEGER,                -- NULL: no ttl
        no_retry        INTEGER NOT NULL DEFAULT 0,
        attempts        INTEGER NOT NULL DEFAULT 0,
        next_attempt_ms INTEGER,
        last_error      TEXT,
        UNIQUE (device, msg_id)
    );
    CREATE INDEX uplink_pending ON uplink (device, seq) WHERE state = 'stored';

    CREATE TABLE uplink_history (
        uplink_id   INTEGER NOT NULL,
        at_ms       INTEGER NOT NULL,
        state       TEXT NOT NULL,
        detail      TEXT
    );
    CREATE INDEX uplink_history_by_message ON uplink_history (uplink_id);

    CREATE TABLE dead_letter (
        id          INTEGER PRIMARY KEY,
        at_ms       INTEGER NOT NULL,
        direction   TEXT NOT NULL,              -- up | down
        device      TEXT,                       -- as written, even if invalid
        msg_id      TEXT,
        uplink_id   INTEGER,
        reason      TEXT NOT NULL,              -- "code: detail"
        attempts    INTEGER NOT NULL DEFAULT 0,
        last_error  TEXT,
        topic       TEXT,
        raw         BLOB NOT NULL
    );
    CREATE INDEX dead_letter_by_device ON dead_letter (device, msg_id);
    "#,
    // 2: downlink queues and cursors.
    r#"
    ALTER TABLE devices ADD COLUMN down_seq INTEGER NOT NULL DEFAULT 0;       -- last downlink seq assigned
    ALTER TABLE devices ADD COLUMN delivered_upto INTEGER NOT NULL DEFAULT 0; -- confirm cursor
    ALTER TABLE devices ADD COLUMN read_upto INTEGER NOT NULL DEFAULT 0;      -- read cursor

    -- A downlink message's content, once, however many devices it is for.
    CREATE TABLE down_message (
        id          INTEGER PRIMARY KEY,
        msg_id      TEXT NOT NULL UNIQUE,
        body        BLOB NOT NULL,          -- the inbox entry without seq
        stored_ms   INTEGER NOT NULL,
        expires_ms  INTEGER,                -- NULL: no ttl
        swept       INTEGER NOT NULL DEFAULT 0  -- ttl expiry applied
    );
    CREATE INDEX down_message_expiring ON down_message (expires_ms) WHERE expires_ms IS NOT NULL AND swept = 0;

    -- One row per (device, seq): the device's queue, and each delivery's state.
    CREATE TABLE down_delivery (
        device      TEXT NOT NULL,
        seq         INTEGER NOT NULL,
        message_id  INTEGER NOT NULL REFERENCES down_message (id),
        state       TEXT NOT NULL,          -- stored | delivered | read | expired | dead
        at_ms       INTEGER NOT NULL,       -- last change
        PRIMARY KEY (device, seq)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX down_delivery_by_message ON down_delivery (message_id, device);
    "#,
    // 3: uplink ttl expiry found by index, for backlogs beyond what is in memory.
    r#"
    CREATE INDEX uplink_expiring ON uplink (expires_ms) WHERE state = 'stored' AND expires_ms IS NOT NULL;
    "#,
    // 4: receipts for the backend, durable until the upstream acknowledges them.
    r#"
    -- Written in the same transaction as the state change a receipt reports;
    -- deleted only once the upstream broker PUBACKs the message carrying it.
    -- AUTOINCREMENT: ids grow in commit order and are never reused, so the
    -- rows not yet in memory are always those from some id on.
    CREATE TABLE receipt_outbox (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        body    BLOB NOT NULL               -- one receipt as JSON, as sent north
    );
    "#,
    // 5: replays asked for by `ferry dlq replay` while the gateway runs.
    r#"
    -- Written by the CLI in the transaction that sets the uplink back to
    -- `stored`; taken (read and deleted) by the running gateway's engine,
    -- which then loads the message whatever its seq. A gateway that is not
    -- running finds the message at start like any stored one; a row left
    -- for a message it already holds is simply dropped.
    CREATE TABLE replay_request (
        uplink_id   INTEGER PRIMARY KEY,
        at_ms       INTEGER NOT NULL
    );
    "#,
    // 6: a downlink delivery's history, for `ferry trace` (down_delivery
    // holds only its current state).
    r#"
    -- Written in the transaction that changes the delivery's state.
    CREATE TABLE down_history (
        device      TEXT NOT NULL,
        seq         INTEGER NOT NULL,
        at_ms       INTEGER NOT NULL,
        state       TEXT NOT NULL,      -- stored | delivered | read | expired | dead
        detail      TEXT                -- why, for expired and dead
    );
    CREATE INDEX down_history_by_delivery ON down_history (device, seq);
    "#,
    // 7: retention. When an uplink left `stored`, and indexes that find
    // what is past its retention, oldest first, without a scan.
    r#"
    ALTER TABLE uplink ADD COLUMN done_ms INTEGER;  -- when it was delivered or dead-lettered
    -- Rows finished before this migration: their stored time is the best
    -- known (they are pruned no later than they would have been).
    UPDATE uplink SET done_ms = stored_ms WHERE state <> 'stored';
    CREATE INDEX uplink_delivered ON uplink (done_ms) WHERE state = 'delivered';
    CREATE INDEX dead_letter_by_time ON dead_letter (at_ms);
    CREATE INDEX down_message_by_time ON down_message (stored_ms);
    "#,
    // 8: when ferry received each message, for `ferry trace`'s `received`
    // line. Rows from before have NULL: their receipt time is not known.
    r#"
    ALTER TABLE uplink ADD COLUMN received_ms INTEGER;        -- the device's publish reached ferry
    ALTER TABLE down_message ADD COLUMN received_ms INTEGER;  -- the backend's publish reached ferry
    "#,
    // 9: replays of downlink deliveries a device nacked, asked for by
    // `ferry dlq replay`.
    r#"
    -- Written by the CLI once it checked the delivery can go again (dead,
    -- behind its device's cursor, its message kept and not past its ttl);
    -- taken by the gateway's writer, which moves the delivery to a new seq
    -- at the head of the device's queue and deletes the dead letter, in one
    -- transaction. A gateway that is not running takes it at its start.
    CREATE TABLE down_replay_request (
        dead_letter_id  INTEGER PRIMARY KEY,
        at_ms           INTEGER NOT NULL
    );
    "#,
    // 10: dead-letter alerts that survive a restart.
    r#"
    -- Dead-letter ids are never reused (AUTOINCREMENT): the alerts find new
    -- dead letters by id, and a replay or purge that deleted the newest
    -- one would otherwise hand its id to the next, which no alert would
    -- then name.
    CREATE TABLE dead_letter_new (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms       INTEGER NOT NULL,
        direction   TEXT NOT NULL,              -- up | down
        device      TEXT,                       -- as written, even if invalid
        msg_id      TEXT,
        uplink_id   INTEGER,
        reason      TEXT NOT NULL,              -- "code: detail"
        attempts    INTEGER NOT NULL DEFAULT 0,
        last_error  TEXT,
        topic       TEXT,
        raw         BLOB NOT NULL
    );
    INSERT INTO dead_letter_new (id, at_ms, direction, device, msg_id, uplink_id, reason, attempts, last_error, topic, raw)
        SELECT id, at_ms, direction, device, msg_id, uplink_id, reason, attempts, last_error, topic, raw FROM dead_letter;
    DROP TABLE dead_letter;
    ALTER TABLE dead_letter_new RENAME TO dead_letter;
    CREATE INDEX dead_letter_by_device ON dead_letter (device, msg_id);
    CREATE INDEX dead_letter_by_time ON dead_letter (at_ms);
    -- Every dead letter with an id up to `value` had its alert acknowledged
    -- by the upstream; at start the alerts go on from there. Dead letters
    -- from before this migration count as alerted.
    CREATE TABLE alert_mark (
        name    TEXT PRIMARY KEY,
        value   INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO alert_mark (name, value)
        SELECT 'dead_letters_alerted', coalesce(max(id), 0) FROM dead_letter;
    "#,
    // 11: how far each device's queue has been put into inbox batches, so
    // a confirm, read or nack can never reach a delivery ferry never sent.
    r#"
    -- Raised (never lowered) in the transaction that reads a batch, so it
    -- is durable before the batch goes out. Devices from before this
    -- migration start at their confirm cursor: a batch out at the upgrade
    -- is sent once more before its confirm counts.
    ALTER TABLE devices ADD COLUMN sent_upto INTEGER NOT NULL DEFAULT 0;
    UPDATE devices SET sent_upto = delivered_upto;
    "#,
    // 12: the store clock (store::clock), which `ttl_s` counts in from
    // here on: `expires_ms` of both directions becomes store-clock ms.
    r#"
    -- One row, rewritten every second while the gateway runs. The clock
    -- resumes from it at start, counting the downtime only if the kernel
    -- boot is the same (then BOOTTIME says how long ferry was down).
    CREATE TABLE store_clock (
        id          INTEGER PRIMARY KEY CHECK (id = 1),
        store_ms    INTEGER NOT NULL,   -- the store clock
        boot_id     TEXT NOT NULL,      -- /proc/sys/kernel/random/boot_id then
        boottime_ms INTEGER NOT NULL,   -- CLOCK_BOOTTIME then
        wall_ms     INTEGER NOT NULL    -- the wall clock then, for people only
    );
    -- The clock starts at 0 with this migration, so a ttl's new expiry is
    -- what remained of it on the wall clock (one already past: 0, due).
    UPDATE uplink SET expires_ms =
        max(0, expires_ms - CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))
        WHERE expires_ms IS NOT NULL;
    UPDATE down_message SET expires_ms =
        max(0, expires_ms - CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER))
        WHERE expires_ms IS NOT NULL;
    "#,
    // 13: store-clock stamps beside the wall-clock ones that retention and
    // the backlog age are measured from, so a wall-clock step moves
    // neither (store::prune, store::figures). Each `X_store_ms` is the
    // store clock at the commit that set `X_ms`; rows from before have
    // NULL and are judged on the wall clock alone.
    r#"
    ALTER TABLE uplink ADD COLUMN stored_store_ms INTEGER;
    ALTER TABLE uplink ADD COLUMN done_store_ms INTEGER;
    ALTER TABLE down_message ADD COLUMN stored_store_ms INTEGER;
    ALTER TABLE down_delivery ADD COLUMN at_store_ms INTEGER;
    ALTER TABLE dead_letter ADD COLUMN at_store_ms INTEGER;
    -- What retention looks for: rows without a store stamp by their wall
    -- stamp, the others by their store stamp, each oldest first.
    DROP INDEX uplink_delivered;
    CREATE INDEX uplink_delivered ON uplink (done_store_ms, done_ms) WHERE state = 'delivered';
    DROP INDEX down_message_by_time;
    CREATE INDEX down_message_by_time ON down_message (stored_store_ms, stored_ms);
    CREATE INDEX dead_letter_by_store_time ON dead_letter (at_store_ms, at_ms);
    "#,
    // 14: dedup keys outliving their message (store::prune). Under the
    // disk budget a delivered message is deleted at once to make room, but
    // what a resend of it must be answered with stays: the uplink's seq,
    // each downlink delivery's seq and state. Kept for
    // `store.min_dedup_s` under pressure, else for the retention.
    r#"
    CREATE TABLE uplink_key (
        device          TEXT NOT NULL,
        msg_id          TEXT NOT NULL,
        seq             INTEGER NOT NULL,
        done_ms         INTEGER NOT NULL,
        done_store_ms   INTEGER,
        PRIMARY KEY (device, msg_id)
    ) WITHOUT ROWID;
    CREATE INDEX uplink_key_by_time ON uplink_key (done_store_ms, done_ms);
    CREATE TABLE down_key (
        msg_id          TEXT NOT NULL,
        device          TEXT NOT NULL,
        seq             INTEGER NOT NULL,
        state           TEXT NOT NULL,
        done_ms         INTEGER NOT NULL,
        done_store_ms   INTEGER,
        PRIMARY KEY (msg_id, device)
    ) WITHOUT ROWID;
    CREATE INDEX down_key_by_time ON down_key (done_store_ms, done_ms);
    "#,
    // 15: refusals bounded per peer (store::refusal). A dead letter made
    // at the door keeps the head of what was sent, its size and hash, and
    // counts against its sender's share; past the share, refusals are
    // summed in one row. Rows from before count against no share.
    r#"
    ALTER TABLE dead_letter ADD COLUMN raw_bytes INTEGER;     -- the payload's size as sent (raw: its head)
    ALTER TABLE dead_letter ADD COLUMN raw_sha256 TEXT;       -- hex SHA-256 of the whole payload
    ALTER TABLE dead_letter ADD COLUMN topic_bytes INTEGER;   -- the topic's size as sent (topic: its head)
    ALTER TABLE dead_letter ADD COLUMN share TEXT;            -- the refusal share it counts against
    ALTER TABLE dead_letter ADD COLUMN refusals INTEGER NOT NULL DEFAULT 1; -- a summary: how many it sums
    ALTER TABLE dead_letter ADD COLUMN last_ms INTEGER;       -- a summary: its latest refusal
    -- Kept by the triggers below, so every delete (retention, purge,
    -- replay, by the gateway or the CLI) gives its room back; '*' is the
    -- sum of all shares.
    CREATE TABLE dead_letter_share (
        share       TEXT PRIMARY KEY,
        rows        INTEGER NOT NULL DEFAULT 0,
        bytes       INTEGER NOT NULL DEFAULT 0,
        summary_id  INTEGER,                    -- where refusals past the share are summed
        summarised  INTEGER NOT NULL DEFAULT 0  -- refusals summed, ever
    ) WITHOUT ROWID;
    CREATE TRIGGER dead_letter_share_in AFTER INSERT ON dead_letter
    WHEN NEW.share IS NOT NULL BEGIN
        INSERT INTO dead_letter_share (share, rows, bytes)
            SELECT s, 1, octet_length(NEW.raw) + coalesce(octet_length(NEW.topic), 0) + octet_length(NEW.reason) + 64
            FROM (SELECT NEW.share AS s UNION ALL SELECT '*')
            WHERE true
            ON CONFLICT (share) DO UPDATE SET rows = rows + 1, bytes = bytes + excluded.bytes;
    END;
    CREATE TRIGGER dead_letter_share_out AFTER DELETE ON dead_letter
    WHEN OLD.share IS NOT NULL BEGIN
        UPDATE dead_letter_share
            SET rows = rows - 1,
                bytes = bytes - (octet_length(OLD.raw) + coalesce(octet_length(OLD.topic), 0) + octet_length(OLD.reason) + 64)
            WHERE share IN (OLD.share, '*');
    END;
    "#,
];

/// Brings the database to the newest schema; each step in its own transaction.
pub fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let current: usize =
        conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
    if current > MIGRATIONS.len() {
        // Written by a newer ferry: running on it could corrupt what that
        // version relies on.
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISMATCH),
            Some(format!(
                "the store has schema version {current}, newer than this ferry's {}; run the newer ferry",
                MIGRATIONS.len()
            )),
        ));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

/// The schema version this build writes.
pub fn latest() -> usize {
    MIGRATIONS.len()
}

/// Refuses a database SQLite finds damaged, naming what is wrong: it is
/// found at start, not by the first message that touches a bad page.
pub(super) fn check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let started = Instant::now();
    let corrupt = |detail: String| StoreError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let problems: Vec<String> = conn
        .prepare("PRAGMA quick_check(5)")
        .and_then(|mut stmt| {
            stmt.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase) => {
                corrupt(e.to_string())
            }
            _ => StoreError::Sqlite(e),
        })?;
    if problems != ["ok"] {
        let found = problems.join("; ").replace('\n', " ");
        return Err(corrupt(format!(
            "database disk image is malformed ({found})"
        )));
    }
    info!(
        event = "store_checked",
        took_ms = started.elapsed().as_millis() as u64,
        "store checked"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrating_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        migrate(&mut conn).unwrap();
        let v: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v as usize, latest());
    }

    #[test]
    fn a_store_from_a_newer_ferry_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        let err = migrate(&mut conn).unwrap_err().to_string();
        assert!(err.contains("schema version 99"), "{err}");
    }

    #[test]
    fn wall_clock_expiries_become_what_remained_on_the_store_clock() {
        let mut conn = Connection::open_in_memory().unwrap();
        let before_clock = 11;
        for (i, sql) in MIGRATIONS.iter().enumerate().take(before_clock) {
            conn.execute_batch(sql).unwrap();
            conn.pragma_update(None, "user_version", (i + 1) as i64)
                .unwrap();
        }
        let now = crate::protocol::now_ms();
        for (id, expires) in [
            (1, Some(now + 3_600_000)),
            (2, Some(now - 5_000)),
            (3, None),
        ] {
            conn.execute(
                "INSERT INTO uplink (id, device, msg_id, seq, stream, state, body, stored_ms, expires_ms)
                 VALUES (?1, 'd', ?1, ?1, 's', 'stored', x'', 0, ?2)",
                rusqlite::params![id, expires],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO down_message (id, msg_id, body, stored_ms, expires_ms) VALUES (?1, ?1, x'', 0, ?2)",
                rusqlite::params![id, expires],
            )
            .unwrap();
        }
        migrate(&mut conn).unwrap();
        for table in ["uplink", "down_message"] {
            let got: Vec<Option<i64>> = conn
                .prepare(&format!("SELECT expires_ms FROM {table} ORDER BY id"))
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let left = got[0].unwrap();
            assert!((3_590_000..=3_601_000).contains(&left), "{table}: {got:?}");
            assert_eq!(
                got[1..],
                [Some(0), None],
                "{table}: past is due, none stays none"
            );
        }
    }

    #[test]
    fn pending_lookups_use_the_partial_index() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let plan: Vec<String> = conn
            .prepare("EXPLAIN QUERY PLAN SELECT DISTINCT device FROM uplink WHERE state = 'stored'")
            .unwrap()
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            plan.iter().any(|p| p.contains("uplink_pending")),
            "{plan:?}"
        );
    }
}
