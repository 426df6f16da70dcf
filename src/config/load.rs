//! Reading the config: the file and `FERRY_<SECTION>__<KEY>` environment
//! overrides into [`RawConfig`], with every unknown key and every value of
//! the wrong kind named (an override by its variable), the keys refused
//! left at their defaults so the checks of the rest still run.

use std::collections::BTreeSet;
use std::path::Path;

use super::check::{ConfigError, ConfigErrors};
use super::raw::RawConfig;

impl RawConfig {
    /// Reads the file and the environment; refuses unknown keys and values
    /// of the wrong type by name, every one of them, and names the
    /// environment variable when an override is the culprit.
    pub fn load(path: &Path) -> Result<RawConfig, ConfigErrors> {
        let (raw, problems) = RawConfig::read(path)?;
        if problems.is_empty() {
            Ok(raw)
        } else {
            Err(ConfigErrors::from_vec(problems))
        }
    }

    /// What [`RawConfig::load`] reads, with the keys it refuses left at
    /// their defaults and named in the problems returned beside it, so the
    /// checks of every other key still run. Err: the file cannot be read
    /// as TOML at all.
    pub(super) fn read(path: &Path) -> Result<(RawConfig, Vec<ConfigError>), ConfigErrors> {
        if !path.is_file() {
            return Err(ConfigError::new(
                "--config",
                format!("{} is not a readable file", path.display()),
            )
            .into());
        }
        let built = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix("FERRY")
                    .prefix_separator("_")
                    .separator("__")
                    .try_parsing(true)
                    // The list keys: `FERRY_NORTH__ENDPOINTS=a:1883,b:1883`.
                    .list_separator(",")
                    .with_list_parse_key("north.endpoints")
                    .with_list_parse_key("admin.allowed_hosts"),
            )
            .build()
            .map_err(|e| from_config_error(&e))?;
        // The cache, not a deserialized copy: only it knows which value
        // came from the environment.
        let mut table = built
            .cache
            .clone()
            .into_table()
            .map_err(|e| from_config_error(&e))?;
        let mut problems = Vec::new();
        check_known_keys(&table, &mut problems);
        // What the kinds let through can still be wrong (a negative port,
        // a float for a count): each key is read on its own, so every bad
        // one is named, not only serde's first.
        for (section, keys) in sorted(&table) {
            let Ok(keys) = keys.clone().into_table() else {
                continue;
            };
            for (key, value) in sorted(&keys) {
                let name = format!("{section}.{key}");
                if problems
                    .iter()
                    .any(|p: &ConfigError| overlap(&p.key, &name))
                {
                    continue;
                }
                let one = config::Map::from([(
                    section.clone(),
                    config::Value::new(None, config::Map::from([(key.clone(), value.clone())])),
                )]);
                if let Err(e) = config::Value::new(None, one).try_deserialize::<RawConfig>() {
                    let mut e = from_config_error(&e);
                    if !e.key.starts_with(&name) {
                        e.key = name;
                    }
                    problems.push(blame(e, value));
                }
            }
        }
        for p in &problems {
            remove(&mut table, &p.key);
        }
        let mut raw: RawConfig = config::Value::new(None, table.clone())
            .try_deserialize()
            .map_err(|e| from_config_error(&e))?;
        for (section, value) in &table {
            env_keys(section, value, &mut raw.from_env);
        }
        Ok((raw, problems))
    }
}

/// Whether the keys `a` and `b` are the same or one holds the other
/// (`south` and `south.port`, `north.endpoints` and `north.endpoints[1]`).
fn overlap(a: &str, b: &str) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    long.strip_prefix(short)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// Takes the key `path` (`south.tls.cert`) out of `table`, so its default
/// stands in while the other keys are checked.
fn remove(table: &mut config::Map<String, config::Value>, path: &str) {
    let path = path.split('[').next().unwrap_or(path);
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    match rest {
        None => {
            table.remove(head);
        }
        Some(rest) => {
            if let Some(config::Value {
                kind: config::ValueKind::Table(inner),
                ..
            }) = table.get_mut(head)
            {
                remove(inner, rest);
            }
        }
    }
}

/// `map`'s entries by name, so problems come out in a stable order.
fn sorted<V>(map: &config::Map<String, V>) -> Vec<(&String, &V)> {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries
}

/// The environment variable that sets `key` (`south.port` →
/// `FERRY_SOUTH__PORT`).
fn env_var(key: &str) -> String {
    format!("FERRY_{}", key.replace('.', "__").to_uppercase())
}

/// `e`, naming the environment variable when `value` came from one: a
/// mistyped override is not the file's fault.
fn blame(mut e: ConfigError, value: &config::Value) -> ConfigError {
    let mut set = BTreeSet::new();
    env_keys(&e.key, value, &mut set);
    // A table (an unknown section) names its first variable.
    e.env = set.first().map(|key| env_var(key));
    e
}

/// Whether `value`, or anything in it, came from an environment variable.
fn from_environment(value: &config::Value) -> bool {
    if value.origin() == Some("the environment") {
        return true;
    }
    match &value.kind {
        config::ValueKind::Table(t) => t.values().any(from_environment),
        config::ValueKind::Array(a) => a.iter().any(from_environment),
        _ => false,
    }
}

