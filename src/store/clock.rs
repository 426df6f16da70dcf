//! The store clock: the time `ttl_s` counts in, immune to wall-clock steps.
//!
//! It reads milliseconds of time the store has existed while ferry ran,
//! plus ferry's downtime whenever that can be measured. An edge box with
//! no RTC boots in the past and jumps when NTP syncs; expiry on the wall
//! clock would then kill every message with a ttl at once (a step
//! forward) or keep them forever (a step back). The store clock moves
//! only with monotonic time, so neither happens.
//!
//! Invariants:
//! - While ferry runs it advances with `tokio::time::Instant` (the
//!   kernel's CLOCK_MONOTONIC, which an NTP step never moves), from the
//!   value it resumed at.
//! - It is persisted in `store_clock` (one row) with the kernel's boot id
//!   and the CLOCK_BOOTTIME reading it was taken at: once at start, every
//!   [`MARK_EVERY`] while ferry runs, and when the writer closes.
//! - At start it resumes from that row: in the same boot it adds the
//!   BOOTTIME that passed since (ferry was down, the box ran: that time
//!   counts); after a reboot it adds nothing, the downtime being unknown.
//!   Either way it never goes back and never jumps ahead: a message can
//!   live longer than its ttl across a reboot, never shorter.
//! - `ttl_s` expiry is decided on it; retention and the backlog age count
//!   on it as well as on the wall clock (rows carry a store stamp beside
//!   their wall one, see `store::prune` and `store::figures`). Every
//!   timestamp a person or a peer reads (`ts`, `stored_ts`, `at_ms`,
//!   trace times, receipts) stays wall-clock ms.
//!
//! Reading the host (boot id, BOOTTIME) is kept to [`Boot::read`], and
//! [`resume`] is a plain function of what was persisted and what the host
//! says, so both cases have tests that do not depend on the host.

use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use tokio::time::Instant;
use tracing::info;

/// How often the running gateway persists the clock: the most it can lose
/// across a reboot (a message then lives that much longer). Not less: on
/// an idle gateway each mark is a commit (an fsync) of its own, and a
/// restart within one boot loses nothing whatever the interval (the
/// BOOTTIME since the mark is added).
pub const MARK_EVERY: Duration = Duration::from_secs(10);

/// The store clock of one run: where it resumed, and the instant it did.
#[derive(Debug, Clone, Copy)]
pub struct StoreClock {
    resumed_ms: i64,
    anchor: Instant,
}

impl StoreClock {
    /// A clock reading `resumed_ms` now.
    pub fn resumed_at(resumed_ms: i64) -> StoreClock {
        StoreClock {
            resumed_ms,
            anchor: Instant::now(),
        }
    }

    /// Its reading at `at` (an instant before it resumed reads as then).
    pub fn at(&self, at: Instant) -> i64 {
        let ran = at.saturating_duration_since(self.anchor).as_millis();
        self.resumed_ms
            .saturating_add(ran.min(i64::MAX as u128) as i64)
    }

    /// Its reading now.
    pub fn store_ms(&self) -> i64 {
        self.at(Instant::now())
    }

    /// Now on both clocks.
    pub fn now(&self) -> Now {
        Now {
            wall_ms: crate::protocol::now_ms(),
            store_ms: self.store_ms(),
        }
    }
}

/// One moment on both clocks: the wall clock for what is written down and
/// shown, the store clock for what `ttl_s` decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Wall-clock ms since the epoch: history, dead letters, receipts.
    pub wall_ms: i64,
    /// Store-clock ms: compared with `expires_ms`.
    pub store_ms: i64,
}

impl Now {
    /// Both clocks at `ms` (tests, where the two need not differ).
    #[cfg(test)]
    pub fn at(ms: i64) -> Now {
        Now {
            wall_ms: ms,
            store_ms: ms,
        }
    }
}

/// The kernel boot ferry runs in, as read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    /// `/proc/sys/kernel/random/boot_id`; empty if it cannot be read, which
    /// never matches, so the downtime is then not counted.
    pub id: String,
    /// CLOCK_BOOTTIME in ms: time since the boot, suspend included.
    pub boottime_ms: i64,
}

impl Boot {
    /// The host's boot id and BOOTTIME now.
    pub fn read() -> Boot {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Boot {
            id,
            boottime_ms: boottime_ms(),
        }
    }
}

/// CLOCK_BOOTTIME in ms (0 if the kernel refuses, which only makes the
/// next start count less downtime).
pub fn boottime_ms() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return 0;
    }
    // time_t and c_long are 32 bits on some of the boxes ferry runs on.
    #[allow(clippy::unnecessary_cast)]
    (ts.tv_sec as i64)
        .saturating_mul(1000)
        .saturating_add(ts.tv_nsec as i64 / 1_000_000)
}

/// What `store_clock` holds: the clock, and where on the host it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub store_ms: i64,
    pub boot: Boot,
    /// The wall clock then: for a person reading the table, never used.
    pub wall_ms: i64,
}

/// Where the clock starts this run, given the last mark and the host now.
/// The second value is the downtime counted (0 after a reboot).
pub fn resume(last: Option<&Mark>, boot: &Boot) -> (i64, i64) {
    match last {
        None => (0, 0),
        Some(m) if !m.boot.id.is_empty() && m.boot.id == boot.id => {
            // BOOTTIME never goes back within a boot; if a reading says it
            // did, nothing is counted rather than time taken away.
            let down = boot.boottime_ms.saturating_sub(m.boot.boottime_ms).max(0);
            (m.store_ms.saturating_add(down), down)
        }
        Some(m) => (m.store_ms, 0),
    }
}

