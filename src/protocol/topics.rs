//! Topic names, both sides (docs/PROTOCOL.md, South and North).
//!
//! Device topics are `{south_prefix}/{device}/{kind}`; gateway topics are
//! `{north_prefix}/...` where the north prefix already holds the gateway id.
//! Each string is written once: [`DeviceTopics`] (one device's topics, what
//! a device client needs) and [`NorthTopics`] (one gateway's north side,
//! what a backend needs) build them, and the gateway's [`Topics`] uses
//! both. Parsing a device topic yields a checked [`DeviceId`], never a raw
//! string.

use crate::ids::{DeviceId, GatewayId};

/// The last level of each device topic (after `up`, the stream follows).
mod kind {
    pub const UP: &str = "up";
    pub const ACK: &str = "ack";
    pub const INBOX: &str = "inbox";
    pub const CONFIRM: &str = "confirm";
    pub const PULL: &str = "pull";
    pub const READ: &str = "read";
    pub const NACK: &str = "nack";
    pub const STATUS: &str = "status";
}

fn device_topic(prefix: &str, device: &DeviceId, kind: &str) -> String {
    format!("{prefix}/{device}/{kind}")
}

fn up_topic(prefix: &str, device: &DeviceId, stream: &str) -> String {
    format!("{prefix}/{device}/{}/{stream}", kind::UP)
}

/// One device's topics under the south prefix (`devices`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTopics {
    prefix: String,
    device: DeviceId,
}

impl DeviceTopics {
    pub fn new(prefix: &str, device: &DeviceId) -> DeviceTopics {
        DeviceTopics {
            prefix: prefix.to_string(),
            device: device.clone(),
        }
    }

    pub fn device(&self) -> &DeviceId {
        &self.device
    }

    /// `{prefix}/{device}/up/{stream}`: uplink envelopes (device → gw).
    pub fn up(&self, stream: &str) -> String {
        up_topic(&self.prefix, &self.device, stream)
    }

    /// Uplink receipts (gw → device).
    pub fn ack(&self) -> String {
        device_topic(&self.prefix, &self.device, kind::ACK)
    }

    /// Downlink batches (gw → device).
    pub fn inbox(&self) -> String {
        device_topic(&self.prefix, &self.device, kind::INBOX)
    }

    pub fn confirm(&self) -> String {
        device_topic(&self.prefix, &self.device, kind::CONFIRM)
    }

    pub fn pull(&self) -> String {
        device_topic(&self.prefix, &self.device, kind::PULL)
    }

    pub fn read(&self) -> String {
        device_topic(&self.prefix, &self.device, kind::READ)
    }

    pub fn nack(&self) -> String {
        device_topic(&self.prefix, &self.device, kind::NACK)
    }

    /// Presence, and the device's last will.
    pub fn status(&self) -> String {
        device_topic(&self.prefix, &self.device, kind::STATUS)
    }
}

/// One gateway's north topics under `{prefix}/{gateway}` (`ferry/edge-01`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NorthTopics {
    base: String,
}

/// What arrived on a north topic; device ids as written, unchecked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NorthTopic<'t> {
    /// `{base}/up/{device}/{stream...}`: an uplink message.
    Up {
        device: &'t str,
        stream: &'t str,
    },
    Ack,
    /// `{base}/down` (`None`, a `to` list) or `{base}/down/{device}`.
    Down(Option<&'t str>),
    Receipts,
    Status,
}

impl NorthTopics {
    pub fn new(prefix: &str, gateway: &GatewayId) -> NorthTopics {
        NorthTopics::from_base(&format!("{prefix}/{gateway}"))
    }

    /// From the full gateway prefix (`ferry/edge-01`, the config's `north.prefix`).
    pub fn from_base(base: &str) -> NorthTopics {
        NorthTopics {
            base: base.to_string(),
        }
    }

    /// `{prefix}/{gateway}`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Uplink messages of one device and stream (gw → backend).
    pub fn up(&self, device: &DeviceId, stream: &str) -> String {
        format!("{}/up/{device}/{stream}", self.base)
    }

    /// `{base}/up/#`: every uplink message.
    pub fn up_filter(&self) -> String {
        format!("{}/up/#", self.base)
    }

    /// Backend acks (backend → gw).
    pub fn ack(&self) -> String {
        format!("{}/ack", self.base)
    }

