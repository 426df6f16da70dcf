//! The admin HTTP server on `admin.listen`: read-only, for operators and
//! their tools.
//!
//! - `/metrics`: every metric of [`crate::metrics`] in the Prometheus text
//!   format; the store's gauges are read on each scrape.
//! - `/healthz`: 200 while the pipeline's parts answer the supervisor's
//!   pings (the same check that feeds systemd's watchdog), 503 naming the
//!   silent part otherwise, or when no check is recent.
//! - `/readyz`: 200 once the gateway has started, while it is healthy, not
//!   shutting down and below its disk budget; 503 with the reasons. A
//!   north outage does not make ferry unready: storing while the backend is
//!   away is its job.
//! - `/api/status`, `/api/dlq`, `/api/dlq/{id}`, `/api/trace/{device}/{msg_id}`:
//!   the CLI's views ([`crate::ops`]) as JSON.
//! - `/api/devices`, `/api/alerts`, `/api/throughput`: what the running
//!   gateway keeps in memory (the devices online, the open alerts, rates
//!   sampled from its counters; [`views`]).
//! - `/`: a status page that refreshes itself from those APIs.
//!
//! Every request must be for a name the server answers to ([`host`]:
//! its listen address, `admin.allowed_hosts`), so that no web page can
//! reach it through DNS rebinding. Every error, whoever answers it (hyper's
//! own refusals included, [`conn`]), is `{"error": "..."}` JSON (see
//! [`error`]). No wall clock makes it panic: `Date` is written only from a
//! clock the format can write ([`date`]).
//!
//! Reads go through one read-only WAL connection, one at a time, on the
//! blocking pool: they never block the store's writer, and a burst of
//! requests queues here (each waits at most `state::READ_WAIT`, then gets 503)
//! instead of piling up connections.

mod api;
mod conn;
mod date;
mod error;
pub mod host;
mod state;
mod throughput;
mod views;

pub use conn::MAX_CONNECTIONS;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tokio::sync::watch;
use tracing::info;

use self::error::ApiError;
pub use self::state::{Admin, Views};
use crate::config::AdminConfig;
use crate::ops;

/// A health check older than this is no answer: the supervisor itself (or
/// the runtime) is stuck.
const STALE_AFTER: Duration = Duration::from_secs(20);

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
#[error("admin.listen: cannot listen on {addr}: {source}")]
pub struct BindError {
    addr: SocketAddr,
    source: std::io::Error,
}

/// Binds `admin.listen` (an error names the key) and returns the server,
/// to be spawned: it runs until aborted.
pub async fn bind(
    cfg: &AdminConfig,
    admin: Admin,
) -> Result<impl std::future::Future<Output = ()>, BindError> {
    let addr = cfg.listen;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })?;
    let local = listener.local_addr().unwrap_or(addr);
    info!(event = "admin_listening", listen = %local, "admin server listening: /metrics, /healthz, /readyz, /api, /");
    let samples = admin.throughput.clone();
    let guard = host::Guard::new(host::Names::new(local, cfg.allowed_hosts.clone()));
    let app = router(admin, guard.clone());
    Ok(async move {
        tokio::join!(
            conn::serve(listener, app),
            sample(&samples),
            guard.sweeping()
        );
    })
}

/// Samples the message counters every [`throughput::EVERY`], from now on.
async fn sample(ring: &watch::Sender<throughput::Ring>) {
    let mut tick = tokio::time::interval(throughput::EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let flow = crate::metrics::flow();
        ring.send_modify(|r| r.push(ops::now_ms(), flow));
    }
}

fn router(admin: Admin, guard: Arc<host::Guard>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(api::routes())
        .merge(views::routes())
        // After every route: it covers the routes added before it.
        .method_not_allowed_fallback(error::no_method)
        .fallback(error::no_route)
        // Layers wrap every route and the fallbacks; the last is outermost:
        // the Host is checked before any route is looked up, and every
        // answer, a refusal too, gets its Date.
        .layer(axum::middleware::from_fn_with_state(guard, host::guard))
        .layer(axum::middleware::map_response(date::stamp))
        .with_state(admin)
}

async fn page() -> Html<&'static str> {
    Html(include_str!("page.html"))
}

async fn metrics(State(admin): State<Admin>) -> Result<Response, ApiError> {
    let budget = admin.budget.limit();
    let data_dir = admin.data_dir.clone();
    let view = admin
        .read(move |conn| ops::status::status(conn, &data_dir, budget, 0, ops::now_ms()))
        .await?;
    crate::metrics::set_store_gauges(&crate::metrics::StoreGauges {
        uplink_backlog: view.uplink_backlog,
        uplink_oldest_age_s: view.uplink_oldest_age_s,
        downlink_backlog: view.downlink_backlog,
        downlink_oldest_age_s: view.downlink_oldest_age_s,
        dead_letters: view.dead_letters,
        // What the budget is measured against (pages in use plus the WAL).
        store_bytes: admin.budget.used(),
        budget_bytes: view.store.budget_bytes,
    });
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::render(),
    )
        .into_response())
}

#[derive(Debug, Serialize)]
struct Probe {
    ok: bool,
    /// What is wrong, when something is.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    reasons: Vec<String>,
}

impl IntoResponse for Probe {
    fn into_response(self) -> Response {
        let status = if self.ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (status, Json(self)).into_response()
    }
}

/// Why the pipeline is not healthy, if it is not.
fn unhealthy(admin: &Admin) -> Option<String> {
    match &*admin.health.borrow() {
        None => Some("no health check yet".into()),
        Some(r) if r.at.elapsed() > STALE_AFTER => Some(format!(
            "the last health check is {} s old",
            r.at.elapsed().as_secs()
        )),
        Some(r) if !r.healthy => Some(format!("not answering: {}", r.silent)),
        Some(_) => None,
    }
}

async fn healthz(State(admin): State<Admin>) -> Probe {
    let reasons: Vec<String> = unhealthy(&admin).into_iter().collect();
    Probe {
        ok: reasons.is_empty(),
        reasons,
    }
}

async fn readyz(State(admin): State<Admin>) -> Probe {
    let mut reasons: Vec<String> = Vec::new();
    if !*admin.ready.borrow() {
        reasons.push("starting or shutting down".into());
    }
    reasons.extend(unhealthy(&admin));
    if admin.budget.over() {
        reasons.push(format!(
            "the store is at store.max_db_bytes ({} of {} bytes): new messages are refused",
            admin.budget.used(),
            admin.budget.limit()
        ));
    }
    Probe {
        ok: reasons.is_empty(),
        reasons,
    }
}
