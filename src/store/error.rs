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
}