    /// `{base}/down`: downlinks with a `to` list (backend → gw).
    pub fn down(&self) -> String {
        format!("{}/down", self.base)
    }

    /// `{base}/down/{device}`: downlinks for one device (backend → gw).
    pub fn down_to(&self, device: &DeviceId) -> String {
        format!("{}/{device}", self.down())
    }

    /// `{base}/down/+`: downlinks for one device each.
    pub fn down_filter(&self) -> String {
        format!("{}/+", self.down())
    }

    /// Delivery receipts (gw → backend).
    pub fn receipts(&self) -> String {
        format!("{}/receipts", self.base)
    }

    /// The gateway's retained status and last will (gw → backend).
    pub fn status(&self) -> String {
        format!("{}/status", self.base)
    }

    /// Which north topic `topic` is, if any.
    pub fn parse<'t>(&self, topic: &'t str) -> Option<NorthTopic<'t>> {
        let rest = topic.strip_prefix(self.base.as_str())?.strip_prefix('/')?;
        Some(match rest {
            "ack" => NorthTopic::Ack,
            "down" => NorthTopic::Down(None),
            "receipts" => NorthTopic::Receipts,
            "status" => NorthTopic::Status,
            _ => {
                if let Some(device) = rest.strip_prefix("down/") {
                    if device.is_empty() || device.contains('/') {
                        return None;
                    }
                    NorthTopic::Down(Some(device))
                } else {
                    let (device, stream) = rest.strip_prefix("up/")?.split_once('/')?;
                    if device.is_empty() || stream.is_empty() {
                        return None;
                    }
                    NorthTopic::Up { device, stream }
                }
            }
        })
    }
}

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

/// The gateway's topics: every device's under the south prefix, and its
/// own north side.
#[derive(Debug, Clone)]
pub struct Topics {
    south: String,
    north: NorthTopics,
}

impl Topics {
    /// `south` is the device prefix (`devices`), `north` the full gateway
    /// prefix (`ferry/edge-01`).
    pub fn new(south: &str, north: &str) -> Topics {
        Topics {
            south: south.to_string(),
            north: NorthTopics::from_base(north),
        }
    }

    /// The device topic prefix (`devices`).
    pub fn south_prefix(&self) -> &str {
        &self.south
    }

    /// The gateway's north topics.
    pub fn north(&self) -> &NorthTopics {
        &self.north
    }

    /// One device's topics.
    pub fn device(&self, device: &DeviceId) -> DeviceTopics {
        DeviceTopics::new(&self.south, device)
    }

