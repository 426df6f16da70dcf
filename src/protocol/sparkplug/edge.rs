//! Sparkplug B edge nodes as ferry devices (docs/PROTOCOL.md, "Sparkplug
//! B edge nodes"): which device publishes are an edge node's, what ferry
//! stores for one, and each node's sequence checks.
//!
//! - [`SparkplugTopics`] (`[south.sparkplug]`): a publish on
//!   `spBv1.0/{group}/{NBIRTH|NDATA|NDEATH|DBIRTH|DDATA|DDEATH}/{edge_node}[/{device}]`
//!   is an uplink of the ferry device named by the edge node id, stored on
//!   stream [`STREAM`]. Commands (`NCMD`, `DCMD`) and `STATE` are a host's,
//!   never an edge node's.
//! - [`sparkplug_envelope`]: the body north, the payload as `payload_b64`
//!   beside a `sparkplug` object of what the protobuf says.
//! - [`EdgeNodes`]: one [`SeqCheck`] per `(group, edge_node)`.

use std::collections::{HashMap, VecDeque};

use serde_json::{Map, Value};

use super::seq::{SeqCheck, Summary, Verdict};
use super::topic::{parse_state_topic, parse_topic, Kind, Topic, NAMESPACE};
use crate::ids::{DeviceId, MsgId};
use crate::protocol::envelope::{Envelope, Payload};
use crate::protocol::user_props::UserProps;

/// The stream every Sparkplug uplink is stored and sent north under:
/// `{north}/up/{edge_node}/spb`.
pub const STREAM: &str = "spb";

/// The message types an edge node publishes, in topic order.
const UPLINK_KINDS: [Kind; 6] = [
    Kind::NBirth,
    Kind::NData,
    Kind::NDeath,
    Kind::DBirth,
    Kind::DData,
    Kind::DDeath,
];

/// `[south.sparkplug]`, checked: Sparkplug B is on, and the primary host
/// application whose STATE ferry follows north, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SparkplugTopics {
    /// `south.sparkplug.host_id`.
    pub host_id: Option<String>,
}

impl SparkplugTopics {
    /// The edge node a device publish on `topic` is an uplink of, with the
    /// topic read: an edge node's message type, and an edge node id that
    /// is a device id.
    pub fn edge_node<'t>(&self, topic: &'t str) -> Option<(DeviceId, Topic<'t>)> {
        let parsed = parse_topic(topic).filter(|t| UPLINK_KINDS.contains(&t.kind))?;
        let device = DeviceId::new(parsed.edge_node).ok()?;
        Some((device, parsed))
    }

    /// The filters an edge node's publishes match: one per message type
    /// (so neither `STATE` nor the commands).
    pub fn filters(&self) -> Vec<String> {
        UPLINK_KINDS
            .iter()
            .map(|k| {
                let device = if k.is_device() { "/+" } else { "" };
                format!("{NAMESPACE}/+/{}/+{device}", k.as_str())
            })
            .collect()
    }

    /// Whether client `client` may publish on `topic` as an edge node: of
    /// itself (the edge node id is its client id) when `bound` (its id is
    /// proven), of any edge node otherwise.
    pub fn may_publish(&self, bound: bool, client: &str, topic: &str) -> bool {
        self.edge_node(topic)
            .is_some_and(|(d, _)| !bound || d.as_str() == client)
    }

    /// The primary host's STATE topic north, `spBv1.0/STATE/{host_id}`.
    pub fn state_topic(&self) -> Option<String> {
        let host = self.host_id.as_deref()?;
        Some(format!("{NAMESPACE}/STATE/{host}"))
    }
}

/// Whether `host_id` can name a Sparkplug host: a topic level (not empty,
/// no `/`, `+` or `#`) of at most 128 bytes. The error says why not.
pub fn check_host_id(host_id: &str) -> Result<(), String> {
    if host_id.len() > 128 {
        return Err(format!("is {} bytes; at most 128", host_id.len()));
    }
    if host_id.contains(['/', '\0']) {
        return Err("must be one topic level: no `/`".into());
    }
    match parse_state_topic(&format!("{NAMESPACE}/STATE/{host_id}")) {
        Some(_) => Ok(()),
        None => Err("must not be empty nor hold `+` or `#`".into()),
    }
}

