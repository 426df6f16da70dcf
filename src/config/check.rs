//! The checks every section shares, and the one error they report: a
//! problem with one key.

/// A configuration error, always about one key.
#[derive(Debug, thiserror::Error)]
#[error("config key `{key}`: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
}

impl ConfigError {
    pub(super) fn new(key: &str, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.to_string(),
            reason: reason.into(),
        }
    }
}

/// Username and password of one link: both empty is anonymous.
pub(super) fn credentials(
    section: &str,
    username: &str,
    password: &str,
) -> Result<Option<(String, String)>, ConfigError> {
    match (username.is_empty(), password.is_empty()) {
        (true, true) => Ok(None),
        (true, false) => Err(ConfigError::new(
            &format!("{section}.username"),
            "a password is set but no username",
        )),
        _ => Ok(Some((username.to_string(), password.to_string()))),
    }
}

pub(super) fn in_range<T: PartialOrd + std::fmt::Display + Copy>(
    key: &str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError::new(
            key,
            format!("must be between {lo} and {hi} (got {v})"),
        ));
    }
    Ok(())
}

pub(super) fn topic_segment(key: &str, v: &str) -> Result<(), ConfigError> {
    if v.is_empty() || v.contains(['+', '#', '\0']) || v.starts_with('/') || v.ends_with('/') {
        return Err(ConfigError::new(
            key,
            "must be a topic prefix without wildcards or outer slashes",
        ));
    }
    Ok(())
}
