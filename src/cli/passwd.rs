//! `ferry passwd FILE DEVICE`: sets one device's line in a password file
//! (its format: [`ferry::config::passwords`]), the password read from the
//! terminal twice without echo, or once from stdin.
//!
//! Always holds:
//! - a file that does not parse is refused, not rewritten (the gateway
//!   could not read it anyway);
//! - runs on one file take turns, so every run that says "set" set its
//!   line and kept every other run's: the password is read and hashed
//!   first (a prompt, and argon2's tens of milliseconds to seconds, held
//!   by nobody), then, under the file's lock ([`lock`]), the file is read
//!   afresh, its line set, and the whole replaced ([`replace`]: a
//!   temporary file of this run's own, fsynced, renamed over the old one,
//!   the directory fsynced); "set" is said only after all of that;
//! - a gateway reading the file on SIGHUP takes no lock: the rename is
//!   atomic, so it sees the old file or the new one, never half of one;
//! - the file keeps its owner and mode; a new file is made 0640 with the
//!   group `ferry` when that group exists (the service's: the package's
//!   postinst or `useradd --system ferry` makes it), so the gateway can
//!   read it; when the group cannot be given (not root, not a member), one
//!   line says so.

mod lock;
mod replace;

use std::io::{BufRead, IsTerminal};
use std::path::Path;

use ferry::config::passwords;
use ferry::ids::DeviceId;

use super::exit::Exit;

/// Runs `ferry passwd FILE DEVICE`: what it did, or why not, on stderr.
pub fn command(file: &Path, device: &str) -> Exit {
    match run(file, device) {
        Ok(note) => {
            eprintln!("ferry: {}: password for {device} set", file.display());
            if let Some(note) = note {
                eprintln!("ferry passwd: note: {note}");
            }
            Exit::Ok
        }
        Err((exit, e)) => {
            eprintln!("ferry passwd: {e}");
            exit
        }
    }
}

/// Sets the line, and says why a new file could not get the service's
/// group, if it could not; an error is (how to exit, one line).
fn run(file: &Path, device: &str) -> Result<Option<String>, (Exit, String)> {
    let device =
        DeviceId::new(device).map_err(|e| (Exit::Usage, format!("device id {device:?}: {e}")))?;
    // Before asking for a password: a file already known to be bad is
    // refused now. What counts is read again under the lock.
    read_checked(file)?;
    let password = read_password(&device)?;
    let hash = passwords::hash_password(&password)
        .map_err(|e| (Exit::Runtime, format!("cannot hash: {e}")))?;

    let _lock = lock::lock(file).map_err(|e| (Exit::Runtime, e.to_string()))?;
    let existing = read_checked(file)?;
    let text = passwords::set_line(&existing, &device, &hash);
    replace::replace(file, text.as_bytes()).map_err(|e| (Exit::Runtime, e.to_string()))
}

/// The file's text (empty if there is none yet), refused if the gateway
/// could not read it.
fn read_checked(file: &Path) -> Result<String, (Exit, String)> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err((Exit::Runtime, format!("{}: {e}", file.display()))),
    };
    passwords::parse(file, &text).map_err(|e| (Exit::Usage, e.to_string()))?;
    Ok(text)
}

/// The new password: asked twice on a terminal, one line from a pipe.
fn read_password(device: &DeviceId) -> Result<String, (Exit, String)> {
    let password = if std::io::stdin().is_terminal() {
        let first = rpassword::prompt_password(format!("password for {device}: "))
            .map_err(|e| (Exit::Runtime, format!("cannot read the password: {e}")))?;
        let again = rpassword::prompt_password("again: ")
            .map_err(|e| (Exit::Runtime, format!("cannot read the password: {e}")))?;
        if first != again {
            return Err((Exit::Usage, "the passwords differ; nothing changed".into()));
        }
        first
    } else {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map_err(|e| {
            (
                Exit::Runtime,
                format!("cannot read the password from stdin: {e}"),
            )
        })?;
        line.trim_end_matches(['\n', '\r']).to_string()
    };
    if password.is_empty() {
        return Err((Exit::Usage, "empty password; nothing changed".into()));
    }
    Ok(password)
}