/// What ferry stores for an edge node's publish: ferry's `msg_id`, the
/// original `topic`, the payload as `payload_b64` (always: it is protobuf),
/// the QoS it came with, `retain: true` if set, a `sparkplug` object
/// (`group_id`, `message_type`, `edge_node_id`, `device_id`, and from the
/// payload `seq`, `bd_seq`, `timestamp` where present) and `historical:
/// true` when it was not forwarded at once (its payload is then the one
/// marked historical).
pub struct SparkplugBody<'a> {
    pub msg_id: MsgId,
    pub topic: &'a str,
    pub parsed: Topic<'a>,
    pub payload: &'a [u8],
    pub summary: Option<Summary>,
    pub qos: Option<u8>,
    pub retain: bool,
    pub historical: bool,
}

/// The envelope of [`SparkplugBody`].
pub fn sparkplug_envelope(body: SparkplugBody<'_>) -> Envelope {
    let mut spb = Map::new();
    spb.insert("group_id".into(), body.parsed.group.into());
    spb.insert("message_type".into(), body.parsed.kind.as_str().into());
    spb.insert("edge_node_id".into(), body.parsed.edge_node.into());
    if let Some(device) = body.parsed.device {
        spb.insert("device_id".into(), device.into());
    }
    if let Some(s) = body.summary {
        let present = [
            ("seq", s.seq),
            ("bd_seq", s.bd_seq),
            ("timestamp", s.timestamp),
        ];
        for (name, value) in present {
            if let Some(v) = value {
                spb.insert(name.into(), v.into());
            }
        }
    }
    let mut fields = Map::new();
    fields.insert("msg_id".into(), body.msg_id.to_string().into());
    fields.insert("topic".into(), body.topic.into());
    let Payload::Base64(b64) = Payload::bytes(body.payload) else {
        unreachable!("Payload::bytes is base64")
    };
    fields.insert("payload_b64".into(), b64.into());
    if let Some(qos) = body.qos {
        fields.insert("qos".into(), qos.into());
    }
    if body.retain {
        fields.insert("retain".into(), true.into());
    }
    fields.insert("sparkplug".into(), Value::Object(spb));
    if body.historical {
        fields.insert("historical".into(), true.into());
    }
    Envelope {
        msg_id: body.msg_id,
        ts: None,
        ttl: None,
        retry: true,
        fields,
        props: UserProps::default(),
    }
}

/// Edge nodes followed at most: past it one of them is forgotten (its next
/// message reads as data before a birth).
const MAX_NODES: usize = 65_536;

/// Publish numbers remembered per node, to know a resend (DUP) of a
/// publish already checked.
const RECENT: usize = 64;

/// Each edge node's sequence check, by `(group, edge_node)`.
#[derive(Debug, Default)]
pub struct EdgeNodes {
    nodes: HashMap<(String, String), Node>,
}

#[derive(Debug, Default)]
struct Node {
    check: SeqCheck,
    /// The broker's numbers of the node's latest publishes checked.
    recent: VecDeque<u64>,
    /// Its session began before ferry saw it (before this gateway run):
    /// checking started from the first message seen, and its NBIRTH's
    /// `bdSeq` is not known.
    adopted: bool,
}

