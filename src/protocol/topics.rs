//! Topic names, both sides (docs/PROTOCOL.md, South and North).
//!
//! Device topics are `{south_prefix}/{device}/{kind}`; gateway topics are
//! `{north_prefix}/...` where the north prefix already holds the gateway id.
//! Each string is written once: [`DeviceTopics`] (one device's topics, what
//! a device client needs) and [`NorthTopics`] (one gateway's north side,
//! what a backend needs) build them, and the gateway's [`Topics`] uses
//! both. Parsing a device topic yields a checked [`DeviceId`], never a raw
//! string.

use super::plain::PlainTopics;
use super::sparkplug::edge::SparkplugTopics;
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
    /// `{base}/up`: a batch of uplink messages.
    UpBatch,
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
        let mut topic = String::with_capacity(self.up_len(device, stream));
        for part in [self.base.as_str(), "/up/", device.as_str(), "/", stream] {
            topic.push_str(part);
        }
        topic
    }

    /// The length of [`NorthTopics::up`]'s topic, without making it.
    pub fn up_len(&self, device: &DeviceId, stream: &str) -> usize {
        self.base.len() + "/up/".len() + device.as_str().len() + 1 + stream.len()
    }

    /// `{base}/up`: batches of uplink messages (gw → backend), each a JSON
    /// array of the bodies they would have had alone.
    pub fn up_batch(&self) -> String {
        format!("{}/up", self.base)
    }

    /// `{base}/up/#`: every uplink message, batches included.
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

    /// `{base}/alerts`: the gateway's alerts for operators.
    pub fn alerts(&self) -> String {
        format!("{}/alerts", self.base)
    }

    /// Which north topic `topic` is, if any.
    pub fn parse<'t>(&self, topic: &'t str) -> Option<NorthTopic<'t>> {
        let rest = topic.strip_prefix(self.base.as_str())?.strip_prefix('/')?;
        Some(match rest {
            "ack" => NorthTopic::Ack,
            "up" => NorthTopic::UpBatch,
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
    /// Shared by every clone: `systemctl reload` may change them
    /// ([`Topics::set_plain`]).
    plain: std::sync::Arc<tokio::sync::watch::Sender<std::sync::Arc<PlainTopics>>>,
    sparkplug: Option<SparkplugTopics>,
}

impl Topics {
    /// `south` is the device prefix (`devices`), `north` the full gateway
    /// prefix (`ferry/edge-01`).
    pub fn new(south: &str, north: &str) -> Topics {
        Topics {
            south: south.to_string(),
            north: NorthTopics::from_base(north),
            plain: std::sync::Arc::new(tokio::sync::watch::Sender::new(Default::default())),
            sparkplug: None,
        }
    }

    /// With plain devices' topics (`south.plain_topics`).
    pub fn with_plain(self, plain: PlainTopics) -> Topics {
        self.set_plain(plain);
        self
    }

    /// Plain devices' topics, as they are now.
    pub fn plain(&self) -> std::sync::Arc<PlainTopics> {
        self.plain.borrow().clone()
    }

    /// New plain devices' topics, for this handle and every clone of it
    /// (`systemctl reload`); [`Topics::plain_changes`] tells of them.
    pub fn set_plain(&self, plain: PlainTopics) {
        self.plain.send_replace(std::sync::Arc::new(plain));
    }

    /// Hears of every [`Topics::set_plain`] from now on.
    pub fn plain_changes(&self) -> tokio::sync::watch::Receiver<std::sync::Arc<PlainTopics>> {
        self.plain.subscribe()
    }

    /// With Sparkplug B edge nodes (`[south.sparkplug]`; None: off).
    pub fn with_sparkplug(mut self, sparkplug: Option<SparkplugTopics>) -> Topics {
        self.sparkplug = sparkplug;
        self
    }

    /// Sparkplug B edge nodes' topics, when they are on.
    pub fn sparkplug(&self) -> Option<&SparkplugTopics> {
        self.sparkplug.as_ref()
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

    /// The length of [`Topics::north_up`]'s topic, without making it.
    pub fn north_up_len(&self, device: &DeviceId, stream: &str) -> usize {
        self.north.up_len(device, stream)
    }

    /// `{prefix}/up`: batches of uplinks.
    pub fn north_up_batch(&self) -> String {
        self.north.up_batch()
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

    pub fn north_alerts(&self) -> String {
        self.north.alerts()
    }
}

#[cfg(test)]
mod tests;
