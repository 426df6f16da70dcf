//! Plain devices' downlinks (docs/PROTOCOL.md, "Plain downlinks"): the
//! backend's downlinks for a device that reads no inbox batches, delivered
//! one by one on its own command topic as the bare payload.
//!
//! [`PlainDown`] is `south.plain_down`, a topic in which one whole level is
//! `{device}` (`plant/cmd/{device}`); [`raw_payload`] is what a stored
//! downlink becomes on it.

use base64::Engine;
use bytes::Bytes;
use serde_json::Value;

use super::plain::DEVICE_LEVEL;
use crate::ids::DeviceId;

/// `south.plain_down`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainDown {
    text: String,
    /// What comes before and after the `{device}` level.
    head: String,
    tail: String,
}

impl PlainDown {
    /// Reads the topic: no wildcards, exactly one whole level `{device}`,
    /// a first level that is a word outside `reserved` (the device topics'
    /// prefix) and not `$...`. It may lie inside the plain uplink topics
    /// (`plant/cmd/{device}` beside `plant/+/{device}/#`): what ferry sends
    /// there goes to the device alone, never through the broker's routes.
    /// The error says what is wrong, in words.
    pub fn parse(text: &str, reserved: &[&str]) -> Result<PlainDown, String> {
        if text.is_empty() || text.contains('\0') {
            return Err("is empty".into());
        }
        if text.contains(['+', '#']) {
            return Err(
                "has a wildcard: it is one topic per device, `+` and `#` have no place in it"
                    .into(),
            );
        }
        let levels: Vec<&str> = text.split('/').collect();
        if let Some(odd) = levels
            .iter()
            .find(|l| **l != DEVICE_LEVEL && l.contains(['{', '}']))
        {
            return Err(format!(
                "level `{odd}` mixes a brace with text (`{DEVICE_LEVEL}` is a whole level)"
            ));
        }
        match levels.iter().filter(|l| **l == DEVICE_LEVEL).count() {
            1 => {}
            0 => return Err(format!("has no `{DEVICE_LEVEL}` level")),
            _ => return Err(format!("has more than one `{DEVICE_LEVEL}` level")),
        }
        match levels[0] {
            "" => return Err("starts with `/` (an empty first level)".into()),
            DEVICE_LEVEL => {
                return Err("starts with `{device}`: its first level must be a word".into())
            }
            first if first.starts_with('$') => {
                return Err(format!(
                    "starts with `{first}`: `$` topics are the broker's"
                ))
            }
            first if reserved.contains(&first) => {
                return Err(format!(
                    "starts with `{first}`, the device topics' prefix (south.topic_prefix)"
                ))
            }
            _ => {}
        }
        let (head, tail) = text.split_once(DEVICE_LEVEL).expect("counted one");
        Ok(PlainDown {
            text: text.to_string(),
            head: head.to_string(),
            tail: tail.to_string(),
        })
    }

    /// The topic as written (`{device}` in it).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The device's command topic.
    pub fn topic(&self, device: &DeviceId) -> String {
        format!("{}{}{}", self.head, device.as_str(), self.tail)
    }

    /// Whether `filter` is `client`'s own command topic, exactly.
    pub fn is_of(&self, client: &str, filter: &str) -> bool {
        filter
            .strip_prefix(self.head.as_str())
            .and_then(|rest| rest.strip_suffix(self.tail.as_str()))
            .is_some_and(|d| d == client)
    }
}

/// What a stored downlink (the backend's envelope as committed) is sent
/// to a plain device as: the bytes of `payload_b64`; or `payload` as its
/// text when it is a JSON string (`"START"` goes as `START`), as compact
/// JSON otherwise. `None` when the body has neither (it cannot be sent).
pub fn raw_payload(body: &[u8]) -> Option<Bytes> {
    let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    if let Some(Value::String(b64)) = fields.get("payload_b64") {
        return base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .map(Bytes::from);
    }
    match fields.get("payload")? {
        Value::String(text) => Some(Bytes::from(text.clone())),
        value => serde_json::to_vec(value).ok().map(Bytes::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn down(text: &str) -> Result<PlainDown, String> {
        PlainDown::parse(text, &["devices"])
    }

    #[test]
    fn the_topic_names_each_device_at_its_level() {
        let d = down("cmd/{device}/set").unwrap();
        let press = DeviceId::new("press-7").unwrap();
        assert_eq!(d.topic(&press), "cmd/press-7/set");
        assert!(d.is_of("press-7", "cmd/press-7/set"));
        assert!(!d.is_of("press-7", "cmd/press-8/set"));
        assert!(!d.is_of("press-7", "cmd/press-7/set/x"));
        assert!(!d.is_of("press-7", "cmd/+/set"));
    }

    #[test]
    fn a_bad_topic_is_refused_in_words() {
        for (text, why) in [
            ("", "empty"),
            ("cmd/+/{device}", "wildcard"),
            ("cmd/#", "wildcard"),
            ("cmd/x", "no `{device}`"),
            ("cmd/{device}/{device}", "more than one"),
            ("cmd/dev{device}", "brace"),
            ("/{device}", "empty first level"),
            ("{device}/cmd", "first level must be a word"),
            ("$SYS/{device}", "broker's"),
            ("devices/{device}", "prefix"),
        ] {
            let e = down(text).expect_err(text);
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn a_downlink_goes_as_its_bare_payload() {
        let raw =
            |b: &str| raw_payload(b.as_bytes()).map(|b| String::from_utf8(b.to_vec()).unwrap());
        assert_eq!(
            raw(r#"{"msg_id":"m","payload":"START"}"#).as_deref(),
            Some("START")
        );
        assert_eq!(
            raw(r#"{"msg_id":"m","payload":{"rpm":1200}}"#).as_deref(),
            Some(r#"{"rpm":1200}"#)
        );
        assert_eq!(
            raw(r#"{"msg_id":"m","payload":81.5}"#).as_deref(),
            Some("81.5")
        );
        assert_eq!(
            raw(r#"{"msg_id":"m","payload_b64":"AAEC"}"#).map(|s| s.into_bytes()),
            Some(vec![0, 1, 2])
        );
        assert_eq!(raw(r#"{"msg_id":"m"}"#), None);
        assert_eq!(raw("not json"), None);
    }
}