impl EdgeNodes {
    /// Checks one publish of the node `topic` names. `number` is the
    /// broker's number of the publish, which a resend of a publish never
    /// acknowledged keeps: a number already checked is not checked again
    /// (None). A payload that is not Sparkplug (`summary` None) is checked
    /// as one that carries neither `seq` nor `bdSeq`.
    ///
    /// A node first seen with data (it was born before this gateway run,
    /// or before the node was last forgotten) is checked from that
    /// message's `seq` on, and its NDEATH, whose `bdSeq` cannot be matched
    /// to a birth ferry never saw, is taken as it comes.
    pub fn check(
        &mut self,
        topic: &Topic<'_>,
        number: Option<u64>,
        summary: Option<&Summary>,
    ) -> Option<Verdict> {
        let key = (topic.group.to_string(), topic.edge_node.to_string());
        let fresh = !self.nodes.contains_key(&key);
        if fresh && self.nodes.len() >= MAX_NODES {
            let any = self.nodes.keys().next().cloned();
            any.map(|k| self.nodes.remove(&k));
        }
        let node = self.nodes.entry(key).or_default();
        if let Some(n) = number {
            if node.recent.contains(&n) {
                return None;
            }
            if node.recent.len() >= RECENT {
                node.recent.pop_front();
            }
            node.recent.push_back(n);
        }
        let summary = summary.copied().unwrap_or_default();
        let verdict = node.check.check(topic.kind, &summary);
        Some(match (verdict, topic.kind) {
            (Verdict::NoBirth, Kind::NDeath) if fresh => Verdict::InOrder,
            (Verdict::NoBirth, _) if fresh && summary.seq.is_some() => {
                // Its NBIRTH came before ferry was there: check from here.
                let from = Summary {
                    bd_seq: None,
                    ..summary
                };
                node.check.check(Kind::NBirth, &from);
                node.adopted = true;
                Verdict::InOrder
            }
            (Verdict::MissingBdSeq, Kind::NDeath) if node.adopted => Verdict::InOrder,
            (verdict, kind) => {
                if kind == Kind::NBirth || kind == Kind::NDeath {
                    node.adopted = false;
                }
                verdict
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::sparkplug::{encode_example, summarise};

    fn spb() -> SparkplugTopics {
        SparkplugTopics {
            host_id: Some("scada".into()),
        }
    }

    #[test]
    fn an_edge_nodes_publishes_are_its_own_and_commands_and_state_are_nobodys() {
        let t = spb();
        for topic in [
            "spBv1.0/plant/NBIRTH/node-1",
            "spBv1.0/plant/NDATA/node-1",
            "spBv1.0/plant/NDEATH/node-1",
            "spBv1.0/plant/DBIRTH/node-1/pump",
            "spBv1.0/plant/DDATA/node-1/pump",
            "spBv1.0/plant/DDEATH/node-1/pump",
        ] {
            let (device, parsed) = t.edge_node(topic).expect(topic);
            assert_eq!(device.as_str(), "node-1", "{topic}");
            assert_eq!(parsed.group, "plant");
        }
        for topic in [
            "spBv1.0/plant/NCMD/node-1",
            "spBv1.0/plant/DCMD/node-1/pump",
            "spBv1.0/STATE/scada",
            "spBv1.0/plant/NDATA/node 1",
            "spBv1.0/plant/NDATA/node-1/extra",
            "spAv1.0/plant/NDATA/node-1",
        ] {
            assert!(t.edge_node(topic).is_none(), "{topic}");
        }
        assert!(t.may_publish(true, "node-1", "spBv1.0/plant/NDATA/node-1"));
        assert!(!t.may_publish(true, "node-2", "spBv1.0/plant/NDATA/node-1"));
        assert!(t.may_publish(false, "node-2", "spBv1.0/plant/NDATA/node-1"));
        assert!(!t.may_publish(false, "node-1", "spBv1.0/plant/NCMD/node-1"));
        assert_eq!(t.state_topic().as_deref(), Some("spBv1.0/STATE/scada"));
        assert_eq!(SparkplugTopics::default().state_topic(), None);
    }

    #[test]
    fn the_filters_match_exactly_the_edge_nodes_message_types() {
        let filters = spb().filters();
        assert_eq!(filters[0], "spBv1.0/+/NBIRTH/+");
        assert_eq!(filters[5], "spBv1.0/+/DDEATH/+/+");
        assert!(!filters
            .iter()
            .any(|f| f.contains("STATE") || f.contains("CMD")));
    }

    #[test]
    fn a_host_id_is_one_topic_level() {
        assert!(check_host_id("scada-1").is_ok());
        for bad in ["", "a/b", "a+", "#", &"x".repeat(129)] {
            assert!(check_host_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_body_carries_the_payload_and_what_the_protobuf_says() {
        let payload = encode_example(4, None, &[("temp", 81.5)]);
        let topic = "spBv1.0/plant/DDATA/node-1/pump";
        let body = sparkplug_envelope(SparkplugBody {
            msg_id: MsgId::new("p.x.1").unwrap(),
            topic,
            parsed: parse_topic(topic).unwrap(),
            payload: &payload,
            summary: summarise(&payload).ok(),
            qos: Some(1),
            retain: false,
            historical: true,
        });
        let f = &body.fields;
        assert_eq!(f["topic"], topic);
        assert!(!f.contains_key("payload"));
        let b64 = f["payload_b64"].as_str().unwrap();
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        assert_eq!(bytes, payload);
        assert_eq!(f["historical"], true);
        let spb = &f["sparkplug"];
        assert_eq!(spb["group_id"], "plant");
        assert_eq!(spb["message_type"], "DDATA");
        assert_eq!(spb["edge_node_id"], "node-1");
        assert_eq!(spb["device_id"], "pump");
        assert_eq!(spb["seq"], 4);
        assert!(spb.get("bd_seq").is_none());
        let live = sparkplug_envelope(SparkplugBody {
            msg_id: MsgId::new("p.x.2").unwrap(),
            topic: "spBv1.0/plant/NDATA/node-1",
            parsed: parse_topic("spBv1.0/plant/NDATA/node-1").unwrap(),
            payload: b"not protobuf \xff",
            summary: None,
            qos: None,
            retain: true,
            historical: false,
        });
        assert!(!live.fields.contains_key("historical"));
        assert_eq!(live.fields["retain"], true);
        assert!(live.fields["sparkplug"].get("seq").is_none());
    }

    #[test]
    fn each_edge_node_is_checked_on_its_own_and_a_resend_is_not_checked_twice() {
        let mut nodes = EdgeNodes::default();
        let birth = summarise(&encode_example(0, Some(1), &[])).unwrap();
        let data = |seq| summarise(&encode_example(seq, None, &[])).unwrap();
        let a = parse_topic("spBv1.0/g/NBIRTH/a").unwrap();
        let b = parse_topic("spBv1.0/h/NBIRTH/a").unwrap();
        let a_data = parse_topic("spBv1.0/g/NDATA/a").unwrap();
        assert_eq!(
            nodes.check(&a, Some(1), Some(&birth)),
            Some(Verdict::InOrder)
        );
        assert_eq!(
            nodes.check(&a_data, Some(2), Some(&data(1))),
            Some(Verdict::InOrder)
        );
        // The same publish again (DUP, same number): not checked.
        assert_eq!(nodes.check(&a_data, Some(2), Some(&data(1))), None);
        // Another group's node of the same id is another node.
        assert_eq!(
            nodes.check(&b, Some(3), Some(&birth)),
            Some(Verdict::InOrder)
        );
        assert_eq!(
            nodes.check(&a_data, Some(4), Some(&data(3))),
            Some(Verdict::Gap {
                expected: 2,
                got: 3
            })
        );
        assert_eq!(
            nodes.check(&a_data, None, None),
            Some(Verdict::MissingSeq),
            "a payload that is no Sparkplug carries no seq"
        );
    }

    #[test]
    fn a_node_born_before_ferry_saw_it_is_checked_from_its_first_message() {
        let mut nodes = EdgeNodes::default();
        let data = |seq| summarise(&encode_example(seq, None, &[])).unwrap();
        let death = summarise(&crate::protocol::sparkplug::encode_death_example(4)).unwrap();
        let n = parse_topic("spBv1.0/g/NDATA/n").unwrap();
        let d = parse_topic("spBv1.0/g/NDEATH/n").unwrap();
        assert_eq!(
            nodes.check(&n, None, Some(&data(17))),
            Some(Verdict::InOrder)
        );
        assert_eq!(
            nodes.check(&n, None, Some(&data(18))),
            Some(Verdict::InOrder)
        );
        assert_eq!(
            nodes.check(&n, None, Some(&data(20))),
            Some(Verdict::Gap {
                expected: 19,
                got: 20
            })
        );
        // Its death matches no birth ferry saw: taken as it comes.
        assert_eq!(nodes.check(&d, None, Some(&death)), Some(Verdict::InOrder));
        // Then data without a birth is out of session, as ever.
        assert_eq!(
            nodes.check(&n, None, Some(&data(21))),
            Some(Verdict::NoBirth)
        );
        // A node first seen dying: nothing to say.
        let other = parse_topic("spBv1.0/g/NDEATH/m").unwrap();
        assert_eq!(
            nodes.check(&other, None, Some(&death)),
            Some(Verdict::InOrder)
        );
    }
}
