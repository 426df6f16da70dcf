//! `ferry passwd FILE DEVICE`: sets one device's line in a password file
//! (its format: [`ferry::config::passwords`]), the password read from the
//! terminal twice without echo, or once from stdin.
//!
//! Always holds: a file that does not parse is refused, not rewritten (the
//! gateway could not read it anyway); the new file is written whole beside
//! the old one and renamed over it, keeping its owner and mode, so a
//! gateway reading it on SIGHUP sees the old file or the new one, never
//! half of one.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use ferry::config::passwords;
use ferry::ids::DeviceId;

use super::exit::Exit;

/// Runs `ferry passwd FILE DEVICE`: what it did, or why not, on stderr.
pub fn command(file: &Path, device: &str) -> Exit {
    match run(file, device) {
        Ok(()) => {
            eprintln!("ferry: {}: password for {device} set", file.display());
            Exit::Ok
        }
        Err((exit, e)) => {
            eprintln!("ferry passwd: {e}");
            exit
        }
    }
}

/// Sets the line; an error is (how to exit, one line).
fn run(file: &Path, device: &str) -> Result<(), (Exit, String)> {
    let device =
        DeviceId::new(device).map_err(|e| (Exit::Usage, format!("device id {device:?}: {e}")))?;
    let existing = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err((Exit::Runtime, format!("{}: {e}", file.display()))),
    };
    // Refuse to rewrite a file the gateway could not read anyway.
    passwords::parse(file, &existing).map_err(|e| (Exit::Usage, e.to_string()))?;

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
    let hash = passwords::hash_password(&password)
        .map_err(|e| (Exit::Runtime, format!("cannot hash: {e}")))?;
    let text = passwords::set_line(&existing, &device, &hash);

    // Written whole and renamed over the old file, so the gateway reading
    // it on SIGHUP sees the old file or the new one, never half of one.
    let tmp = file.with_extension("tmp");
    let io = |e: std::io::Error| (Exit::Runtime, format!("{}: {e}", tmp.display()));
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        // Keep the file's owner and mode (e.g. root:ferry 0640), so the
        // gateway can still read it after root edits it.
        if let Ok(meta) = std::fs::metadata(file) {
            use std::os::unix::fs::MetadataExt;
            std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid())).map_err(io)?;
            f.set_permissions(meta.permissions()).map_err(io)?;
        }
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, file).map_err(|e| (Exit::Runtime, format!("{}: {e}", file.display())))?;
    Ok(())
}
