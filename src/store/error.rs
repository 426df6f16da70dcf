//! What a store request can fail with: the one error type of the store's
//! boundary, and which of its cases mean the store is gone for good.

use std::path::PathBuf;

use crate::state::IllegalMove;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Another process holds the store's lock (see `lock`).
    #[error(
        "gateway.data_dir {} is in use by another running gateway ({holder}): \
         stop it, or give this one a data_dir of its own",
        dir.display()
    )]
    InUse { dir: PathBuf, holder: String },
    /// The file system gives no lock: nothing would keep a second gateway
    /// off the store.
    #[error(
        "gateway.data_dir {} cannot be locked ({source}): ferry locks its ferry.db so that \
         no second gateway runs on the same store, and this file system gives no lock; \
         put gateway.data_dir on a local file system (ext4, xfs, btrfs, tmpfs)",
        dir.display()
    )]
    Unlockable {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the database {path} is corrupt: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    /// A row holds what this build cannot read (an unknown state name, a bad
    /// id): written by a newer ferry or by hand. Only the request that read
    /// it fails.
    #[error("a row of {table} cannot be read: {detail}")]
    CorruptRow { table: &'static str, detail: String },
    /// The request asked for a move the state machine forbids; nothing of it
    /// was written.
    #[error("refused: {0}")]
    IllegalMove(#[from] IllegalMove),
    #[error("the store stopped: {0}")]
    Stopped(String),
    #[error("the store writer has stopped")]
    Closed,
}

impl StoreError {
    /// Whether the store is gone for good (stopped, or its writer ended):
    /// nothing more can be asked of it, and the gateway stops with the cause.
    pub fn is_fatal(&self) -> bool {
        matches!(self, StoreError::Stopped(_) | StoreError::Closed)
    }

    /// Whether the fix is in the config (`gateway.data_dir`), not in what
    /// runs: restarting as it is cannot help.
    pub fn is_config(&self) -> bool {
        matches!(self, StoreError::Unlockable { .. })
    }
}

/// An I/O error in words: SQLite's for its extended code (a failed fsync
/// says "fsync"), the code, and the OS error behind it (`errno`, 0 if
/// none).
pub(super) fn io_words(e: &rusqlite::Error, errno: i32) -> String {
    let extended = match e {
        rusqlite::Error::SqliteFailure(f, _) => f.extended_code,
        _ => return e.to_string(),
    };
    let os = match errno {
        0 => String::new(),
        n => format!("; the OS said: {}", std::io::Error::from_raw_os_error(n)),
    };
    format!(
        "{}; SQLite code {extended}{os}",
        rusqlite::ffi::code_to_str(extended)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_fsync_is_named_in_words_with_the_os_error() {
        let e = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR_FSYNC),
            Some("disk I/O error".into()),
        );
        let words = io_words(&e, libc::EIO);
        assert!(
            words.contains("(fsync)")
                && words.contains("1034")
                && words.contains("Input/output error"),
            "{words}"
        );
    }
}