/// Notes every key in `table` that [`RawConfig`] does not have, and every
/// value whose kind is not the key's.
fn check_known_keys(table: &config::Map<String, config::Value>, problems: &mut Vec<ConfigError>) {
    let known = serde_json::to_value(RawConfig::default()).expect("RawConfig serializes");
    for (section, value) in sorted(table) {
        if section == "groups" {
            // Free-form: every key is a group name, checked in from_raw.
            continue;
        }
        let Some(known_section) = known.get(section) else {
            problems.push(blame(
                ConfigError::new(section, "unknown section; see conf/ferry.toml for the keys"),
                value,
            ));
            continue;
        };
        check_table(section, value, known_section, problems);
    }
}

/// Notes each key in the table `value` (at `path`) that `known` lacks, and
/// each value of the wrong kind, looking into nested tables (`south.tls`).
fn check_table(
    path: &str,
    value: &config::Value,
    known: &serde_json::Value,
    problems: &mut Vec<ConfigError>,
) {
    let Ok(keys) = value.clone().into_table() else {
        problems.push(blame(
            ConfigError::new(path, "must be a table of keys"),
            value,
        ));
        return;
    };
    for (key, value) in sorted(&keys) {
        let name = format!("{path}.{key}");
        let Some(known_key) = known.get(key) else {
            problems.push(blame(
                ConfigError::new(&name, "unknown key; see conf/ferry.toml for the keys"),
                value,
            ));
            continue;
        };
        if known_key.is_object() {
            check_table(&name, value, known_key, problems);
        } else if let Some(wrong) = wrong_kind(value, known_key) {
            problems.push(blame(ConfigError::new(&name, wrong), value));
        }
    }
}

/// Why `value` cannot be the key whose default is `known`, when its kind
/// is wrong. The config crate would quietly turn `port = "1884"` into a
/// number; a quoted number is refused here instead, as TOML means it. An
/// environment variable has no kinds: its text is parsed (`1884` is a
/// number, `true` a bool), and anything may stand for a string.
fn wrong_kind(value: &config::Value, known: &serde_json::Value) -> Option<String> {
    use config::ValueKind as K;
    let env = value.origin() == Some("the environment");
    match (&value.kind, known) {
        (K::String(s), serde_json::Value::Number(_)) => Some(format!(
            "must be a number, not the string {s:?}{}",
            if env { "" } else { "; write it without quotes" }
        )),
        (K::String(s), serde_json::Value::Bool(_)) => Some(format!(
            "must be true or false, not the string {s:?}{}",
            if env { "" } else { "; write it without quotes" }
        )),
        (
            K::I64(_) | K::U64(_) | K::I128(_) | K::U128(_) | K::Float(_) | K::Boolean(_),
            serde_json::Value::String(_),
        ) if !env => Some("must be a string, in quotes".to_string()),
        (K::Float(f), serde_json::Value::Number(n)) if !n.is_f64() => {
            Some(format!("must be a whole number (got {f})"))
        }
        (
            K::Table(_),
            serde_json::Value::Number(_)
            | serde_json::Value::Bool(_)
            | serde_json::Value::String(_),
        ) => Some("must be a single value, not a table".to_string()),
        _ => None,
    }
}

fn from_config_error(e: &config::ConfigError) -> ConfigError {
    let text = e.to_string();
    // The config crate says "... for key `north.port` in ..." where it knows the key.
    let key = text
        .split("for key `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or("(file)")
        .to_string();
    // The key is said once, first; the file is the line's own prefix.
    let reason = match text.split_once(" for key `") {
        Some((reason, _)) => reason.to_string(),
        None => one_line(&text),
    };
    ConfigError {
        key,
        reason,
        env: None,
    }
}

/// Adds to `keys` the key paths under `path` that an environment variable
/// set.
fn env_keys(path: &str, value: &config::Value, keys: &mut BTreeSet<String>) {
    match &value.kind {
        config::ValueKind::Table(t) => {
            for (key, value) in t {
                env_keys(&format!("{path}.{key}"), value, keys);
            }
        }
        _ if from_environment(value) => {
            keys.insert(path.to_string());
        }
        _ => {}
    }
}

/// `e`, naming the environment variable when one set its key: a check of
/// a value's range refuses an override like a value in the file.
pub(super) fn blame_env(mut e: ConfigError, from_env: &BTreeSet<String>) -> ConfigError {
    let key = e.key.split('[').next().unwrap_or(&e.key).to_string();
    if from_env.contains(&key) {
        e.env = Some(env_var(&key));
    }
    e
}

/// A TOML parser's report on one line: its message lines without the
/// drawing of the source around the spot (`3 | [south`, `  ^`), which the
/// line and column already give, and without the trailing file name.
fn one_line(text: &str) -> String {
    let kept: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with('|') && !l.starts_with('^') && !l.contains(" | ")
        })
        .filter(|l| !l.starts_with("in "))
        .collect();
    let mut line = kept.join("; ");
    if let Some(at) = line.rfind(" in ") {
        if !line[at..].contains(';') {
            line.truncate(at);
        }
    }
    line
}
