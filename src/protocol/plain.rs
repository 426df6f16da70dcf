//! Plain devices' topics (docs/PROTOCOL.md, "Plain devices"): devices that
//! publish their own values on their own topic trees, with no envelope.
//!
//! A [`PlainFilter`] is an MQTT topic filter in which one whole level is
//! `{device}`: `plant/+/{device}/#`. A publish whose topic matches it is a
//! plain uplink of the device that level names; [`PlainTopics`] holds the
//! gateway's filters and says whose a topic is. The device level must be
//! a device id (`[A-Za-z0-9._-]{1,64}`), so a topic naming none is no
//! plain topic at all.
//!
//! What ferry adds to a plain uplink it stores: its own `msg_id`
//! ([`plain_msg_id`]), unique per gateway, and the stream [`PLAIN_STREAM`].

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

use super::depth::{nested_deeper_than, MAX_DEPTH};
use super::envelope::{Envelope, Payload};
use super::user_props::UserProps;
use crate::ids::{DeviceId, MsgId};

/// The level that names the device.
pub const DEVICE_LEVEL: &str = "{device}";

/// The stream every plain uplink is stored and sent north under:
/// `{north}/up/{device}/plain`.
pub const PLAIN_STREAM: &str = "plain";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Level {
    Exact(String),
    /// `+`
    Any,
    /// `#`, last only
    Rest,
    Device,
}

/// One `south.plain_topics` entry, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainFilter {
    text: String,
    levels: Vec<Level>,
}

impl PlainFilter {
    /// Reads a filter: MQTT filter syntax, exactly one `{device}` level,
    /// and a first level that is a plain word outside `reserved` (the
    /// device topics' prefix) and not `$...`, so a plain topic never
    /// shadows a protocol topic. The error says what is wrong, in words.
    pub fn parse(text: &str, reserved: &[&str]) -> Result<PlainFilter, String> {
        if text.is_empty() || text.contains('\0') {
            return Err("is empty".into());
        }
        let parts: Vec<&str> = text.split('/').collect();
        let mut levels = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            levels.push(match *part {
                DEVICE_LEVEL => Level::Device,
                "+" => Level::Any,
                "#" if i + 1 == parts.len() => Level::Rest,
                "#" => return Err("has `#` before its last level".into()),
                p if p.contains(['+', '#', '{', '}']) => {
                    return Err(format!(
                        "level `{p}` mixes a wildcard or brace with text (a level is a word, \
                         `+`, `#` or `{DEVICE_LEVEL}`)"
                    ))
                }
                p => Level::Exact(p.to_string()),
            });
        }
        match levels.iter().filter(|l| **l == Level::Device).count() {
            1 => {}
            0 => return Err(format!("has no `{DEVICE_LEVEL}` level")),
            _ => return Err(format!("has more than one `{DEVICE_LEVEL}` level")),
        }
        match &levels[0] {
            Level::Exact(first) if first.is_empty() => {
                return Err("starts with `/` (an empty first level)".into())
            }
            Level::Exact(first) if first.starts_with('$') => {
                return Err(format!(
                    "starts with `{first}`: `$` topics are the broker's"
                ))
            }
            Level::Exact(first) if reserved.contains(&first.as_str()) => {
                return Err(format!(
                    "starts with `{first}`, the device topics' prefix (south.topic_prefix)"
                ))
            }
            Level::Exact(_) => {}
            _ => {
                return Err(
                    "starts with a wildcard or `{device}`: its first level must be a word, so \
                     it cannot match the device topics"
                        .into(),
                )
            }
        }
        Ok(PlainFilter {
            text: text.to_string(),
            levels,
        })
    }

    /// The filter as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The MQTT filter that subscribes to it: `{device}` as `+`.
    pub fn subscription(&self) -> String {
        self.text.replace(DEVICE_LEVEL, "+")
    }

    /// The device `topic` belongs to under this filter, if it matches.
    pub fn device<'t>(&self, topic: &'t str) -> Option<&'t str> {
        let mut device = None;
        let mut parts = topic.split('/');
        for level in &self.levels {
            match (level, parts.next()) {
                (Level::Rest, _) => return device,
                (_, None) => return None,
                (Level::Any, Some(_)) => {}
                (Level::Device, Some(part)) => device = Some(part),
                (Level::Exact(want), Some(part)) => {
                    if want != part {
                        return None;
                    }
                }
            }
        }
        if parts.next().is_some() {
            return None;
        }
        device
    }
}

