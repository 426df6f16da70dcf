//! Broker presence (temporary home: it moves to `south` with the presence
//! rework). A device the broker saw connect is taken as online after a
//! short grace, unless it says so itself first; one that subscribes to its
//! inbox starts again from its cursor; one that disconnects is offline.

use std::time::Duration;

use tokio::time::Instant;

use super::{Downlink, Timer};
use crate::ids::DeviceId;
use crate::south::presence::BrokerEvent;
use crate::store::StoreError;

/// A device the broker saw connect is taken as online after this, unless it
/// says so itself first (it may not have subscribed to its inbox yet).
const CONNECT_GRACE: Duration = Duration::from_millis(500);

impl Downlink {
    pub(super) async fn on_broker(&mut self, ev: BrokerEvent) -> Result<(), StoreError> {
        match ev {
            BrokerEvent::Connected(client) => {
                if let Ok(device) = DeviceId::new(client) {
                    // One grace timer per device, for its latest connection.
                    let at = Instant::now() + CONNECT_GRACE;
                    self.timers.insert(Timer::Grace(device), at);
                }
            }
            BrokerEvent::Disconnected(client) => {
                if let Ok(device) = DeviceId::new(client) {
                    self.timers.remove(&Timer::Grace(device.clone()));
                    self.scheduler.on_offline(&device);
                }
            }
            BrokerEvent::Subscribed { client_id, filter } => {
                if let Ok(device) = DeviceId::new(client_id) {
                    if filter == self.topics.device_inbox(&device) {
                        self.timers.remove(&Timer::Grace(device.clone()));
                        let actions = self.scheduler.on_subscribed(&device, Instant::now());
                        self.execute(actions).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A connected device's grace ran out without a word from it.
    pub(super) async fn on_grace_over(&mut self, device: DeviceId) -> Result<(), StoreError> {
        let actions = self.scheduler.on_online(&device);
        self.execute(actions).await
    }
}
