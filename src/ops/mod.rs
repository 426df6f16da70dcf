//! Operator tools behind the `ferry` CLI: dead letters ([`dlq`]), a
//! message's history ([`trace`]) and the gateway's state ([`status`]).
//!
//! Every function here works while the gateway runs. Reads use their own
//! read-only connection (a WAL reader: it never blocks the gateway's writer
//! nor is blocked by it). Changes are one short `BEGIN IMMEDIATE`
//! transaction each, with a busy timeout, and touch only rows the gateway
//! holds nothing of in memory (dead letters, dead messages); a replay
//! reaches the running gateway through `replay_request` (see
//! [`crate::uplink::REPLAY_POLL`]). The views are `Serialize`, for `--json`
//! and for a later HTTP API. [`crate::live`] is the gateway's side: the status
//! file it keeps for [`status`].

pub mod dlq;
pub mod duration;
pub mod status;
pub mod table;
pub mod trace;

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::store::DB_FILE;

/// How long a CLI command waits for the gateway's writer to let go.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a command could not do its job; the CLI prints it as one line.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The operator asked for something that cannot be.
    #[error("{0}")]
    Usage(String),
    /// The store could not be read or changed.
    #[error("{0}")]
    Runtime(String),
}

fn sqlite(what: &str) -> impl Fn(rusqlite::Error) -> OpsError + '_ {
    move |e| OpsError::Runtime(format!("{what}: {e}"))
}

/// The store in `data_dir`, read-only.
pub fn open_read(data_dir: &Path) -> Result<Connection, OpsError> {
    open(data_dir, OpenFlags::SQLITE_OPEN_READ_ONLY)
}

/// The store in `data_dir`, for a change.
pub fn open_write(data_dir: &Path) -> Result<Connection, OpsError> {
    open(data_dir, OpenFlags::SQLITE_OPEN_READ_WRITE)
}

fn open(data_dir: &Path, mode: OpenFlags) -> Result<Connection, OpsError> {
    let path = data_dir.join(DB_FILE);
    if !path.exists() {
        return Err(OpsError::Runtime(format!(
            "no store at {}: check gateway.data_dir, or start the gateway once",
            path.display()
        )));
    }
    let what = format!("cannot open {}", path.display());
    // Never create: a mistyped data_dir must not leave an empty store.
    let conn = Connection::open_with_flags(&path, mode | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(sqlite(&what))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sqlite(&what))?;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sqlite(&what))?;
    // The CLI reads the tables of its own build's schema: an older store
    // lacks some, a newer one may mean other things by them.
    let ours = crate::store::schema_version() as i64;
    if version != ours {
        let fix = if version < ours {
            "start this version of the gateway once to migrate it"
        } else {
            "use the ferry that wrote it"
        };
        return Err(OpsError::Runtime(format!(
            "{} has schema version {version}, this ferry reads {ours}: {fix}",
            path.display()
        )));
    }
    Ok(conn)
}

/// Gives `ferry.db-wal` and `ferry.db-shm` the owner of `ferry.db` back.
/// Run as root against a stopped gateway, SQLite creates them owned by
/// root (a read-only connection also leaves them behind), and the gateway,
/// running as its own user, could then not open its store. Call it once
/// the command's connection is closed.
pub fn restore_ownership(data_dir: &Path) -> Result<(), OpsError> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let db = data_dir.join(DB_FILE);
    let Ok(owner) = std::fs::metadata(&db) else {
        return Ok(());
    };
    for suffix in ["-wal", "-shm"] {
        let path = data_dir.join(format!("{DB_FILE}{suffix}"));
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if (meta.uid(), meta.gid()) != (owner.uid(), owner.gid()) {
            std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid())).map_err(
                |e| {
                    OpsError::Runtime(format!(
                        "cannot give {} back to the store's owner (uid {}): {e}; the gateway may not open its store",
                        path.display(),
                        owner.uid()
                    ))
                },
            )?;
        }
    }
    Ok(())
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    crate::protocol::now_ms()
}

/// `ms` since the epoch as `YYYY-MM-DD HH:MM:SS.mmmZ` (UTC).
pub fn fmt_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let milli = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{milli:03}Z",
        tod / 3600,
        tod % 3600 / 60,
        tod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_utc_calendar_dates() {
        assert_eq!(fmt_ms(0), "1970-01-01 00:00:00.000Z");
        assert_eq!(fmt_ms(951_782_400_123), "2000-02-29 00:00:00.123Z");
        assert_eq!(fmt_ms(1_796_083_200_000), "2026-12-01 00:00:00.000Z");
    }

    /// Chowns to another user: root only, so the `system-tests` feature's.
    #[cfg(feature = "system-tests")]
    #[test]
    fn files_sqlite_made_as_root_go_back_to_the_stores_owner() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "this test chowns a file to another user: run it as root"
        );
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join(DB_FILE);
        std::fs::write(&db, b"").unwrap();
        std::os::unix::fs::chown(&db, Some(4321), Some(4322)).unwrap();
        let shm = dir.path().join("ferry.db-shm");
        std::fs::write(&shm, b"").unwrap();
        restore_ownership(dir.path()).unwrap();
        let meta = std::fs::metadata(&shm).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (4321, 4322));
        assert!(!dir.path().join("ferry.db-wal").exists());
    }

    #[test]
    fn a_missing_store_is_a_runtime_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_read(dir.path()).unwrap_err();
        assert!(matches!(err, OpsError::Runtime(_)), "{err:?}");
        assert!(err.to_string().contains("ferry.db"), "{err}");
        assert!(!dir.path().join("ferry.db").exists());
    }
}