/// The gateway's plain topics (`south.plain_topics`), in the order written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlainTopics {
    filters: Vec<PlainFilter>,
}

impl PlainTopics {
    pub fn new(filters: Vec<PlainFilter>) -> PlainTopics {
        PlainTopics { filters }
    }

    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    pub fn filters(&self) -> &[PlainFilter] {
        &self.filters
    }

    /// The device whose plain uplink a publish on `topic` is: the first
    /// filter that matches with a device id at its `{device}` level.
    pub fn device(&self, topic: &str) -> Option<DeviceId> {
        self.filters
            .iter()
            .filter_map(|f| f.device(topic))
            .find_map(|d| DeviceId::new(d).ok())
    }

    /// Whether client `client` may publish on `topic` as a plain device:
    /// the topic is a plain topic, of `client` itself when `bound` (the
    /// client's id is proven: passwords or certificates), of any device
    /// otherwise.
    pub fn may_publish(&self, bound: bool, client: &str, topic: &str) -> bool {
        self.device(topic)
            .is_some_and(|d| !bound || d.as_str() == client)
    }
}

/// This run's plain msg_ids: `run` is the wall clock at start (ms, hex)
/// and 32 random bits, so two runs share it only if both coincide; wills
/// (which the broker publishes, unnumbered) count on their own as
/// `p.{run}.w{n}`.
#[derive(Debug)]
pub struct PlainIds {
    run: String,
    wills: AtomicU64,
}

impl PlainIds {
    pub fn new() -> PlainIds {
        PlainIds {
            run: format!("{:x}{:08x}", super::now_ms(), rand::random::<u32>()),
            wills: AtomicU64::new(0),
        }
    }

    /// The msg_id of the publish the broker numbered `number` (a will:
    /// `None`).
    pub fn of(&self, number: Option<u64>) -> MsgId {
        let id = match number {
            Some(number) => plain_msg_id(&self.run, number),
            None => {
                let will = self.wills.fetch_add(1, Ordering::Relaxed) + 1;
                format!("p.{}.w{will}", self.run)
            }
        };
        MsgId::new(id).expect("a hex run and numbers make a msg_id")
    }
}

impl Default for PlainIds {
    fn default() -> Self {
        PlainIds::new()
    }
}

/// The `msg_id` ferry gives a plain uplink: `p.{run}.{number}`, where `run`
/// is unique per gateway run and `number` per message within it.
pub fn plain_msg_id(run: &str, number: u64) -> String {
    format!("p.{run}.{number}")
}