    /// `{prefix}/+/{kind}` for every topic a device publishes on
    /// (`up/#`, `confirm`, `pull`, `read`, `nack`, `status`).
    pub fn device_filters(&self) -> [String; 6] {
        [
            format!("{}/#", kind::UP),
            kind::CONFIRM.to_string(),
            kind::PULL.to_string(),
            kind::READ.to_string(),
            kind::NACK.to_string(),
            kind::STATUS.to_string(),
        ]
        .map(|k| format!("{}/+/{k}", self.south))
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
            Some((kind::UP, stream))
                if !stream.is_empty() && stream.split('/').all(|l| !l.is_empty()) =>
            {
                check_stream(stream).map_err(|e| TopicError::BadStream(device.clone(), e))?;
                DeviceTopic::Up {
                    stream: stream.to_string(),
                }
            }
            Some((kind::UP, _)) | None if kind == kind::UP || kind.starts_with("up/") => {
                return Err(TopicError::NoStream(device))
            }
            None => match kind {
                kind::CONFIRM => DeviceTopic::Confirm,
                kind::PULL => DeviceTopic::Pull,
                kind::READ => DeviceTopic::Read,
                kind::NACK => DeviceTopic::Nack,
                kind::STATUS => DeviceTopic::Status,
                // The gateway's own publishes come back on the link.
                other => return Err(TopicError::UnknownKind(other.to_string())),
            },
            Some((other, _)) => return Err(TopicError::UnknownKind(other.to_string())),
        };
        Ok((device, kind))
    }

    /// Uplink receipts for one device.
    pub fn device_ack(&self, device: &DeviceId) -> String {
        device_topic(&self.south, device, kind::ACK)
    }

    /// Downlink batches for one device.
    pub fn device_inbox(&self, device: &DeviceId) -> String {
        device_topic(&self.south, device, kind::INBOX)
    }

    pub fn north_up(&self, device: &DeviceId, stream: &str) -> String {
        self.north.up(device, stream)
    }

    pub fn north_ack(&self) -> String {
        self.north.ack()
    }

    /// `{prefix}/down/+`: downlinks for one device each.
    pub fn north_down_filter(&self) -> String {
        self.north.down_filter()
    }

    /// `{prefix}/down`: downlinks with a `to` list.
    pub fn north_down(&self) -> String {
        self.north.down()
    }

    pub fn is_north_down(&self, topic: &str) -> bool {
        self.parse_north_down(topic).is_some()
    }

    /// `Some(None)` for `{prefix}/down`, `Some(Some(device))` for
    /// `{prefix}/down/{device}` (the device as written, unchecked).
    pub fn parse_north_down<'t>(&self, topic: &'t str) -> Option<Option<&'t str>> {
        match self.north.parse(topic)? {
            NorthTopic::Down(to) => Some(to),
            _ => None,
        }
    }

    pub fn north_receipts(&self) -> String {
        self.north.receipts()
    }

    pub fn north_status(&self) -> String {
        self.north.status()
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

    #[test]
    fn a_device_and_the_gateway_name_the_same_topics() {
        let d = DeviceId::new("press-7").unwrap();
        let mine = DeviceTopics::new("devices", &d);
        assert_eq!(mine.up("line3/temp"), "devices/press-7/up/line3/temp");
        assert_eq!(mine.ack(), t().device_ack(&d));
        assert_eq!(mine.inbox(), t().device_inbox(&d));
        assert_eq!(t().device(&d), mine);
        for (topic, kind) in [
            (mine.confirm(), DeviceTopic::Confirm),
            (mine.pull(), DeviceTopic::Pull),
            (mine.read(), DeviceTopic::Read),
            (mine.nack(), DeviceTopic::Nack),
            (mine.status(), DeviceTopic::Status),
            (
                mine.up("line3/temp"),
                DeviceTopic::Up {
                    stream: "line3/temp".into(),
                },
            ),
        ] {
            assert_eq!(t().parse_device(&topic), Ok((d.clone(), kind)), "{topic}");
        }
        assert_eq!(
            t().device_filters(),
            [
                "devices/+/up/#",
                "devices/+/confirm",
                "devices/+/pull",
                "devices/+/read",
                "devices/+/nack",
                "devices/+/status"
            ]
        );
    }

    #[test]
    fn a_backend_and_the_gateway_name_the_same_topics() {
        let g = GatewayId::new("edge-01").unwrap();
        let d = DeviceId::new("press-7").unwrap();
        let n = NorthTopics::new("ferry", &g);
        assert_eq!(n.base(), "ferry/edge-01");
        assert_eq!(n.up_filter(), "ferry/edge-01/up/#");
        assert_eq!(n.up(&d, "alarm"), t().north_up(&d, "alarm"));
        assert_eq!(n.ack(), t().north_ack());
        assert_eq!(n.down(), t().north_down());
        assert_eq!(n.down_filter(), t().north_down_filter());
        assert_eq!(n.down_to(&d), "ferry/edge-01/down/press-7");
        assert_eq!(n.receipts(), "ferry/edge-01/receipts");
        assert_eq!(n.status(), t().north_status());
        assert_eq!(t().north(), &n);
        assert_eq!(
            n.parse(&n.up(&d, "line3/temp")),
            Some(NorthTopic::Up {
                device: "press-7",
                stream: "line3/temp"
            })
        );
        assert_eq!(n.parse(&n.ack()), Some(NorthTopic::Ack));
        assert_eq!(n.parse(&n.down()), Some(NorthTopic::Down(None)));
        assert_eq!(
            n.parse(&n.down_to(&d)),
            Some(NorthTopic::Down(Some("press-7")))
        );
        assert_eq!(n.parse(&n.receipts()), Some(NorthTopic::Receipts));
        assert_eq!(n.parse(&n.status()), Some(NorthTopic::Status));
        for other in [
            "ferry/edge-01/up/press-7",
            "ferry/edge-01/up//x",
            "ferry/edge-01/statusx",
            "ferry/edge-02/ack",
            "ferry/edge-01",
        ] {
            assert_eq!(n.parse(other), None, "{other}");
        }
    }
}
