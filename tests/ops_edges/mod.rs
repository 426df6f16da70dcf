//! The operator surfaces at their edges, each through the real binary: an
//! age that would wrap is refused and deletes nothing, a stdout whose
//! reader is gone ends a command quietly, a gateway under another name is
//! still seen running (and a second one on its store is refused), and
//! every error the admin server answers is JSON.

mod admin;
mod cli;
mod status;

use std::time::Duration;

use crate::support::{free_port, Device, Ferry, FerryOpts};

const SECS_10: Duration = Duration::from_secs(10);

/// A gateway whose north link stays down (nothing listens upstream).
fn lone_ferry(gateway: &str) -> Ferry {
    Ferry::start(FerryOpts::new(gateway, free_port()))
}

/// Has `device` send `n` publishes that are not JSON, each rejected at the
/// door into a dead letter; returns once the store holds `n` of them.
async fn dead_letters(ferry: &Ferry, device: &Device, n: i64) {
    let topic = device.up_topic("t");
    for _ in 0..n {
        device.publish_raw(&topic, b"not json".to_vec()).await;
    }
    crate::support::receipts::eventually(SECS_10, "every publish dead-lettered", || {
        ferry.query_i64("SELECT count(*) FROM dead_letter", []) == n
    })
    .await;
}
