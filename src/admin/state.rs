//! What the admin server's handlers share ([`Admin`]) and what the
//! running gateway's parts keep in memory for its page ([`Views`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{watch, Mutex};

use super::error::ApiError;
use super::throughput;
use crate::health::Reports;
use crate::ops::{self, OpsError};
use crate::store::budget::Budget;

/// Longest a request waits for the read connection.
const READ_WAIT: Duration = Duration::from_secs(10);

/// What the running gateway's parts keep in memory for the page: the
/// devices online (the status thread's) and the open alerts (the alerts
/// task's).
pub struct Views {
    pub online: watch::Receiver<crate::status_file::Online>,
    pub alerts: watch::Receiver<Vec<crate::alerts::Alert>>,
}

/// What the handlers share.
#[derive(Clone)]
pub struct Admin {
    pub(super) data_dir: PathBuf,
    pub(super) budget: Budget,
    pub(super) health: Reports,
    pub(super) ready: watch::Receiver<bool>,
    pub(super) views: Arc<Views>,
    /// The throughput samples, written by the server's sampler.
    pub(super) throughput: Arc<watch::Sender<throughput::Ring>>,
    /// The read connection, opened on first use and again after an error.
    pub(super) conn: Arc<Mutex<Option<Connection>>>,
}

impl Admin {
    pub fn new(
        data_dir: PathBuf,
        budget: Budget,
        health: Reports,
        ready: watch::Receiver<bool>,
        views: Views,
    ) -> Admin {
        Admin {
            data_dir,
            budget,
            health,
            ready,
            views: Arc::new(views),
            throughput: Arc::new(watch::Sender::new(throughput::Ring::default())),
            conn: Arc::new(Mutex::new(None)),
        }
    }

    /// Runs `read` on the read connection, on the blocking pool.
    pub(super) async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, OpsError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let mut slot = tokio::time::timeout(READ_WAIT, self.conn.clone().lock_owned())
            .await
            .map_err(|_| ApiError::busy())?;
        let data_dir = self.data_dir.clone();
        let taken = slot.take();
        let (conn, result) = tokio::task::spawn_blocking(move || {
            let conn = match taken {
                Some(conn) => conn,
                None => match ops::open_read(&data_dir) {
                    Ok(conn) => conn,
                    Err(e) => return (None, Err(e)),
                },
            };
            let result = read(&conn);
            // A failed read may mean a broken connection: open a new one.
            let keep = result.is_ok().then_some(conn);
            (keep, result)
        })
        .await
        .map_err(|e| ApiError::internal(format!("read task failed: {e}")))?;
        *slot = conn;
        result.map_err(ApiError::from)
    }
}
