//! The south side: where device traffic comes in and receipts and inbox
//! batches go out. This module is the seam the pipelines see:
//! [`SouthMessage`]s in through [`Inbound`], [`SouthSender::publish`] and
//! [`SouthSender::ack`] out, [`DeviceControl`]s, and [`presence::Presence`]. Two
//! implementations sit behind it, chosen by `south.mode`:
//!
//! - [`embedded`]: ferry's own rumqttd broker, devices connect to ferry.
//!   Each connection's task hands its device's publishes straight to
//!   intake (no router on the way), and sends the PUBACK (PUBREC) only
//!   once intake passes its [`Ack`] back: after the commit, or once a
//!   refusal is answered. Receipts and inbox batches go onto the device's
//!   connection from the pipeline's tasks, also past the router.
//! - [`external`]: ferry is a client of the site's broker (Mosquitto,
//!   EMQX, ...), on [`crate::mqtt`], with a persistent session. A device
//!   publish is acknowledged to the site broker only after it is committed
//!   (intake passes its [`Ack`] back), so the site broker keeps every
//!   message until ferry has it, also while ferry is stopped.
//!
//! Invariant for both: nothing a device sent is acknowledged on ferry's
//! behalf before the pipeline can answer for it, and nothing is dropped
//! while the pipeline is behind — the device (or the site broker) is held
//! back instead.

pub mod admission;
pub mod auth;
pub mod backlog;
pub mod door;
pub mod embedded;
pub mod external;
pub mod presence;
mod published;
mod seam;

use tokio::sync::mpsc;

use crate::config::{SouthConfig, SouthMode};
use crate::protocol::topics::Topics;
use crate::status_file::{LiveEvent, LiveSender};
pub use embedded::SouthError;

pub(crate) use seam::Started;
pub use seam::{
    max_packet_bytes, Ack, DeviceControl, Inbound, PublishProps, South, SouthMessage, SouthSender,
};

/// Starts the south side `cfg.mode` names, on the current tokio runtime.
/// The status file is told of the site session (external mode) and of
/// every presence the broker reports (embedded mode).
pub fn start(cfg: &SouthConfig, topics: &Topics, status: LiveSender) -> Result<South, SouthError> {
    let Started { mut south, link } = match &cfg.mode {
        SouthMode::Embedded => embedded::start(cfg, topics)?,
        SouthMode::External(site) => external::start(cfg, site, topics),
    };
    if let Some(link) = link {
        tokio::spawn(report_link(link, status.clone()));
    }
    south.presence = south.presence.take().map(|p| report_presence(p, status));
    Ok(south)
}

/// Writes the site session's changes to the status file.
async fn report_link(mut link: mpsc::UnboundedReceiver<bool>, status: LiveSender) {
    while let Some(up) = link.recv().await {
        let _ = status.send(if up {
            LiveEvent::SouthUp
        } else {
            LiveEvent::SouthDown
        });
    }
}

/// Passes the broker's presence on, telling the status file who is online
/// on the way.
fn report_presence(
    mut presence: mpsc::UnboundedReceiver<presence::Presence>,
    status: LiveSender,
) -> mpsc::UnboundedReceiver<presence::Presence> {
    use presence::Presence;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(p) = presence.recv().await {
            let live = match &p {
                Presence::Online(d) | Presence::Ready(d) | Presence::PlainReady(d) => {
                    Some(LiveEvent::DeviceOnline(d.clone()))
                }
                Presence::Offline(d) => Some(LiveEvent::DeviceOffline(d.clone())),
                Presence::PlainDelivered(..) => None,
            };
            if let Some(live) = live {
                let _ = status.send(live);
            }
            if tx.send(p).is_err() {
                return;
            }
        }
    });
    rx
}
