//! What the south broker says of a device's presence
//! ([`crate::south::presence`]), applied to the scheduler.

use tokio::time::Instant;

use super::Downlink;
use crate::south::presence::Presence;
use crate::store::StoreError;

impl Downlink {
    pub(super) async fn on_presence(&mut self, p: Presence) -> Result<(), StoreError> {
        let actions = match p {
            Presence::Online(device) => self.scheduler.on_online(&device),
            Presence::Ready(device) => self.scheduler.on_subscribed(&device, Instant::now()),
            Presence::PlainReady(device) => {
                self.scheduler.on_subscribed_plain(&device, Instant::now())
            }
            Presence::PlainDelivered(device, seq) => {
                self.on_plain_delivered(&device, seq);
                Vec::new()
            }
            Presence::Offline(device) => {
                self.scheduler.on_offline(&device);
                Vec::new()
            }
        };
        self.execute(actions).await
    }
}
