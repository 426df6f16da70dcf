//! `ferry passwd FILE DEVICE`: sets one device's line in a password file
//! (its format: [`ferry::config::passwords`]), the password read from the
//! terminal twice without echo, or once from stdin.
//!
//! Always holds: a file that does not parse is refused, not rewritten (the
//! gateway could not read it anyway); the new file is written whole beside
//! the old one and renamed over it, keeping its owner and mode, so a
//! gateway reading it on SIGHUP sees the old file or the new one, never
//! half of one. A new file is made 0640 with the group `ferry` when that
//! group exists (the service's: the package's postinst or `useradd
//! --system ferry` makes it), so the gateway can read it; when the group
//! cannot be given (not root, not a member), one line says so.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use ferry::config::passwords;
use ferry::ids::DeviceId;

use super::exit::Exit;

/// The group the systemd unit runs ferry as (`Group=ferry`).
const SERVICE_GROUP: &str = "ferry";

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
    let mut note = None;
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?;
        match std::fs::metadata(file) {
            // Keep the file's owner and mode (e.g. root:ferry 0640), so the
            // gateway can still read it after root edits it.
            Ok(meta) => {
                use std::os::unix::fs::MetadataExt;
                std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid())).map_err(io)?;
                f.set_permissions(meta.permissions()).map_err(io)?;
            }
            // A new file: readable by the service's group, when there is one.
            Err(_) => {
                if let Some(gid) = group_id(SERVICE_GROUP) {
                    if let Err(e) = std::os::unix::fs::fchown(&f, None, Some(gid)) {
                        note = Some(format!(
                            "{} is not in group {SERVICE_GROUP} ({e}): the service cannot read it \
                             until `sudo chgrp {SERVICE_GROUP} {}`",
                            file.display(),
                            file.display()
                        ));
                    }
                }
                f.set_permissions(std::fs::Permissions::from_mode(0o640))
                    .map_err(io)?;
            }
        }
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, file).map_err(|e| (Exit::Runtime, format!("{}: {e}", file.display())))?;
    Ok(note)
}

/// The id of the group called `name` (from /etc/group or whatever NSS
/// reads), or None when there is no such group or it cannot be looked up.
fn group_id(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // A group with many members needs a larger buffer (ERANGE): a few tries.
    for size in [16 << 10, 256 << 10, 4 << 20] {
        let mut buf = vec![0 as libc::c_char; size];
        // SAFETY: a zeroed `group` is a valid out-parameter; getgrnam_r
        // fills it with pointers into `buf`, which outlives every use.
        let mut group: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call, `buf.len()` is its size.
        let rc = unsafe {
            libc::getgrnam_r(
                name.as_ptr(),
                &mut group,
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            )
        };
        match rc {
            0 if !found.is_null() => return Some(group.gr_gid),
            libc::ERANGE => continue,
            _ => return None,
        }
    }
    None
}
