//! Topic names, both sides (docs/PROTOCOL.md, South and North).
//!
//! Device topics are `{south_prefix}/{device}/{kind}`; gateway topics are
//! `{north_prefix}/...` where the north prefix already holds the gateway id.
//! Parsing a device topic yields a checked [`DeviceId`], never a raw string.

use crate::ids::DeviceId;

/// What a device published on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceTopic {
    /// `{prefix}/{device}/up/{stream...}`: an uplink envelope.
    Up {
        stream: String,
    },
    Confirm,
    Pull,
    Read,
    Nack,
    Status,
}

/// A device topic that does not follow the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("topic is not under the device prefix")]
    NotDevice,
    #[error("invalid device id {0:?} in topic: {1}")]
    BadDevice(String, crate::ids::IdError),
    #[error("unknown device topic kind {0:?}")]
    UnknownKind(String),
    #[error("uplink topic has no stream")]
    NoStream(DeviceId),
}

#[derive(Debug, Clone)]
pub struct Topics {
    south: String,
    north: String,
}

impl Topics {
    /// `south` is the device prefix (`devices`), `north` the full gateway
    /// prefix (`ferry/edge-01`).
    pub fn new(south: &str, north: &str) -> Topics {
        Topics {
            south: south.to_string(),
            north: north.to_string(),
        }
    }

    /// The device topic prefix (`devices`).
    pub fn south_prefix(&self) -> &str {
        &self.south
    }

    pub fn parse_device(&self, topic: &str) -> Result<(DeviceId, DeviceTopic), TopicError> {
        let rest = topic
            .strip_prefix(self.south.as_str())
            .and_then(|r| r.strip_prefix('/'))
            .ok_or(TopicError::NotDevice)?;
        let (device, kind) = rest.split_once('/').ok_or(TopicError::NotDevice)?;
        let device =
            DeviceId::new(device).map_err(|e| TopicError::BadDevice(device.to_string(), e))?;
        let kind = match kind.split_once('/') {
            Some(("up", stream))
                if !stream.is_empty() && stream.split('/').all(|l| !l.is_empty()) =>
            {
                DeviceTopic::Up {
                    stream: stream.to_string(),
                }
            }
            Some(("up", _)) | None if kind == "up" || kind.starts_with("up/") => {
                return Err(TopicError::NoStream(device))
            }
            None => match kind {
                "confirm" => DeviceTopic::Confirm,
                "pull" => DeviceTopic::Pull,
                "read" => DeviceTopic::Read,
                "nack" => DeviceTopic::Nack,
                "status" => DeviceTopic::Status,
                // The gateway's own publishes come back on the link.
                other => return Err(TopicError::UnknownKind(other.to_string())),
            },
            Some((other, _)) => return Err(TopicError::UnknownKind(other.to_string())),
        };
        Ok((device, kind))
    }

    /// Uplink receipts for one device.
    pub fn device_ack(&self, device: &DeviceId) -> String {
        format!("{}/{}/ack", self.south, device)
    }

    pub fn north_up(&self, device: &DeviceId, stream: &str) -> String {
        format!("{}/up/{}/{}", self.north, device, stream)
    }

    pub fn north_ack(&self) -> String {
        format!("{}/ack", self.north)
    }

    /// `{prefix}/down/+`: downlinks for one device each.
    pub fn north_down_filter(&self) -> String {
        format!("{}/down/+", self.north)
    }

    /// `{prefix}/down`: downlinks with a `to` list.
    pub fn north_down(&self) -> String {
        format!("{}/down", self.north)
    }

    pub fn is_north_down(&self, topic: &str) -> bool {
        self.parse_north_down(topic).is_some()
    }

    /// `Some(None)` for `{prefix}/down`, `Some(Some(device))` for
    /// `{prefix}/down/{device}` (the device as written, unchecked).
    pub fn parse_north_down<'t>(&self, topic: &'t str) -> Option<Option<&'t str>> {
        let rest = topic
            .strip_prefix(self.north.as_str())?
            .strip_prefix("/down")?;
        match rest {
            "" => Some(None),
            _ => rest
                .strip_prefix('/')
                .filter(|d| !d.is_empty() && !d.contains('/'))
                .map(Some),
        }
    }

    pub fn north_receipts(&self) -> String {
        format!("{}/receipts", self.north)
    }

    /// Downlink batches for one device.
    pub fn device_inbox(&self, device: &DeviceId) -> String {
        format!("{}/{}/inbox", self.south, device)
    }

    pub fn north_status(&self) -> String {
        format!("{}/status", self.north)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Topics {
        Topics::new("devices", "ferry/edge-01")
    }

    #[test]
    fn uplink_topics_carry_a_multi_level_stream() {
        let (d, k) = t().parse_device("devices/press-7/up/line3/temp").unwrap();
        assert_eq!(d.as_str(), "press-7");
        assert_eq!(
            k,
            DeviceTopic::Up {
                stream: "line3/temp".into()
            }
        );
    }

    #[test]
    fn uplink_without_stream_is_refused() {
        let d = DeviceId::new("d").unwrap();
        assert_eq!(
            t().parse_device("devices/d/up"),
            Err(TopicError::NoStream(d.clone()))
        );
        assert_eq!(
            t().parse_device("devices/d/up/"),
            Err(TopicError::NoStream(d.clone()))
        );
        assert_eq!(
            t().parse_device("devices/d/up/a//b"),
            Err(TopicError::NoStream(d))
        );
    }

    #[test]
    fn control_topics_parse() {
        assert_eq!(
            t().parse_device("devices/d/confirm").unwrap().1,
            DeviceTopic::Confirm
        );
        assert_eq!(
            t().parse_device("devices/d/status").unwrap().1,
            DeviceTopic::Status
        );
        assert!(
            matches!(t().parse_device("devices/d/ack"), Err(TopicError::UnknownKind(k)) if k == "ack")
        );
    }

    #[test]
    fn bad_device_ids_and_foreign_prefixes_are_refused() {
        assert!(matches!(
            t().parse_device("devices/bad:id/up/x"),
            Err(TopicError::BadDevice(..))
        ));
        assert_eq!(
            t().parse_device("devicesX/d/up/x"),
            Err(TopicError::NotDevice)
        );
        assert_eq!(t().parse_device("other/d/up/x"), Err(TopicError::NotDevice));
    }

    #[test]
    fn north_topics_include_the_gateway_prefix() {
        let d = DeviceId::new("press-7").unwrap();
        assert_eq!(
            t().north_up(&d, "line3/temp"),
            "ferry/edge-01/up/press-7/line3/temp"
        );
        assert_eq!(t().north_ack(), "ferry/edge-01/ack");
        assert_eq!(t().device_ack(&d), "devices/press-7/ack");
        assert_eq!(t().device_inbox(&d), "devices/press-7/inbox");
    }

    #[test]
    fn north_down_topics_parse() {
        assert_eq!(t().parse_north_down("ferry/edge-01/down"), Some(None));
        assert_eq!(
            t().parse_north_down("ferry/edge-01/down/p-1"),
            Some(Some("p-1"))
        );
        assert_eq!(t().parse_north_down("ferry/edge-01/down/"), None);
        assert_eq!(t().parse_north_down("ferry/edge-01/down/a/b"), None);
        assert_eq!(t().parse_north_down("ferry/edge-01/downx"), None);
        assert_eq!(t().parse_north_down("ferry/edge-02/down"), None);
    }
}
