//! `run()`: the gateway assembled. Starts the store, the south broker and
//! link, the north session and the two pipeline tasks, and returns when
//! one of them stops (an error) or, once `shutdown` resolves, when all of
//! them have finished in pipeline order (see [`crate::shutdown`]).
//!
//! The store's writer stopping on its own (a damaged database, a failed
//! fsync, its files gone) ends the run at once with its cause, traffic or
//! not: `/readyz` says 503 from then until the process exits.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info};

use crate::admin::Admin;
use crate::config::{Config, SouthMode};
use crate::downlink::{Downlink, DownlinkInputs, DownlinkSettings};
use crate::north::NorthSender;
use crate::protocol::topics::Topics;
use crate::shutdown::{self, wait_all, Outcome, Part, Plan};
use crate::south::door::intake::{self, IntakeConfig};
use crate::south::SouthSender;
use crate::store::{Store, StoreError};
use crate::uplink::batch::BatchConfig;
use crate::uplink::scheduler::SchedulerConfig;
use crate::uplink::{run_engine, Engine};
use crate::{health, north, south, status_file, systemd};

mod sides;
use sides::SideTasks;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    South(#[from] south::SouthError),
    #[error("{0}")]
    Admin(#[from] crate::admin::BindError),
    #[error("{0}")]
    Stopped(String),
    #[error("shutdown.grace_s ({}s) ran out; still running: {late}", grace.as_secs())]
    GraceExceeded { late: String, grace: Duration },
}

impl RunError {
    /// Whether the fix is in the config: restarting as it is cannot help
    /// (the binary exits 64 then).
    pub fn is_config(&self) -> bool {
        matches!(self, RunError::Store(e) if e.is_config())
    }
}

/// Longest wait for the north DISCONNECT to be written (the whole wait
/// when the link is down: there is nothing to write it on).
const GO_OFFLINE_MAX: Duration = Duration::from_secs(2);
/// Longest wait for a side task (alerts, the pruner) to see the shutdown
/// and return.
const SIDE_TASK_MAX: Duration = Duration::from_secs(1);
/// Device messages queued between intake and each pipeline.
const PIPELINE_QUEUE: usize = 8192;

/// Runs the gateway until `shutdown` resolves or a part of it fails.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    // A start that fails leaves nothing behind: no pid file, and no data
    // directory it made itself (no device was served, nothing is in it).
    let fresh = !cfg.data_dir.exists();
    let started = start(&cfg).await;
    let (gateway, ready_tx) = match started {
        Ok(started) => started,
        Err(e) => {
            abandon(&cfg.data_dir, fresh);
            return Err(e);
        }
    };
    run_started(&cfg, gateway, ready_tx, shutdown).await
}

/// Undoes what a failed start left: the data directory, when this start
/// made it (the pid file is undone by [`start`], which alone knows it
/// wrote one: a start refused at the store's lock must leave the running
/// gateway's).
fn abandon(data_dir: &std::path::Path, fresh: bool) {
    if fresh {
        let _ = std::fs::remove_dir_all(data_dir);
    }
}

/// Opens the store, binds the admin port and starts every part.
async fn start(cfg: &Config) -> Result<(Running, watch::Sender<bool>), RunError> {
    // A second gateway on the same store stops here, at the store's lock.
    let store = Store::open(&cfg.data_dir, &cfg.store)?;
    status_file::pid_file::write(&cfg.data_dir);
    let started = start_parts(cfg, store).await;
    if started.is_err() {
        let _ = std::fs::remove_file(cfg.data_dir.join(status_file::pid_file::PID_FILE));
    }
    started
}

