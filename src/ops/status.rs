//! `ferry status`: the links (from the running gateway's status file, see
//! [`crate::status_file`]) and the store's figures (read from the database).

use std::path::Path;

use rusqlite::Connection;
use serde::Serialize;

use super::{sqlite, OpsError};
use crate::status_file::{self as live, Backend, Link, NorthLink};
use crate::store::clock::{self, Now};
use crate::store::figures::ShareUse;
use crate::store::{figures, Holder, DB_FILE};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceBacklog {
    pub device: String,
    pub messages: i64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StoreSize {
    pub db_bytes: u64,
    pub wal_bytes: u64,
    pub total_bytes: u64,
    /// `store.max_db_bytes`, against which the gateway measures the pages
    /// in use plus the WAL (the files can be larger: free pages).
    pub budget_bytes: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatusView {
    /// Whether a gateway is running on this data directory.
    pub running: bool,
    /// `gateway.id` of the running gateway.
    pub gateway: Option<String>,
    pub pid: Option<u32>,
    pub started_ms: Option<i64>,
    /// Seconds since it started, on this machine's clock.
    pub uptime_s: Option<i64>,
    pub south_mode: Option<String>,
    /// The running gateway's version.
    pub version: Option<String>,
    /// The north link, its node and its last failure.
    pub north: Option<NorthLink>,
    pub south: Option<Link>,
    pub devices_online: Option<usize>,
    /// Whether the backend acks what is sent north (a running gateway's).
    pub backend: Option<Backend>,
    /// Uplinks stored and not yet acked by the backend.
    pub uplink_backlog: i64,
    /// The devices with the most of them, most first.
    pub uplink_top: Vec<DeviceBacklog>,
    /// Age of the oldest of them, in seconds.
    pub uplink_oldest_age_s: Option<f64>,
    /// Downlink queue entries past their device's confirm cursor: stored
    /// and not yet confirmed (an entry that expired or died ahead of the
    /// cursor counts until the cursor passes it).
    pub downlink_backlog: i64,
    /// The devices with the most of them, most first.
    pub downlink_top: Vec<DeviceBacklog>,
    pub downlink_oldest_age_s: Option<f64>,
    pub dead_letters: i64,
    /// The largest shares of the dead letters refused at the door (whose
    /// refusals they are), by bytes.
    pub dead_letter_top: Vec<ShareUse>,
    pub store: StoreSize,
}

fn age_s(age: Option<std::time::Duration>) -> Option<f64> {
    age.map(|a| a.as_secs_f64())
}

/// The status of the gateway on `data_dir`, `top` devices by downlink
/// backlog, the store against its budget of `budget_bytes`. The backlog
/// ages are on the store clock as the store last saved it, resumed as a
/// start would (`now_ms` for rows from before it had one).
pub fn status(
    conn: &Connection,
    data_dir: &Path,
    budget_bytes: u64,
    top: usize,
    now_ms: i64,
) -> Result<StatusView, OpsError> {
    let read = sqlite("cannot read the store's figures");
    let backlog = figures::backlog(conn).map_err(&read)?;
    let now = Now {
        wall_ms: now_ms,
        store_ms: clock::read_now(conn).map_err(&read)?,
    };
    let oldest = figures::oldest(conn, now).map_err(&read)?;
    let by_device = |top: Vec<(String, i64)>| {
        top.into_iter()
            .map(|(device, messages)| DeviceBacklog { device, messages })
            .collect()
    };
    let uplink_top = by_device(figures::uplink_top(conn, top).map_err(&read)?);
    let downlink_top = by_device(figures::downlink_top(conn, top).map_err(&read)?);
    let dead_letter_top = figures::dead_letter_top(conn, top).map_err(&read)?;
    let dead_letters: i64 = conn
        .query_row("SELECT count(*) FROM dead_letter", [], |r| r.get(0))
        .map_err(read)?;
    let size = |name: String| std::fs::metadata(data_dir.join(name)).map_or(0, |m| m.len());
    let db_bytes = size(DB_FILE.to_string());
    let wal_bytes = size(format!("{DB_FILE}-wal"));
    // The gateway holding the store's lock (found without touching the
    // database file); `ferry.pid` only when /proc/locks cannot name it.
    let running = match crate::store::holder(data_dir) {
        Holder::Nobody => None,
        Holder::Pid(pid) => Some(pid),
        Holder::Unknown => live::pid_file::read(data_dir),
    };
    let live = live::read(data_dir, running);
    Ok(StatusView {
        running: live.is_some(),
        gateway: live.as_ref().map(|l| l.gateway.clone()),
        pid: live.as_ref().map(|l| l.pid),
        started_ms: live.as_ref().map(|l| l.started_ms),
        uptime_s: live.as_ref().map(|l| (now_ms - l.started_ms).max(0) / 1000),
        south_mode: live.as_ref().map(|l| l.south_mode.clone()),
        version: live.as_ref().and_then(|l| l.version.clone()),
        north: live.as_ref().map(|l| l.north.clone()),
        south: live.as_ref().map(|l| l.south),
        devices_online: live.as_ref().and_then(|l| l.devices_online),
        backend: live.as_ref().and_then(|l| l.backend),
        uplink_backlog: backlog.uplinks as i64,
        uplink_top,
        uplink_oldest_age_s: age_s(oldest.uplink),
        downlink_backlog: backlog.downlinks as i64,
        downlink_top,
        downlink_oldest_age_s: age_s(oldest.downlink),
        dead_letters,
        dead_letter_top,
        store: StoreSize {
            db_bytes,
            wal_bytes,
            total_bytes: db_bytes + wal_bytes,
            budget_bytes,
        },
    })
}
