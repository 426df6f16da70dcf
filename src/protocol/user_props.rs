//! An MQTT 5 device publish's user properties, carried north as `props`
//! (docs/PROTOCOL.md, "Payload envelope" and "North"); the envelope takes
//! them, with the publish's message expiry, in
//! [`super::envelope::with_publish`].
//!
//! - User properties are bounded ([`MAX_PROPS`], [`MAX_PROP_KEY_BYTES`],
//!   [`MAX_PROP_VALUE_BYTES`], [`MAX_PROPS_BYTES`]); a publish past any
//!   bound is refused `too_large` as a whole, never cut short: nothing a
//!   device sent is dropped without its being told.
//! - A key may repeat (MQTT allows it). `props` is a JSON object with one
//!   entry per key: its value as a string, or, for a key the publish
//!   repeated, an array of its values in the order sent. Keys are sorted;
//!   nothing is dropped.
//! - Names starting `ferry-` ([`INTERNAL_PREFIX`]) are the gateway's own,
//!   between its broker and itself; they never reach [`UserProps`] (the
//!   broker strips a device's; `with_publish` refuses one that got by).

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// User properties on one publish, at most.
pub const MAX_PROPS: usize = 32;
/// Bytes of one user property's key, at most.
pub const MAX_PROP_KEY_BYTES: usize = 128;
/// Bytes of one user property's value, at most.
pub const MAX_PROP_VALUE_BYTES: usize = 1024;
/// Bytes of all keys and values of one publish together, at most.
pub const MAX_PROPS_BYTES: usize = 8 << 10;
/// User property names the gateway uses itself, never a device's.
pub const INTERNAL_PREFIX: &str = "ferry-";

/// Whether `name` is one of the gateway's own user properties.
pub fn is_internal(name: &str) -> bool {
    name.starts_with(INTERNAL_PREFIX)
}

/// A device's user properties, within the bounds, sorted by key (stably:
/// a repeated key's values stay in the order sent). Written as the
/// `props` object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserProps(Vec<(String, String)>);

impl UserProps {
    /// `pairs` as sent, if within every bound; otherwise why not (the
    /// detail of a `too_large` rejection).
    pub fn new(pairs: Vec<(String, String)>) -> Result<UserProps, String> {
        if pairs.len() > MAX_PROPS {
            return Err(format!("{} user properties > {MAX_PROPS}", pairs.len()));
        }
        let mut total = 0;
        for (key, value) in &pairs {
            if key.len() > MAX_PROP_KEY_BYTES {
                return Err(format!(
                    "a user property name of {} bytes > {MAX_PROP_KEY_BYTES}",
                    key.len()
                ));
            }
            if value.len() > MAX_PROP_VALUE_BYTES {
                return Err(format!(
                    "user property {key:?} has a value of {} bytes > {MAX_PROP_VALUE_BYTES}",
                    value.len()
                ));
            }
            total += key.len() + value.len();
        }
        if total > MAX_PROPS_BYTES {
            return Err(format!(
                "user properties of {total} bytes > {MAX_PROPS_BYTES}"
            ));
        }
        Ok(UserProps::sorted(pairs))
    }

    fn sorted(mut pairs: Vec<(String, String)>) -> UserProps {
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        UserProps(pairs)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs, sorted by key.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }

    /// Every value sent under `key`, in order.
    pub fn get_all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `props` object.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("strings serialize")
    }

    /// Each key once, with its values.
    fn grouped(&self) -> impl Iterator<Item = (&str, &[(String, String)])> {
        self.0
            .chunk_by(|a, b| a.0 == b.0)
            .map(|run| (run[0].0.as_str(), run))
    }
}

impl Serialize for UserProps {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (key, run) in self.grouped() {
            match run {
                [(_, one)] => map.serialize_entry(key, one)?,
                many => {
                    let values: Vec<&str> = many.iter().map(|(_, v)| v.as_str()).collect();
                    map.serialize_entry(key, &values)?
                }
            }
        }
        map.end()
    }
}

/// One entry's value: a string, or an array of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for UserProps {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<UserProps, D::Error> {
        struct Props;
        impl<'de> Visitor<'de> for Props {
            type Value = UserProps;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of strings or arrays of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UserProps, A::Error> {
                let mut pairs = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, OneOrMany>()? {
                    match value {
                        OneOrMany::One(v) => pairs.push((key, v)),
                        OneOrMany::Many(vs) if vs.is_empty() => {
                            return Err(de::Error::custom("an empty array of values"))
                        }
                        OneOrMany::Many(vs) => {
                            pairs.extend(vs.into_iter().map(|v| (key.clone(), v)))
                        }
                    }
                }
                Ok(UserProps::sorted(pairs))
            }
        }
        d.deserialize_map(Props)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pairs(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn props_are_an_object_of_strings_with_a_repeated_key_as_an_array_in_order() {
        let p = UserProps::new(pairs(&[
            ("site", "b2"),
            ("tag", "x"),
            ("line", "3"),
            ("tag", "y"),
        ]))
        .unwrap();
        assert_eq!(
            p.to_value(),
            json!({"line": "3", "site": "b2", "tag": ["x", "y"]})
        );
        assert_eq!(p.get_all("tag").collect::<Vec<_>>(), ["x", "y"]);
        let back: UserProps = serde_json::from_value(p.to_value()).unwrap();
        assert_eq!(back, p, "reads back pair for pair");
        assert_eq!(UserProps::default().to_value(), json!({}));
    }

    #[test]
    fn props_read_back_refuse_what_the_gateway_never_writes() {
        for bad in [
            json!({"a": 1}),
            json!({"a": []}),
            json!({"a": [1]}),
            json!(["a"]),
        ] {
            assert!(
                serde_json::from_value::<UserProps>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn props_within_every_bound_are_taken_and_one_past_any_is_refused() {
        let at = |n: usize, key: usize, value: usize| {
            (0..n)
                .map(|i| (format!("{i:0>key$}"), "v".repeat(value)))
                .collect::<Vec<_>>()
        };
        assert!(UserProps::new(at(MAX_PROPS, 3, 10)).is_ok());
        assert_eq!(
            UserProps::new(at(MAX_PROPS + 1, 3, 10)).unwrap_err(),
            "33 user properties > 32"
        );
        assert!(UserProps::new(at(1, MAX_PROP_KEY_BYTES, 1)).is_ok());
        assert_eq!(
            UserProps::new(at(1, MAX_PROP_KEY_BYTES + 1, 1)).unwrap_err(),
            "a user property name of 129 bytes > 128"
        );
        assert!(UserProps::new(at(1, 1, MAX_PROP_VALUE_BYTES)).is_ok());
        assert_eq!(
            UserProps::new(pairs(&[("k", &"v".repeat(MAX_PROP_VALUE_BYTES + 1))])).unwrap_err(),
            "user property \"k\" has a value of 1025 bytes > 1024"
        );
        // 8 pairs of 2 + 1022 bytes are 8 KiB exactly; one more byte is over.
        let mut full = at(8, 2, 1022);
        assert!(UserProps::new(full.clone()).is_ok());
        full[0].1.push('v');
        assert_eq!(
            UserProps::new(full).unwrap_err(),
            "user properties of 8193 bytes > 8192"
        );
    }

    #[test]
    fn only_the_ferry_prefix_is_internal() {
        assert!(is_internal("ferry-publisher"));
        assert!(is_internal("ferry-"));
        assert!(!is_internal("Ferry-x"));
        assert!(!is_internal("ferry"));
        assert!(!is_internal("x-ferry-y"));
    }
}
