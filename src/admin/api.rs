//! The read-only JSON API: the views behind `ferry status`, `ferry dlq
//! list|show` and `ferry trace`, the same structs the CLI prints with
//! `--json`.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::error::{echo, ApiError, ApiPath, ApiQuery};
use super::state::Admin;
use crate::dead_letter::Direction;
use crate::ops;
use crate::ops::dlq::{self, DeadLetterDetail, DeadLetterRow, Filter, Page};
use crate::ops::status::StatusView;
use crate::ops::trace::{self, TraceEvent};

/// Dead letters per page of `/api/dlq`, at most.
const MAX_PAGE: usize = 1000;

pub(super) fn routes() -> Router<Admin> {
    Router::new()
        .route("/api/status", get(status))
        .route("/api/dlq", get(dlq_list))
        .route("/api/dlq/:id", get(dlq_show))
        .route("/api/trace/:device/:msg_id", get(trace))
}

#[derive(Debug, Deserialize)]
struct StatusQuery {
    /// Devices listed by downlink backlog (default 10, at most 100).
    top: Option<usize>,
}

async fn status(
    State(admin): State<Admin>,
    ApiQuery(q): ApiQuery<StatusQuery>,
) -> Result<Json<StatusView>, ApiError> {
    let top = q.top.unwrap_or(10).min(100);
    let budget = admin.budget.limit();
    let data_dir = admin.data_dir.clone();
    let view = admin
        .read(move |conn| ops::status::status(conn, &data_dir, budget, top, ops::now_ms()))
        .await?;
    Ok(Json(view))
}

#[derive(Debug, Deserialize)]
struct DlqQuery {
    device: Option<String>,
    /// Reasons starting with this (`nacked`, `malformed`, ...).
    reason: Option<String>,
    /// `up` or `down`.
    direction: Option<String>,
    /// Only ids above this (for the next page).
    after: Option<i64>,
    /// The newest first instead (`after` is then ignored).
    newest: Option<bool>,
    /// Rows in the page (default 100, at most 1000).
    limit: Option<usize>,
}

async fn dlq_list(
    State(admin): State<Admin>,
    ApiQuery(q): ApiQuery<DlqQuery>,
) -> Result<Json<Vec<DeadLetterRow>>, ApiError> {
    let direction = match q.direction.as_deref() {
        None | Some("") => None,
        Some(text) => match Direction::parse(text) {
            Some(d) => Some(d),
            None => {
                return Err(ApiError::bad_request(format!(
                    "direction must be up or down (got {:?})",
                    echo(text)
                )))
            }
        },
    };
    let filter = Filter {
        device: q.device.filter(|d| !d.is_empty()),
        reason: q.reason.filter(|r| !r.is_empty()),
        direction,
    };
    let limit = q.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let page = match q.newest {
        Some(true) => Page::Newest,
        _ => Page::After(q.after.unwrap_or(0)),
    };
    let rows = admin
        .read(move |conn| dlq::list_page(conn, &filter, page, Some(limit)))
        .await?;
    Ok(Json(rows))
}

async fn dlq_show(
    State(admin): State<Admin>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<DeadLetterDetail>, ApiError> {
    admin
        .read(move |conn| dlq::show(conn, id))
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no dead letter {id}")))
}

async fn trace(
    State(admin): State<Admin>,
    ApiPath((device, msg_id)): ApiPath<(String, String)>,
) -> Result<Json<Vec<TraceEvent>>, ApiError> {
    let (d, m) = (device.clone(), msg_id.clone());
    let events = admin.read(move |conn| trace::trace(conn, &d, &m)).await?;
    if events.is_empty() {
        return Err(ApiError::not_found(format!(
            "nothing known of message {:?} of device {:?}",
            echo(&msg_id),
            echo(&device)
        )));
    }
    Ok(Json(events))
}