/// The last mark persisted (`None` in a store that never ran).
pub fn load(conn: &Connection) -> rusqlite::Result<Option<Mark>> {
    conn.query_row(
        "SELECT store_ms, boot_id, boottime_ms, wall_ms FROM store_clock WHERE id = 1",
        [],
        |r| {
            Ok(Mark {
                store_ms: r.get(0)?,
                boot: Boot {
                    id: r.get(1)?,
                    boottime_ms: r.get(2)?,
                },
                wall_ms: r.get(3)?,
            })
        },
    )
    .optional()
}

/// Persists `mark`; the clock persisted never moves back.
pub fn save(conn: &Connection, mark: &Mark) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO store_clock (id, store_ms, boot_id, boottime_ms, wall_ms) VALUES (1, ?1, ?2, ?3, ?4)
         ON CONFLICT (id) DO UPDATE SET store_ms = max(store_ms, excluded.store_ms),
             boot_id = excluded.boot_id, boottime_ms = excluded.boottime_ms, wall_ms = excluded.wall_ms",
    )?
    .execute(params![mark.store_ms, mark.boot.id, mark.boot.boottime_ms, mark.wall_ms])?;
    Ok(())
}

/// Resumes the clock of the store on `conn` and persists where it
/// resumed; also returns this boot's id for the marks to come.
pub(super) fn start(conn: &Connection) -> rusqlite::Result<(StoreClock, String)> {
    let boot = Boot::read();
    let last = load(conn)?;
    let (resumed_ms, downtime_ms) = resume(last.as_ref(), &boot);
    let clock = StoreClock::resumed_at(resumed_ms);
    info!(
        event = "store_clock_resumed",
        store_ms = resumed_ms,
        downtime_counted_ms = downtime_ms,
        same_boot = last
            .as_ref()
            .is_some_and(|m| !boot.id.is_empty() && m.boot.id == boot.id),
        "store clock resumed"
    );
    save(conn, &mark(&clock, &boot.id))?;
    Ok((clock, boot.id))
}

/// The mark of `clock` now, in boot `boot_id`.
pub(super) fn mark(clock: &StoreClock, boot_id: &str) -> Mark {
    Mark {
        store_ms: clock.store_ms(),
        boot: Boot {
            id: boot_id.to_string(),
            boottime_ms: boottime_ms(),
        },
        wall_ms: crate::protocol::now_ms(),
    }
}

/// The store clock now, as a reader beside the gateway (the CLI) sees it:
/// the last mark, resumed as a start would resume it.
pub fn read_now(conn: &Connection) -> rusqlite::Result<i64> {
    Ok(resume(load(conn)?.as_ref(), &Boot::read()).0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot(id: &str, boottime_ms: i64) -> Boot {
        Boot {
            id: id.into(),
            boottime_ms,
        }
    }

    fn mark(store_ms: i64, boot: Boot) -> Mark {
        Mark {
            store_ms,
            boot,
            wall_ms: 0,
        }
    }

    fn store() -> Connection {
        let mut conn = Connection::open_in_memory().unwrap();
        super::super::schema::migrate(&mut conn).unwrap();
        conn
    }

    #[test]
    fn a_new_store_starts_at_zero() {
        assert_eq!(resume(None, &boot("b1", 5_000)), (0, 0));
        assert_eq!(load(&store()).unwrap(), None);
    }

    #[test]
    fn in_the_same_boot_the_downtime_counts() {
        let last = mark(60_000, boot("b1", 10_000));
        assert_eq!(resume(Some(&last), &boot("b1", 25_000)), (75_000, 15_000));
    }

    #[test]
    fn after_a_reboot_the_downtime_is_not_counted() {
        let last = mark(60_000, boot("b1", 10_000));
        assert_eq!(resume(Some(&last), &boot("b2", 900_000)), (60_000, 0));
        assert_eq!(resume(Some(&last), &boot("b2", 3)), (60_000, 0));
    }

    #[test]
    fn a_boottime_that_went_backwards_counts_nothing() {
        let last = mark(60_000, boot("b1", 10_000));
        assert_eq!(resume(Some(&last), &boot("b1", 9_000)), (60_000, 0));
    }

    #[test]
    fn an_unreadable_boot_id_never_counts_downtime() {
        let last = mark(60_000, boot("", 10_000));
        assert_eq!(resume(Some(&last), &boot("", 20_000)), (60_000, 0));
    }

    #[test]
    fn a_mark_persists_and_restores_and_never_moves_back() {
        let conn = store();
        let first = mark(42_000, boot("b1", 7_000));
        save(&conn, &first).unwrap();
        assert_eq!(load(&conn).unwrap(), Some(first));
        save(&conn, &mark(41_000, boot("b1", 8_000))).unwrap();
        let kept = load(&conn).unwrap().unwrap();
        assert_eq!(kept.store_ms, 42_000, "a lower reading is not written");
        assert_eq!(kept.boot.boottime_ms, 8_000);
        // Restarted 2 s later in the same boot: 42 s + 2 s.
        assert_eq!(resume(Some(&kept), &boot("b1", 10_000)).0, 44_000);
    }

    #[test]
    fn the_host_boot_reads_an_id_and_a_rising_boottime() {
        let a = Boot::read();
        let b = Boot::read();
        assert!(!a.id.is_empty());
        assert_eq!(a.id, b.id);
        assert!(b.boottime_ms >= a.boottime_ms && a.boottime_ms > 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_advances_with_monotonic_time_only() {
        let clock = StoreClock::resumed_at(5_000);
        let start = Instant::now();
        assert_eq!(clock.at(start), 5_000);
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(clock.store_ms(), 6_500);
        assert_eq!(clock.at(start - Duration::from_secs(9)), 5_000);
    }
}
