//! The gateway's side tasks: the watchdog's supervisor, the admin
//! server, alerts, the store clock, the pruner and the memory trimmer.

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::Config;
use crate::health;
use crate::north::AlertEvent;
use crate::shutdown::{Part, Shutdown};
use crate::store::Store;
use crate::systemd;

/// The tasks beside the pipelines. Those that take the shutdown (alerts,
/// the pruner) are waited for, briefly, in the shutdown; the rest stop
/// with it: the watchdog's pings stop being answered once the pipeline
/// winds down (systemd's stop timeout covers the grace instead), scrapes
/// would read a store being closed, the writer persists the clock once
/// more when it closes, and trimming memory has no end.
pub(super) struct SideTasks {
    supervisor: JoinHandle<()>,
    admin: Option<JoinHandle<()>>,
    alerter: JoinHandle<()>,
    clock_keeper: JoinHandle<()>,
    pruner: JoinHandle<()>,
    trimmer: JoinHandle<()>,
    /// `systemctl reload`: the config applied again (when read from a file).
    reloader: Option<JoinHandle<()>>,
}

impl SideTasks {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        cfg: &Config,
        store: &Store,
        probes: Vec<health::Probe>,
        health: watch::Sender<Option<health::Report>>,
        admin: Option<JoinHandle<()>>,
        (outlets, events): (crate::alerts::Outlets, mpsc::Receiver<AlertEvent>),
        backend_silence: watch::Receiver<Option<Instant>>,
        shutdown: Shutdown,
        live: crate::reload::Live,
    ) -> SideTasks {
        SideTasks {
            supervisor: tokio::spawn(systemd::supervise(
                systemd::Notifier::from_env(),
                systemd::watchdog_interval(),
                store.clone(),
                probes,
                health,
            )),
            admin,
            alerter: tokio::spawn(crate::alerts::run(
                live.alerts.subscribe(),
                store.clone(),
                outlets,
                events,
                backend_silence,
                shutdown.clone(),
            )),
            // The store clock persisted every 10 s (ttl_s counts in it).
            clock_keeper: tokio::spawn(store.clone().keep_clock()),
            pruner: tokio::spawn(crate::retention::run(
                store.clone(),
                live.retention.subscribe(),
                shutdown.clone(),
            )),
            reloader: cfg
                .source
                .clone()
                .map(|source| tokio::spawn(crate::reload::run(source, live, shutdown))),
            trimmer: tokio::spawn(crate::memory::trim_periodically()),
        }
    }

    /// Stops the tasks that do not take the shutdown.
    pub(super) fn abort_unwaited(&self) {
        self.trimmer.abort();
        self.clock_keeper.abort();
        self.supervisor.abort();
        if let Some(reloader) = &self.reloader {
            reloader.abort();
        }
        if let Some(admin) = &self.admin {
            admin.abort();
        }
    }

    /// The tasks that take the shutdown, as parts done when each returns
    /// or at `by`, whichever is first. Alerts still queued when the alerts
    /// task returns are lost with the process (see [`crate::alerts`]); a
    /// batch the pruner already asked for is committed by the writer
    /// regardless.
    pub(super) fn waited(self, by: Instant) -> Vec<Part> {
        [("alerts", self.alerter), ("retention", self.pruner)]
            .into_iter()
            .map(|(name, task)| {
                Part::new(name, async move {
                    let _ = tokio::time::timeout_at(by, task).await;
                    Ok(())
                })
            })
            .collect()
    }
}
