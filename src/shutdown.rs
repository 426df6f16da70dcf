//! Graceful shutdown: signalled once, seen by every part, in pipeline order
//! (mini-redis `shutdown.rs` style, with a deadline attached).
//!
//! [`run`](crate::run) begins it with a [`Trigger`] when SIGTERM or SIGINT
//! arrives and plans the `shutdown.grace_s` budget with a [`Plan`]. The
//! parts finish by themselves and `run` sees them finish through their join
//! handles ([`wait_all`]):
//! 1. intake stops taking device publishes: what a device sent and was not
//!    answered, it sends again (a message is never answered `stored` before
//!    its commit, so nothing answered is lost);
//! 2. intake answers everything it already sent to the store, then drops
//!    its senders: the uplink engine and the downlink task see their input
//!    close;
//! 3. both flush what is due north until nothing is in flight or
//!    [`Plan::flush_by`] passes (what is left stays stored for the next run);
//! 4. `run` publishes the retained `online: false` and disconnects north;
//! 5. the store writer commits what is queued, once the last handle is
//!    gone, and closes the database;
//! 6. all of it within the grace, or `run` names what did not finish.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Begins the shutdown; held by `run()` only.
#[derive(Debug)]
pub struct Trigger {
    tx: watch::Sender<Option<Instant>>,
}

/// Seen by the pipeline parts; cheap to clone.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<Option<Instant>>,
}

/// A trigger and the first of its receivers.
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(None);
    (Trigger { tx }, Shutdown { rx })
}

impl Trigger {
    /// Tells every part to finish, flushing north until `flush_by`.
    pub fn begin(&self, flush_by: Instant) {
        self.tx.send_replace(Some(flush_by));
    }
}

impl Shutdown {
    /// When what is due north must have been flushed by, once shutdown has
    /// begun; `None` before.
    pub fn flush_by(&self) -> Option<Instant> {
        *self.rx.borrow()
    }

    /// Resolves once shutdown has begun (or `run()` is gone).
    pub async fn begun(&mut self) {
        let _ = self.rx.wait_for(Option::is_some).await;
    }
}

/// Where a pipeline task is in its life: taking input, or (its input
/// closed in a shutdown) flushing what it took, until a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    Flushing { until: Instant },
}

impl Phase {
    pub fn is_running(self) -> bool {
        self == Phase::Running
    }

    /// The end of the flush, while flushing.
    pub fn until(self) -> Option<Instant> {
        match self {
            Phase::Running => None,
            Phase::Flushing { until } => Some(until),
        }
    }
}

/// How the grace is spent, from the signal on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The engine and the downlink stop flushing north.
    pub flush_by: Instant,
    /// Intake, engine and downlink must have finished.
    pub pipeline_by: Instant,
    /// The north session must have written its DISCONNECT.
    pub offline_by: Instant,
    /// Everything, the store writer included, must have finished.
    pub deadline: Instant,
}

impl Plan {
    /// 70% of the grace to flush, then 10% each for the pipeline to stop,
    /// for north to go offline, and for the store to close.
    pub fn new(start: Instant, grace: Duration) -> Plan {
        let at = |tenths: u32| start + grace * tenths / 10;
        Plan {
            flush_by: at(7),
            pipeline_by: at(8),
            offline_by: at(9),
            deadline: start + grace,
        }
    }
}

/// A part that finishes by itself once shutdown has begun: its name and
/// its completion (`Err` says how it failed).
pub struct Part {
    pub name: &'static str,
    done: Pin<Box<dyn Future<Output = Result<(), String>> + Send>>,
}

impl Part {
    pub fn new(
        name: &'static str,
        done: impl Future<Output = Result<(), String>> + Send + 'static,
    ) -> Part {
        Part {
            name,
            done: Box::pin(done),
        }
    }
}

/// What became of the parts waited for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Parts that finished with an error, and the error.
    pub failed: Vec<(&'static str, String)>,
    /// Parts still running at the deadline, in the order given.
    pub late: Vec<&'static str>,
}

impl Outcome {
    pub fn merge(&mut self, other: Outcome) {
        self.failed.extend(other.failed);
        self.late.extend(other.late);
    }
}

/// Waits for every part, all at once, until `deadline`. A part still
/// running then is left alone (it is named, not cancelled).
pub async fn wait_all(parts: Vec<Part>, deadline: Instant) -> Outcome {
    let waits = parts
        .into_iter()
        .map(|p| async move { (p.name, tokio::time::timeout_at(deadline, p.done).await) });
    let mut outcome = Outcome::default();
    for (name, result) in futures_util::future::join_all(waits).await {
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => outcome.failed.push((name, e)),
            Err(_) => outcome.late.push(name),
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(name: &'static str, secs: u64) -> Part {
        Part::new(name, async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            Ok(())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_part_past_the_deadline_is_named_late_and_the_wait_ends_at_the_deadline() {
        let start = Instant::now();
        let deadline = start + Duration::from_secs(10);
        let outcome = wait_all(
            vec![
                sleeper("intake", 1),
                sleeper("uplink engine", 60),
                Part::new("downlink", std::future::pending()),
            ],
            deadline,
        )
        .await;
        assert_eq!(outcome.late, ["uplink engine", "downlink"]);
        assert!(outcome.failed.is_empty());
        assert_eq!(Instant::now(), deadline);
    }

    #[tokio::test(start_paused = true)]
    async fn parts_that_finish_in_time_end_the_wait_early_and_failures_are_kept() {
        let start = Instant::now();
        let outcome = wait_all(
            vec![
                sleeper("intake", 2),
                Part::new("downlink", async { Err("the store stopped".to_string()) }),
            ],
            start + Duration::from_secs(10),
        )
        .await;
        assert_eq!(
            outcome,
            Outcome {
                failed: vec![("downlink", "the store stopped".to_string())],
                late: vec![],
            }
        );
        assert_eq!(Instant::now(), start + Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_is_seen_by_every_clone_with_its_flush_deadline() {
        let (trigger, mut a) = channel();
        let mut b = a.clone();
        assert_eq!(a.flush_by(), None);
        let at = Instant::now() + Duration::from_secs(7);
        trigger.begin(at);
        a.begun().await;
        b.begun().await;
        assert_eq!(b.flush_by(), Some(at));
    }

    #[test]
    fn the_plan_spends_the_grace_in_pipeline_order() {
        let start = Instant::now();
        let plan = Plan::new(start, Duration::from_secs(10));
        assert_eq!(plan.flush_by, start + Duration::from_secs(7));
        assert!(plan.flush_by < plan.pipeline_by);
        assert!(plan.pipeline_by < plan.offline_by);
        assert!(plan.offline_by < plan.deadline);
        assert_eq!(plan.deadline, start + Duration::from_secs(10));
    }
}
