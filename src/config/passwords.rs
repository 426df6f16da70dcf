//! The password file `ferry passwd` writes and `south.password_file`
//! names: one `device:hash` line per device, the hash an argon2id PHC
//! string or one of Mosquitto's (`$6$`, `$7$`: a `mosquitto_passwd` file
//! is taken as it is, see [`mosquitto`]); blank lines and lines starting
//! with `#` are skipped.
//!
//! - [`parse`] accepts a file only if every line is usable and no device is
//!   named twice, so an edit never leaves two passwords where one was meant,
//!   and an error names the file and the line.
//! - [`hash_password`] makes a line's hash (fresh salt, argon2's default
//!   parameters); [`set_line`] replaces or appends one device's line and
//!   keeps every other line and comment as it was.
//! - [`verify_in`] checks a password against a hash in memory the caller
//!   keeps, so repeated checks do not allocate argon2's blocks each time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, SaltString};
use argon2::Argon2;

use crate::ids::DeviceId;

pub mod mosquitto;

/// A password file line that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: line {line}: {reason}")]
    Line {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// Device → its PHC string, as read from a password file.
pub type Table = HashMap<DeviceId, String>;

/// Parses a password file: `device:hash` per line; blank lines and lines
/// starting with `#` are skipped. A device named twice is an error, so an
/// edit never leaves two passwords where one was meant.
pub fn parse(path: &Path, text: &str) -> Result<Table, FileError> {
    let mut table = Table::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |reason: String| FileError::Line {
            path: path.to_owned(),
            line: i + 1,
            reason,
        };
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((device, hash)) = line.split_once(':') else {
            return Err(bad("expected device:hash".into()));
        };
        let device = DeviceId::new(device).map_err(|e| bad(format!("device id: {e}")))?;
        if mosquitto::is_mosquitto(hash) {
            mosquitto::parse(hash).map_err(bad)?;
            if table.insert(device.clone(), hash.to_owned()).is_some() {
                return Err(bad(format!("device {device} is named twice")));
            }
            continue;
        }
        let parsed = PasswordHash::new(hash).map_err(|e| {
            bad(format!(
                "neither an argon2id PHC string ({e}) nor a Mosquitto $6$/$7$ hash; make it \
                 with `ferry passwd`"
            ))
        })?;
        if parsed.algorithm.as_str() != "argon2id" {
            return Err(bad(format!(
                "hash algorithm {} is not argon2id; make it with `ferry passwd`",
                parsed.algorithm
            )));
        }
        if table.insert(device.clone(), hash.to_owned()).is_some() {
            return Err(bad(format!("device {device} is named twice")));
        }
    }
    Ok(table)
}

/// Reads and parses a password file.
pub fn load(path: &Path) -> Result<Table, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &text)
}

/// An argon2id PHC string for `password`, with a fresh random salt and the
/// argon2 crate's default (OWASP) parameters.
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut OsRng);
    Ok(Argon2::default()
        .hash_password(password.as_bytes(), &salt)?
        .to_string())
}

/// `text` with `device`'s line set to `hash`: replaced where it was (other
/// lines and comments kept as they are), appended otherwise.
pub fn set_line(text: &str, device: &DeviceId, hash: &str) -> String {
    let new_line = format!("{device}:{hash}");
    let mut out = String::with_capacity(text.len() + new_line.len() + 1);
    let mut replaced = false;
    for line in text.lines() {
        let is_device = line
            .trim()
            .split_once(':')
            .is_some_and(|(d, _)| d == device.as_str() && !line.trim().starts_with('#'));
        if is_device {
            if !replaced {
                out.push_str(&new_line);
                out.push('\n');
                replaced = true;
            }
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !replaced {
        out.push_str(&new_line);
        out.push('\n');
    }
    out
}

/// How many of the table's hashes are Mosquitto's `$6$` (one SHA-512
/// round: cheap to attack if the file is stolen).
pub fn weak(table: &Table) -> usize {
    table.values().filter(|h| h.starts_with("$6$")).count()
}

/// Whether `password` matches the PHC string `phc`, computed in `blocks`
/// (grown to what `phc`'s parameters need, then kept): what argon2's
/// `verify_password` does, without allocating 19 MiB per check. A
/// Mosquitto hash is checked as Mosquitto does ([`mosquitto::verify`]).
pub fn verify_in(blocks: &mut Vec<argon2::Block>, password: &[u8], phc: &str) -> bool {
    if mosquitto::is_mosquitto(phc) {
        return mosquitto::parse(phc).is_ok_and(|h| mosquitto::verify(&h, password));
    }
    let Ok(hash) = PasswordHash::new(phc) else {
        return false;
    };
    let (Some(salt), Some(expected)) = (hash.salt, hash.hash) else {
        return false;
    };
    let (Ok(algorithm), Ok(params)) = (
        argon2::Algorithm::try_from(hash.algorithm),
        argon2::Params::try_from(&hash),
    ) else {
        return false;
    };
    let Ok(version) = hash.version.map(argon2::Version::try_from).transpose() else {
        return false;
    };
    let mut salt_bytes = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_bytes) else {
        return false;
    };
    let need = params.block_count();
    if blocks.len() < need {
        blocks.resize(need, argon2::Block::default());
    }
    let mut out = vec![0u8; expected.len()];
    let argon = Argon2::new(algorithm, version.unwrap_or_default(), params);
    if argon
        .hash_password_into_with_memory(password, salt, &mut out, &mut blocks[..need])
        .is_err()
    {
        return false;
    }
    // `Output`'s equality is constant-time.
    argon2::password_hash::Output::new(&out).is_ok_and(|computed| computed == expected)
}

#[cfg(test)]
mod tests;
