//! Sparkplug B topics: `spBv1.0/{group_id}/{message_type}/{edge_node_id}`
//! with `/{device_id}` for device messages, and the 3.0 host state topic
//! `spBv1.0/STATE/{host_id}`.

/// The first topic level of every Sparkplug B topic.
pub const NAMESPACE: &str = "spBv1.0";

/// The message type, a Sparkplug topic's third level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `NBIRTH`: an edge node comes online.
    NBirth,
    /// `NDATA`: an edge node's data.
    NData,
    /// `NDEATH`: an edge node goes offline (often its will).
    NDeath,
    /// `NCMD`: a command to an edge node.
    NCmd,
    /// `DBIRTH`: a device behind an edge node comes online.
    DBirth,
    /// `DDATA`: a device's data.
    DData,
    /// `DDEATH`: a device goes offline.
    DDeath,
    /// `DCMD`: a command to a device.
    DCmd,
}

impl Kind {
    /// The kind a topic level names (`NBIRTH`, ...), if any.
    pub fn from_message_type(level: &str) -> Option<Kind> {
        Some(match level {
            "NBIRTH" => Kind::NBirth,
            "NDATA" => Kind::NData,
            "NDEATH" => Kind::NDeath,
            "NCMD" => Kind::NCmd,
            "DBIRTH" => Kind::DBirth,
            "DDATA" => Kind::DData,
            "DDEATH" => Kind::DDeath,
            "DCMD" => Kind::DCmd,
            _ => return None,
        })
    }

    /// The topic level naming this kind.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::NBirth => "NBIRTH",
            Kind::NData => "NDATA",
            Kind::NDeath => "NDEATH",
            Kind::NCmd => "NCMD",
            Kind::DBirth => "DBIRTH",
            Kind::DData => "DDATA",
            Kind::DDeath => "DDEATH",
            Kind::DCmd => "DCMD",
        }
    }

    /// Whether the message is about a device (its topic names one).
    pub fn is_device(self) -> bool {
        matches!(self, Kind::DBirth | Kind::DData | Kind::DDeath | Kind::DCmd)
    }
}

/// A Sparkplug topic's parts, borrowed from the topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Topic<'a> {
    /// The group id.
    pub group: &'a str,
    /// The message type.
    pub kind: Kind,
    /// The edge node id.
    pub edge_node: &'a str,
    /// The device id: present exactly when `kind` is a device kind.
    pub device: Option<&'a str>,
}

/// Reads `spBv1.0/{group_id}/{message_type}/{edge_node_id}[/{device_id}]`.
/// None for another namespace or message type, a device level on a node
/// kind or none on a device kind, extra levels, or any level empty or
/// holding a `+` or `#`.
pub fn parse_topic(topic: &str) -> Option<Topic<'_>> {
    let mut levels = topic.split('/');
    if levels.next()? != NAMESPACE {
        return None;
    }
    let group = id_level(levels.next()?)?;
    let kind = Kind::from_message_type(levels.next()?)?;
    let edge_node = id_level(levels.next()?)?;
    let device = match levels.next() {
        Some(level) => Some(id_level(level)?),
        None => None,
    };
    if levels.next().is_some() || device.is_some() != kind.is_device() {
        return None;
    }
    Some(Topic {
        group,
        kind,
        edge_node,
        device,
    })
}

/// Reads the Sparkplug 3.0 host state topic `spBv1.0/STATE/{host_id}`
/// and returns the host id (not empty, no `+` or `#`).
pub fn parse_state_topic(topic: &str) -> Option<&str> {
    let mut levels = topic.split('/');
    if levels.next()? != NAMESPACE || levels.next()? != "STATE" {
        return None;
    }
    let host = id_level(levels.next()?)?;
    levels.next().is_none().then_some(host)
}

/// An id level of a topic: not empty, no wildcard.
fn id_level(level: &str) -> Option<&str> {
    (!level.is_empty() && !level.contains(['+', '#'])).then_some(level)
}
