//! `run()`: the gateway assembled. Starts the store, the south broker and
//! link, the north session and the two pipeline tasks, and returns when
//! one of them stops (an error) or `shutdown` resolves.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::info;

use crate::config::{Config, SouthMode};
use crate::downlink::{Downlink, DownlinkInputs, DownlinkSettings};
use crate::north::{NorthEvent, Tag};
use crate::protocol::topics::Topics;
use crate::store::{Store, StoreError};
use crate::uplink::intake::{self, IntakeConfig};
use crate::uplink::scheduler::{Scheduler, SchedulerConfig};
use crate::uplink::{run_engine, Engine};
use crate::{north, south};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    South(#[from] south::SouthError),
    #[error("{0}")]
    Stopped(String),
}

/// Messages per device the uplink engine holds in memory.
fn window(max_inflight: usize) -> usize {
    (max_inflight * 2).max(64)
}

/// Runs the gateway until `shutdown` resolves or a part of it fails.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let store = Store::open(&cfg.data_dir, &cfg.store)?;
    let topics = Topics::new(&cfg.south.topic_prefix, &cfg.north.prefix);
    let south = south::start(&cfg.south, &topics)?;
    let (north_tx, north_events) = north::start(&cfg.north, &topics);

    let (stored_tx, stored_rx) = mpsc::channel(8192);
    let (controls_tx, controls_rx) = mpsc::channel(8192);
    let (up_events, down_events) = fan_out(north_events);
    let downlink = Downlink::new(
        DownlinkSettings {
            cfg: cfg.downlink.clone(),
            groups: cfg.groups.clone(),
            max_payload_bytes: cfg.south.max_payload_bytes,
            max_attempts: cfg.retry.max_attempts,
        },
        store.clone(),
        north_tx.clone(),
        south.outbound.clone(),
        topics.clone(),
    );
    let mut downlink_task = tokio::spawn(downlink.run(DownlinkInputs {
        north: down_events,
        controls: controls_rx,
        broker: south.broker_events,
    }));
    let engine = Engine {
        scheduler: Scheduler::new(SchedulerConfig {
            max_inflight: cfg.north.max_inflight,
            ack_timeout: cfg.north.ack_timeout,
            retry: cfg.retry,
            window: window(cfg.north.max_inflight),
        }),
        store: store.clone(),
        north: north_tx.clone(),
        south: south.outbound.clone(),
        topics: topics.clone(),
        epoch: None,
        acks: Default::default(),
    };
    let intake_cfg = IntakeConfig {
        gateway: Arc::from(cfg.gateway.as_str()),
        max_payload_bytes: cfg.south.max_payload_bytes,
        max_north_packet: cfg.north.max_packet_bytes,
        controls: controls_tx,
    };
    let mut engine_task = tokio::spawn(run_engine(engine, stored_rx, up_events));
    let mut intake_task = tokio::spawn(intake::run(
        intake_cfg,
        topics,
        store,
        south.inbound,
        south.outbound,
        stored_tx,
    ));
    let trimmer = tokio::spawn(crate::memory::trim_periodically());
    let mut south_stopped = south.stopped;
    let south_desc = match &cfg.south.mode {
        SouthMode::Embedded => format!("embedded broker on {}", cfg.south.listen),
        SouthMode::External(site) => format!("client of {}:{}", site.host, site.port),
    };
    info!(gateway = %cfg.gateway, south = %south_desc, north = %format!("{}:{}", cfg.north.host, cfg.north.port), "ferry running");

    let result = tokio::select! {
        _ = shutdown => {
            // Pipeline order: stop taking device input (nothing uncommitted
            // was answered, so devices resend it), then leave north cleanly.
            info!("shutting down");
            intake_task.abort();
            north_tx.go_offline(Duration::from_secs(2)).await;
            Ok(())
        }
        r = &mut intake_task => Err(stopped("intake", r)),
        r = &mut engine_task => Err(stopped("uplink engine", r)),
        r = &mut downlink_task => Err(stopped("downlink", r)),
        r = &mut south_stopped => Err(RunError::Stopped(r.unwrap_or_else(|e| format!("south side panicked: {e}")))),
    };
    trimmer.abort();
    result
}

/// Splits the north session's events: uplink acks to the uplink engine,
/// downlinks to the downlink task, link changes to both.
fn fan_out(
    mut events: mpsc::Receiver<NorthEvent>,
) -> (mpsc::Receiver<NorthEvent>, mpsc::Receiver<NorthEvent>) {
    let (up_tx, up_rx) = mpsc::channel(4096);
    let (down_tx, down_rx) = mpsc::channel(4096);
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            let delivered = match &ev {
                NorthEvent::Ack(_) | NorthEvent::Refused(Tag::Uplink { .. }) => {
                    up_tx.send(ev).await.is_ok()
                }
                NorthEvent::Downlink { .. } | NorthEvent::Refused(_) | NorthEvent::Published(_) => {
                    down_tx.send(ev).await.is_ok()
                }
                NorthEvent::Up(_) | NorthEvent::Down => {
                    up_tx.send(ev.clone()).await.is_ok() && down_tx.send(ev).await.is_ok()
                }
            };
            if !delivered {
                return;
            }
        }
    });
    (up_rx, down_rx)
}

fn stopped(what: &str, r: Result<Result<(), StoreError>, tokio::task::JoinError>) -> RunError {
    match r {
        Ok(Ok(())) => RunError::Stopped(format!("{what} stopped: its input closed")),
        Ok(Err(e)) => RunError::Store(e),
        Err(e) => RunError::Stopped(format!("{what} panicked: {e}")),
    }
}