/// Binds the admin port and starts every part on the open store.
async fn start_parts(
    cfg: &Config,
    store: Store,
) -> Result<(Running, watch::Sender<bool>), RunError> {
    // The pipeline's health, checked under systemd (for its watchdog) or
    // not (for /healthz), and whether the gateway has started (/readyz).
    let (health_tx, health_rx) = watch::channel(None);
    let (ready_tx, ready_rx) = watch::channel(false);
    // What the status page shows beyond the status file: the devices
    // online (kept by the status thread) and the open alerts.
    let (online_tx, online_rx) = watch::channel(status_file::Online::new());
    let (alerts_tx, alerts_rx) = watch::channel(Vec::new());
    // Bound first: a port in use stops the start before anything runs.
    let admin = match &cfg.admin {
        Some(admin_cfg) => {
            let admin = Admin::new(
                cfg.data_dir.clone(),
                store.budget().clone(),
                health_rx,
                ready_rx,
                crate::admin::Views {
                    online: online_rx,
                    alerts: alerts_rx,
                },
            );
            Some(crate::admin::bind(admin_cfg, admin).await?)
        }
        None => None,
    };
    let views = Views {
        online: online_tx,
        alerts: alerts_tx,
    };
    let gateway = Running::start(cfg, store, health_tx, admin.map(tokio::spawn), views)?;
    Ok((gateway, ready_tx))
}

/// Runs the started gateway until `shutdown` or a failure, then shuts it
/// down.
async fn run_started(
    cfg: &Config,
    mut gateway: Running,
    ready_tx: watch::Sender<bool>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    announce(cfg);
    // The store is open and both links are started (not necessarily
    // connected: an absent upstream only makes messages wait).
    let notifier = systemd::Notifier::from_env();
    notifier.notify("READY=1");
    ready_tx.send_replace(true);
    let result = gateway.until_stopped(shutdown, &ready_tx).await;
    ready_tx.send_replace(false);
    result?;
    notifier.notify("STOPPING=1");
    gateway.shut_down(cfg.shutdown_grace).await
}

/// What the parts keep for the status page.
struct Views {
    online: watch::Sender<status_file::Online>,
    alerts: watch::Sender<Vec<crate::alerts::Alert>>,
}

