//! `[south.sparkplug]`: Sparkplug B edge nodes on the device side, and the
//! primary host application ferry follows north (docs/PROTOCOL.md,
//! "Sparkplug B edge nodes"). Every error names its key.

use super::check::{ConfigError, Problems};
use super::raw::RawSparkplug;
use crate::protocol::sparkplug::edge::check_host_id;
use crate::protocol::sparkplug::edge::SparkplugTopics;

/// Checks `[south.sparkplug]`: None when it is off (or refused, the
/// problem noted in `p`).
pub(super) fn check(raw: &RawSparkplug, p: &mut Problems) -> Option<SparkplugTopics> {
    let host_id = raw.host_id.as_deref();
    if let Some(Err(why)) = host_id.map(check_host_id) {
        p.note(ConfigError::new("south.sparkplug.host_id", why));
        return None;
    }
    if !raw.enabled {
        if host_id.is_some() {
            p.note(ConfigError::new(
                "south.sparkplug.host_id",
                "is set but south.sparkplug.enabled is false: set enabled = true, or remove it",
            ));
        }
        return None;
    }
    Some(SparkplugTopics {
        host_id: raw.host_id.clone(),
    })
}
