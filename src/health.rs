//! Liveness of the pipeline's long-running parts, for a supervisor's
//! watchdog (systemd's).
//!
//! A part is alive when it answers a ping through its own loop: a task
//! answers a [`Probe`] from a `select!` arm, the store writer answers a
//! ping op queued behind every write (see `Store::ping`). A part blocked
//! forever in an `.await`, a busy loop or a stuck system call answers
//! nothing, however recently it last did work, so the answer is the proof.
//!
//! One excuse: a store writer retrying a failed commit (a full disk) is
//! alive but answers nothing until the commit goes through, and the tasks
//! waiting on it may answer late too. It shows that by bumping its
//! [`Heartbeat`] on every attempt; restarting would not free the disk, so
//! the watchdog keeps being fed while it retries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

/// A counter a thread bumps each time it does a unit of work; readers see
/// whether it moved.
#[derive(Clone, Debug, Default)]
pub struct Heartbeat(Arc<AtomicU64>);

impl Heartbeat {
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The asking end of a probe: held by the watchdog.
#[derive(Clone, Debug)]
pub struct Probe {
    name: &'static str,
    tx: mpsc::Sender<oneshot::Sender<()>>,
}

/// The answering end, held by the probed task: `select!` on
/// [`Probed::recv`] and send `()` on what it yields.
#[derive(Debug)]
pub struct Probed {
    rx: mpsc::Receiver<oneshot::Sender<()>>,
}

/// A probe for the task called `name`.
pub fn probe(name: &'static str) -> (Probe, Probed) {
    // One ping outstanding is all the watchdog ever has.
    let (tx, rx) = mpsc::channel(1);
    (Probe { name, tx }, Probed { rx })
}

impl Probe {
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether the task answered by `deadline`.
    pub async fn ping(&self, deadline: tokio::time::Instant) -> bool {
        let (tx, rx) = oneshot::channel();
        let asked = tokio::time::timeout_at(deadline, self.tx.send(tx)).await;
        if !matches!(asked, Ok(Ok(()))) {
            return false;
        }
        matches!(tokio::time::timeout_at(deadline, rx).await, Ok(Ok(())))
    }
}

impl Probed {
    /// The next ping; pending forever once the watchdog is gone (so a
    /// `select!` arm on it never fires for nothing).
    pub async fn recv(&mut self) -> oneshot::Sender<()> {
        match self.rx.recv().await {
            Some(ack) => ack,
            None => std::future::pending().await,
        }
    }
}

/// What the store writer showed during one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// It answered the ping in time.
    Answered,
    /// No answer, but it attempted a commit meanwhile: it is retrying.
    Retrying,
    /// Neither: wedged.
    Silent,
}

/// One check's findings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub writer: Writer,
    /// The tasks that did not answer in time.
    pub silent: Vec<&'static str>,
}

impl Check {
    /// Whether systemd's watchdog is fed: everything answered, or the only
    /// trouble is a store retrying its commit (and tasks waiting for it).
    pub fn healthy(&self) -> bool {
        match self.writer {
            Writer::Answered => self.silent.is_empty(),
            Writer::Retrying => true,
            Writer::Silent => false,
        }
    }

    /// The parts that did not answer, for the log line.
    pub fn describe(&self) -> String {
        let mut parts: Vec<&str> = Vec::new();
        if self.writer == Writer::Silent {
            parts.push("store writer");
        }
        parts.extend(self.silent.iter().copied());
        parts.join(", ")
    }
}

/// The latest check, for the admin server's `/healthz` and `/readyz`.
#[derive(Debug, Clone)]
pub struct Report {
    pub healthy: bool,
    /// The parts that did not answer (empty when healthy).
    pub silent: String,
    pub at: tokio::time::Instant,
}

/// Where the supervisor publishes each check; `None` until the first.
pub type Reports = tokio::sync::watch::Receiver<Option<Report>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_retrying_writer_keeps_the_watchdog_fed_and_a_silent_one_stops_it() {
        let check = |writer, silent: Vec<&'static str>| Check { writer, silent };
        assert!(check(Writer::Answered, vec![]).healthy());
        assert!(!check(Writer::Answered, vec!["uplink engine"]).healthy());
        assert!(check(Writer::Retrying, vec!["uplink engine"]).healthy());
        assert!(!check(Writer::Silent, vec![]).healthy());
        assert_eq!(
            check(Writer::Silent, vec!["downlink"]).describe(),
            "store writer, downlink"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_answers_from_its_loop_is_alive_and_a_stuck_one_is_not() {
        let (alive, mut probed) = probe("engine");
        let answering = tokio::spawn(async move {
            loop {
                let ack = probed.recv().await;
                let _ = ack.send(());
            }
        });
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        assert!(alive.ping(deadline).await);
        answering.abort();
        let _ = answering.await;

        let (stuck, _probed) = probe("stuck");
        let start = tokio::time::Instant::now();
        let deadline = start + Duration::from_millis(200);
        // Nobody reads: the first ping fills the queue, the second cannot
        // even be asked; both fail at the deadline, not before.
        assert!(!stuck.ping(deadline).await);
        assert_eq!(tokio::time::Instant::now(), deadline);
        assert!(!stuck.ping(deadline + Duration::from_millis(200)).await);
    }
}