/// A plain publish as the envelope ferry stores for it: `msg_id` (ferry's
/// own), `topic` (the original), `payload` when the bytes are JSON
/// (written back as parsed: whitespace and number spelling may differ, the
/// value does not) or `payload_b64` otherwise, the QoS it was published
/// with when known, and `retain: true` when it was set.
pub fn plain_envelope(
    msg_id: MsgId,
    topic: &str,
    payload: &[u8],
    qos: Option<u8>,
    retain: bool,
) -> Envelope {
    let json = (!payload.is_empty() && !nested_deeper_than(payload, MAX_DEPTH))
        .then(|| serde_json::from_slice::<Value>(payload).ok())
        .flatten();
    let mut fields = Map::new();
    fields.insert("msg_id".into(), Value::String(msg_id.to_string()));
    fields.insert("topic".into(), Value::String(topic.to_string()));
    match json {
        Some(value) => fields.insert("payload".into(), value),
        None => {
            let Payload::Base64(b64) = Payload::bytes(payload) else {
                unreachable!("Payload::bytes is base64")
            };
            fields.insert("payload_b64".into(), Value::String(b64))
        }
    };
    if let Some(qos) = qos {
        fields.insert("qos".into(), qos.into());
    }
    if retain {
        fields.insert("retain".into(), true.into());
    }
    Envelope {
        msg_id,
        ts: None,
        ttl: None,
        retry: true,
        fields,
        props: UserProps::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(text: &str) -> PlainFilter {
        PlainFilter::parse(text, &["devices"]).unwrap()
    }

    #[test]
    fn a_filter_names_the_device_at_its_device_level() {
        let f = filter("plant/+/{device}/#");
        assert_eq!(f.device("plant/line3/press-7/temp"), Some("press-7"));
        assert_eq!(f.device("plant/line3/press-7/a/b/c"), Some("press-7"));
        assert_eq!(
            f.device("plant/line3/press-7"),
            Some("press-7"),
            "`#` also matches its parent level"
        );
        assert_eq!(f.device("plant/line3"), None);
        assert_eq!(f.device("other/line3/press-7/temp"), None);
        let exact = filter("site/{device}/temp");
        assert_eq!(exact.device("site/s1/temp"), Some("s1"));
        assert_eq!(exact.device("site/s1/temp/x"), None);
        assert_eq!(exact.device("site/s1"), None);
        assert_eq!(exact.subscription(), "site/+/temp");
    }

    #[test]
    fn a_topic_whose_device_level_is_no_device_id_is_no_plain_topic() {
        let topics = PlainTopics::new(vec![filter("plant/{device}/#")]);
        assert_eq!(topics.device("plant/press 7/temp"), None);
        assert_eq!(topics.device("plant//temp"), None);
        assert_eq!(
            topics.device("plant/press-7/temp").unwrap().as_str(),
            "press-7"
        );
    }

    #[test]
    fn with_proven_ids_a_client_publishes_only_under_its_own_device_level() {
        let topics = PlainTopics::new(vec![filter("plant/{device}/#")]);
        assert!(topics.may_publish(true, "press-7", "plant/press-7/temp"));
        assert!(!topics.may_publish(true, "press-7", "plant/press-8/temp"));
        assert!(topics.may_publish(false, "press-7", "plant/press-8/temp"));
        assert!(!topics.may_publish(false, "press-7", "elsewhere/press-7"));
    }

    #[test]
    fn a_plain_payload_goes_north_as_json_when_it_is_json_and_as_base64_otherwise() {
        let id = MsgId::new("p.x.1").unwrap();
        let json = plain_envelope(id.clone(), "plant/a/temp", b"81.5", Some(1), false);
        assert_eq!(json.fields["payload"], serde_json::json!(81.5));
        assert_eq!(json.fields["topic"], "plant/a/temp");
        assert_eq!(json.fields["qos"], 1);
        assert!(!json.fields.contains_key("retain"));
        let bytes = plain_envelope(id.clone(), "plant/a/temp", b"\x00\xffok", None, true);
        assert_eq!(bytes.fields["payload_b64"], "AP9vaw==");
        assert!(!bytes.fields.contains_key("payload"));
        assert!(!bytes.fields.contains_key("qos"));
        assert_eq!(bytes.fields["retain"], true);
        let text = plain_envelope(id.clone(), "t/a", b"on", Some(0), false);
        assert_eq!(text.fields["payload_b64"], "b24=", "a bare word is no JSON");
        let empty = plain_envelope(id, "t/a", b"", Some(0), false);
        assert_eq!(empty.fields["payload_b64"], "");
    }

    #[test]
    fn a_bad_filter_is_refused_in_words() {
        let bad = |t: &str| PlainFilter::parse(t, &["devices"]).unwrap_err();
        assert!(bad("plant/+/temp").contains("no `{device}`"));
        assert!(bad("plant/{device}/{device}").contains("more than one"));
        assert!(bad("plant/#/{device}").contains("`#` before its last"));
        assert!(bad("devices/{device}/#").contains("south.topic_prefix"));
        assert!(bad("+/{device}").contains("first level"));
        assert!(bad("{device}/temp").contains("first level"));
        assert!(bad("$SYS/{device}").contains("broker's"));
        assert!(bad("plant/dev{device}").contains("mixes"));
        assert!(bad("/{device}").contains("empty first level"));
        assert!(bad("").contains("empty"));
    }
}
