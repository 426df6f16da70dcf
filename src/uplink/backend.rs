//! Telling operators whether the backend is there. The scheduler decides
//! (see `scheduler::backend`); this reports what it decided to the log,
//! `/metrics`, the status file and the alerts task, once per change.

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::metrics;
use crate::protocol::now_ms;
use crate::status_file::{LiveEvent, LiveSender};

/// How often, at most, the status file is told of the backend's acks.
const STATUS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// How often, at most, a backend behind is logged.
const BEHIND_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Since when the backend is silent (`None`: it is not); the alerts task
/// watches it.
pub type Silence = watch::Receiver<Option<Instant>>;

pub struct BackendReport {
    live: LiveSender,
    silence: watch::Sender<Option<Instant>>,
    /// The silence last reported.
    reported: Option<Instant>,
    /// When the status file was last told of an ack.
    told_heard: Option<Instant>,
    /// When a backend behind was last logged, and the resends since.
    behind_logged: Option<Instant>,
    behind_unlogged: u64,
}

impl BackendReport {
    pub fn new(live: LiveSender) -> (BackendReport, Silence) {
        let (silence, watched) = watch::channel(None);
        let report = BackendReport {
            live,
            silence,
            reported: None,
            told_heard: None,
            behind_logged: None,
            behind_unlogged: 0,
        };
        (report, watched)
    }

    /// The backend sent an ack message.
    pub fn heard(&mut self, now: Instant) {
        metrics::backend_heard();
        if self
            .told_heard
            .is_none_or(|at| now.saturating_duration_since(at) >= STATUS_EVERY)
        {
            self.told_heard = Some(now);
            let _ = self.live.send(LiveEvent::BackendHeard(now_ms()));
        }
    }

    /// `resent` ack timeouts found the backend behind (acking only older
    /// sends): counted, and logged at most once a minute with the resends
    /// since the last line.
    pub fn behind(&mut self, resent: u64, now: Instant) {
        if resent == 0 {
            return;
        }
        let total = metrics::count_n(metrics::Count::UplinkResendsBackendBehind, resent);
        self.behind_unlogged += resent;
        if self
            .behind_logged
            .is_none_or(|at| now.saturating_duration_since(at) >= BEHIND_LOG_EVERY)
        {
            warn!(
                event = "backend_behind",
                resent = self.behind_unlogged,
                total,
                "the backend acks only uplinks sent earlier than these, later than north.ack_timeout_ms: it is behind; they are sent again, uncounted"
            );
            self.behind_logged = Some(now);
            self.behind_unlogged = 0;
        }
    }

    /// Reports a silence that began or ended since the last call.
    pub fn follow(&mut self, silent_since: Option<Instant>, now: Instant) {
        if silent_since == self.reported {
            return;
        }
        match (self.reported, silent_since) {
            (_, Some(_)) => {
                warn!(event = "backend_silent", "no ack from the backend since these uplinks were sent: it is away; they wait and are sent again, uncounted");
                let _ = self.live.send(LiveEvent::BackendSilent);
            }
            (Some(since), None) => {
                let silent_ms = now.saturating_duration_since(since).as_millis() as u64;
                info!(
                    event = "backend_heard",
                    silent_ms, "the backend acks again: sending what waited for it"
                );
                let _ = self.live.send(LiveEvent::BackendPresent);
            }
            (None, None) => {}
        }
        metrics::set_backend_present(silent_since.is_none());
        self.silence.send_replace(silent_since);
        self.reported = silent_since;
    }
}
