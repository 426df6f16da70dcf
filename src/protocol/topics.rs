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
    #[error("bad stream: {1}")]
    BadStream(DeviceId, String),
}

/// Most levels in an uplink stream (docs/PROTOCOL.md, South).
pub const MAX_STREAM_LEVELS: usize = 8;
/// Longest stream level.
pub const MAX_STREAM_LEVEL_LEN: usize = 64;

/// Checks an uplink stream: 1..=8 levels of `[A-Za-z0-9._-]{1,64}`. A
/// stream that passes can always be carried in a north topic.
pub fn check_stream(stream: &str) -> Result<(), String> {
    let levels = stream.split('/').count();
    if levels > MAX_STREAM_LEVELS {
        return Err(format!(
            "{levels} levels, at most {MAX_STREAM_LEVELS} are allowed"
        ));
    }
    for level in stream.split('/') {
        if level.len() > MAX_STREAM_LEVEL_LEN {
            return Err(format!(
                "a level is {} bytes long, at most {MAX_STREAM_LEVEL_LEN} are allowed",
                level.len()
            ));
        }
        if let Some(c) = level
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "character {c:?} is not allowed (levels are [A-Za-z0-9._-]{{1,64}})"
            ));
        }
    }
    Ok(())
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
                check_stream(stream).map_err(|e| TopicError::BadStream(device.clone(), e))?;
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
    fn stream_levels_follow_the_protocol_rules() {
        let bad = |topic: &str| matches!(t().parse_device(topic), Err(TopicError::BadStream(..)));
        assert!(bad("devices/evil/up/a\0b"), "a NUL byte");
        assert!(bad("devices/d/up/a b"));
        assert!(bad("devices/d/up/temp+"));
        assert!(bad("devices/d/up/#"));
        assert!(bad(&format!("devices/d/up/{}", "x".repeat(65))));
        assert!(bad(&format!("devices/d/up/{}", "a/".repeat(8) + "b")));
        assert!(bad(&format!("devices/d/up/{}", "x".repeat(65_000))));
        assert!(t()
            .parse_device(&format!(
                "devices/d/up/{}",
                vec!["x".repeat(64); 8].join("/")
            ))
            .is_ok());
        assert!(t().parse_device("devices/d/up/line_3/temp.c-1").is_ok());
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