/// The gateway's parts, started.
struct Running {
    trigger: shutdown::Trigger,
    intake: JoinHandle<Result<(), StoreError>>,
    engine: JoinHandle<Result<(), StoreError>>,
    downlink: JoinHandle<Result<(), StoreError>>,
    sides: SideTasks,
    north: NorthSender,
    south: SouthSender,
    south_stopped: JoinHandle<String>,
    /// Resolves once the writer thread has exited: with its cause when
    /// it stopped on an error.
    store_exited: Pin<Box<dyn Future<Output = Option<String>> + Send>>,
    /// Resolves once the writer begins to stop on an error.
    store_stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Running {
    /// Starts south, north, the two pipelines and the tasks beside them,
    /// each handed the channels it reads and writes.
    fn start(
        cfg: &Config,
        store: Store,
        health: watch::Sender<Option<health::Report>>,
        admin: Option<JoinHandle<()>>,
        views: Views,
    ) -> Result<Running, RunError> {
        let store_exited = Box::pin(store.exited());
        let store_stopping = Box::pin(store.stopping());
        let (trigger, shutdown_rx) = shutdown::channel();
        let topics = Topics::new(&cfg.south.topic_prefix, &cfg.north.prefix)
            .with_plain(cfg.south.plain_topics.clone())
            .with_sparkplug(cfg.sparkplug.clone());
        let status = status_file::start(
            &cfg.data_dir,
            cfg.gateway.as_str(),
            matches!(cfg.south.mode, SouthMode::Embedded),
            views.online,
        );
        let south = south::start(&cfg.south, &topics, status.clone())?;
        let live = crate::reload::Live::of(cfg, store.clone(), topics.clone());
        let (north_tx, north) = north::start(
            &cfg.north,
            cfg.gateway.as_str(),
            &topics,
            status.clone(),
            Some(live.north.subscribe()),
        );
        let (stored_tx, stored_rx) = mpsc::channel(PIPELINE_QUEUE);
        let (controls_tx, controls_rx) = mpsc::channel(PIPELINE_QUEUE);
        let (engine_probe, engine_probed) = health::probe("uplink engine");
        let (downlink_probe, downlink_probed) = health::probe("downlink");
        let (north_probe, north_probed) = health::probe("north session");
        north_tx.answer_probes(north_probed);
        let mut probes = vec![engine_probe, downlink_probe, north_probe];
        let (site_probe, site_probed) = health::probe("site session");
        if south.outbound.answer_probes(site_probed) {
            probes.push(site_probe);
        }

        let downlink = Downlink::new(
            DownlinkSettings::of(cfg),
            store.clone(),
            north_tx.clone(),
            south.outbound.clone(),
            topics.clone(),
        );
        // What `systemctl reload` may change while the parts run.
        let downlink = tokio::spawn(downlink.run(DownlinkInputs {
            north: north.downlink,
            controls: controls_rx,
            presence: south.presence,
            shutdown: shutdown_rx.clone(),
            probed: downlink_probed,
            settings: Some(live.downlink.subscribe()),
        }));
        let (mut engine, backend_silence) = Engine::new(
            SchedulerConfig::of(&cfg.north, cfg.retry),
            BatchConfig::of(&cfg.north),
            store.clone(),
            north_tx.clone(),
            south.outbound.clone(),
            topics.clone(),
            status.clone(),
        );
        engine.settings = Some(live.uplink.subscribe());
        let engine = tokio::spawn(run_engine(
            engine,
            stored_rx,
            north.uplink,
            shutdown_rx.clone(),
            engine_probed,
        ));
        let mut intake_cfg = IntakeConfig::of(cfg, controls_tx, status, north.sparkplug_live);
        intake_cfg.limits_changed = Some(live.limits.subscribe());
        let sides = SideTasks::start(
            cfg,
            &store,
            probes,
            health,
            admin,
            (
                crate::alerts::Outlets {
                    north: north_tx.clone(),
                    topic: topics.north_alerts(),
                    open: views.alerts,
                },
                north.alerts,
            ),
            backend_silence,
            shutdown_rx.clone(),
            live,
        );
        let intake = tokio::spawn(intake::run(
            intake_cfg,
            topics,
            store,
            south.inbound,
            south.outbound.clone(),
            stored_tx,
            shutdown_rx,
        ));
        Ok(Running {
            trigger,
            intake,
            engine,
            downlink,
            sides,
            north: north_tx,
            south: south.outbound,
            south_stopped: south.stopped,
            store_exited,
            store_stopping,
        })
    }

    /// Resolves when `shutdown` does (`Ok`) or a pipeline part stops on
    /// its own (an error: each runs until the shutdown). A store that
    /// begins to stop makes the gateway unready at once (`/readyz` 503
    /// while the writer saves what it holds), then ends the run with its
    /// cause.
    async fn until_stopped(
        &mut self,
        shutdown: impl Future<Output = ()>,
        ready: &watch::Sender<bool>,
    ) -> Result<(), RunError> {
        let result = tokio::select! {
            _ = shutdown => Ok(()),
            r = &mut self.intake => Err(stopped("intake", r)),
            r = &mut self.engine => Err(stopped("uplink engine", r)),
            r = &mut self.downlink => Err(stopped("downlink", r)),
            r = &mut self.south_stopped => Err(RunError::Stopped(r.unwrap_or_else(|e| format!("south side panicked: {e}")))),
            // Only ever early: at a shutdown it exits after the pipelines.
            cause = &mut self.store_exited => Err(store_stopped(cause)),
            () = &mut self.store_stopping => {
                ready.send_replace(false);
                Err(store_stopped((&mut self.store_exited).await))
            }
        };
        self.sides.abort_unwaited();
        result
    }

    /// Spends the grace in pipeline order (see [`crate::shutdown`]).
    async fn shut_down(self, grace: Duration) -> Result<(), RunError> {
        let plan = Plan::new(Instant::now(), grace);
        info!(
            event = "shutdown_started",
            grace_s = grace.as_secs(),
            "shutting down: device intake stops"
        );
        self.trigger.begin(plan.flush_by);
        // 1-3: intake answers what it took; then the engine and the
        // downlink flush north, each once its input closes. The alerts task
        // and the pruner see the shutdown too and return.
        let mut parts = vec![
            joined("intake", self.intake),
            joined("uplink engine", self.engine),
            joined("downlink", self.downlink),
        ];
        parts.extend(self.sides.waited(Instant::now() + SIDE_TASK_MAX));
        let mut outcome = wait_all(parts, plan.pipeline_by).await;
        // 4: north leaves with the retained `online: false`; south leaves
        // too: an external session sends its last acks and DISCONNECTs, the
        // embedded broker takes no more connections (devices' sockets close
        // with the process: MQTT 3.1.1 has no DISCONNECT from the server).
        let within = plan.offline_by.saturating_duration_since(Instant::now());
        self.north.go_offline(within.min(GO_OFFLINE_MAX)).await;
        let within = plan.offline_by.saturating_duration_since(Instant::now());
        self.south.close(within.min(GO_OFFLINE_MAX)).await;
        self.south_stopped.abort();
        // 5: the writer commits what is queued and closes the database once
        // the last handle is gone.
        let store_exited = self.store_exited;
        outcome.merge(
            wait_all(
                vec![Part::new("store writer", async {
                    match store_exited.await {
                        Some(cause) => Err(cause),
                        None => Ok(()),
                    }
                })],
                plan.deadline,
            )
            .await,
        );
        finish(outcome, grace)
    }
}

/// Logs the start: what south and north are.
fn announce(cfg: &Config) {
    let south_desc = match &cfg.south.mode {
        SouthMode::Embedded => {
            let on: Vec<String> = cfg.south.listeners.iter().map(|l| l.to_string()).collect();
            format!("embedded broker on {}", on.join(", "))
        }
        SouthMode::External(site) => format!("client of {}:{}", site.host, site.port),
    };
    let north_desc = cfg
        .north
        .endpoints
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    info!(event = "gateway_started", gateway = %cfg.gateway, south = %south_desc, north = %north_desc, "ferry running");
}

/// The exit a shutdown's outcome calls for.
fn finish(outcome: Outcome, grace: Duration) -> Result<(), RunError> {
    for (task, e) in &outcome.failed {
        error!(event = "shutdown_part_failed", task, error = %e, "failed while shutting down");
    }
    if !outcome.late.is_empty() {
        let late = outcome.late.join(", ");
        error!(event = "shutdown_grace_exceeded", late = %late, grace_s = grace.as_secs(), "shutdown grace ran out; these did not finish");
        return Err(RunError::GraceExceeded { late, grace });
    }
    if let Some((task, e)) = outcome.failed.into_iter().next() {
        return Err(RunError::Stopped(format!(
            "{task} failed while shutting down: {e}"
        )));
    }
    info!(event = "gateway_stopped", "ferry stopped cleanly");
    Ok(())
}

/// A pipeline task as a shutdown [`Part`].
fn joined(name: &'static str, task: tokio::task::JoinHandle<Result<(), StoreError>>) -> Part {
    Part::new(name, async move {
        match task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("panicked: {e}")),
        }
    })
}

