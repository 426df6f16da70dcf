//! The checks every section shares, and the one error they report: a
//! problem with one key.

/// A configuration error, always about one key.
#[derive(Debug, Clone, thiserror::Error)]
#[error("config key `{key}`{}: {reason}", .env.as_ref().map(|v| format!(", set by the environment variable {v}")).unwrap_or_default())]
pub struct ConfigError {
    pub key: String,
    pub reason: String,
    /// The environment variable that set the key, when one did: the
    /// culprit is then not the file.
    pub env: Option<String>,
}

/// Every problem a config has, in the order found: what `Config::load`
/// refuses a config with. Never empty.
#[derive(Debug)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    /// The first problem found.
    pub fn first(&self) -> &ConfigError {
        &self.0[0]
    }

    /// `problems`, which must not be empty.
    pub(super) fn from_vec(problems: Vec<ConfigError>) -> Self {
        debug_assert!(!problems.is_empty());
        ConfigErrors(problems)
    }

    /// Every problem, one per key.
    pub fn iter(&self) -> impl Iterator<Item = &ConfigError> {
        self.0.iter()
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

/// One problem per line.
impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// The problems found so far: a check that fails is noted and checking
/// goes on, so an operator sees every bad key in one run.
#[derive(Debug, Default)]
pub(super) struct Problems(Vec<ConfigError>);

impl Problems {
    /// `result`'s value, or `None` with its error noted.
    pub(super) fn take<T>(&mut self, result: Result<T, ConfigError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                self.0.push(e);
                None
            }
        }
    }

    pub(super) fn note(&mut self, e: ConfigError) {
        self.0.push(e);
    }

    /// How many problems are noted so far.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// `value` when nothing was noted; every problem otherwise.
    pub(super) fn finish<T>(self, value: Option<T>) -> Result<T, ConfigErrors> {
        match value {
            Some(v) if self.0.is_empty() => Ok(v),
            Some(_) => Err(ConfigErrors(self.0)),
            // Every check that returns nothing notes why; should one not,
            // the config is still refused, by a line that says so.
            None if self.0.is_empty() => Err(ConfigErrors(vec![ConfigError::new(
                "(config)",
                "refused without a reason (a bug in ferry's checks; please report it)",
            )])),
            None => Err(ConfigErrors(self.0)),
        }
    }
}

impl ConfigError {
    pub(super) fn new(key: &str, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.to_string(),
            reason: reason.into(),
            env: None,
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
