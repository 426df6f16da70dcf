//! The status page's own views, from the running gateway's memory rather
//! than the store: `/api/devices` (the devices online, paged),
//! `/api/alerts` (the open alerts) and `/api/throughput` (the chart's
//! rates, see [`super::throughput`]).

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::error::{echo, ApiError, ApiQuery};
use super::state::Admin;
use super::throughput::Series;
use crate::alerts::Alert;

/// Devices per page of `/api/devices`, at most.
pub const MAX_DEVICES_PAGE: usize = 1000;

pub(super) fn routes() -> Router<Admin> {
    Router::new()
        .route("/api/devices", get(devices))
        .route("/api/alerts", get(alerts))
        .route("/api/throughput", get(throughput))
}

#[derive(Debug, Deserialize)]
struct DevicesQuery {
    /// Devices skipped, in id order (default 0).
    offset: Option<String>,
    /// Devices in the page (default 100, 1 to [`MAX_DEVICES_PAGE`]).
    limit: Option<String>,
}

/// One device online.
#[derive(Debug, Serialize)]
struct DeviceRow {
    device: String,
    since_ms: i64,
    last_seen_ms: i64,
}

/// A page of the devices online.
#[derive(Debug, Serialize)]
struct DevicesPage {
    /// Devices online in all.
    total: usize,
    offset: usize,
    limit: usize,
    devices: Vec<DeviceRow>,
}

/// `text` as a whole number within `min..=max`, or a 400 naming `name`.
fn number(
    name: &str,
    text: Option<&str>,
    default: usize,
    min: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        return Ok(default);
    };
    match text.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ApiError::bad_request(format!(
            "{name} must be a whole number from {min} to {max} (got {:?})",
            echo(text)
        ))),
    }
}

async fn devices(
    State(admin): State<Admin>,
    ApiQuery(q): ApiQuery<DevicesQuery>,
) -> Result<Json<DevicesPage>, ApiError> {
    let offset = number("offset", q.offset.as_deref(), 0, 0, u32::MAX as usize)?;
    let limit = number("limit", q.limit.as_deref(), 100, 1, MAX_DEVICES_PAGE)?;
    let online = admin.views.online.borrow();
    let devices = online
        .iter()
        .skip(offset)
        .take(limit)
        .map(|(d, seen)| DeviceRow {
            device: d.as_str().to_string(),
            since_ms: seen.since_ms,
            last_seen_ms: seen.last_seen_ms,
        })
        .collect();
    Ok(Json(DevicesPage {
        total: online.len(),
        offset,
        limit,
        devices,
    }))
}

async fn alerts(State(admin): State<Admin>) -> Json<Vec<Alert>> {
    Json(admin.views.alerts.borrow().clone())
}

async fn throughput(State(admin): State<Admin>) -> Json<Series> {
    let now = crate::metrics::flow();
    Json(admin.throughput.borrow().series(crate::ops::now_ms(), now))
}