/// The run's end when the store's writer stopped on its own.
fn store_stopped(cause: Option<String>) -> RunError {
    RunError::Store(StoreError::Stopped(
        cause.unwrap_or_else(|| "the store writer ended".into()),
    ))
}

fn stopped(what: &str, r: Result<Result<(), StoreError>, tokio::task::JoinError>) -> RunError {
    match r {
        Ok(Ok(())) => RunError::Stopped(format!("{what} stopped: its input closed")),
        Ok(Err(e)) => RunError::Store(e),
        Err(e) => RunError::Stopped(format!("{what} panicked: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_still_running_past_the_grace_are_named_in_the_error() {
        let outcome = Outcome {
            failed: vec![],
            late: vec!["uplink engine", "store writer"],
        };
        let err = finish(outcome, Duration::from_secs(10)).unwrap_err();
        assert!(matches!(err, RunError::GraceExceeded { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "shutdown.grace_s (10s) ran out; still running: uplink engine, store writer"
        );
    }

    #[test]
    fn a_part_that_failed_while_shutting_down_fails_the_exit() {
        let outcome = Outcome {
            failed: vec![("intake", "the store writer has stopped".into())],
            late: vec![],
        };
        let err = finish(outcome, Duration::from_secs(10)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "intake failed while shutting down: the store writer has stopped"
        );
        assert!(finish(Outcome::default(), Duration::from_secs(10)).is_ok());
    }
}
