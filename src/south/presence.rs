//! Device presence as the south broker reports it.
//!
//! Embedded mode: the vendored rumqttd reports every accepted CONNECT,
//! every connection that is gone and every granted subscription through
//! its client-event hook (`Router::client_events`, vendor/README.md), in the
//! order its router handled them. [`forward`] turns those into
//! [`BrokerEvent`]s for the downlink pipeline.
//!
//! External mode: the site broker tells a client nothing about other
//! clients. Presence there comes from the devices' own `status` messages
//! (`online: true` after connecting, `online: false` as their last will)
//! and from `pull` and `confirm`, which reach the downlink as device
//! controls; no `BrokerEvent` is ever sent.

use rumqttd::ClientEvent;
use tokio::sync::mpsc;

/// What the broker said about a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerEvent {
    Connected(String),
    Disconnected(String),
    Subscribed { client_id: String, filter: String },
}

/// Forwards the broker's client events as [`BrokerEvent`]s, leaving out
/// the gateway's own link (`link_id`). Ends when either side is gone.
pub async fn forward(
    mut events: mpsc::UnboundedReceiver<ClientEvent>,
    out: mpsc::UnboundedSender<BrokerEvent>,
    link_id: &'static str,
) {
    while let Some(event) = events.recv().await {
        let event = match event {
            ClientEvent::Connected { client_id } if client_id != link_id => {
                BrokerEvent::Connected(client_id)
            }
            ClientEvent::Disconnected { client_id } if client_id != link_id => {
                BrokerEvent::Disconnected(client_id)
            }
            ClientEvent::Subscribed { client_id, filter } if client_id != link_id => {
                BrokerEvent::Subscribed { client_id, filter }
            }
            _ => continue,
        };
        if out.send(event).is_err() {
            return;
        }
    }
}
