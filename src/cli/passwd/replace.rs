//! A password file replaced whole: the new text is written to a temporary
//! file of this run's own beside it, synced, renamed over the old one, and
//! the directory synced.
//!
//! Always holds:
//! - a reader (the gateway on SIGHUP) sees the old file or the new one,
//!   never half of one: rename is atomic, so readers take no lock;
//! - when [`replace`] returns `Ok`, the new file is on disk, data and name
//!   (both fsyncs done), so a power cut after "set" does not bring the old
//!   line back;
//! - the temporary name is this run's alone (`<file>.<pid>.<random>.tmp`,
//!   made with `O_EXCL`), so no other run writes into it or renames it away;
//!   on an error it is removed;
//! - the file keeps its owner and mode; a new one is 0640 with the
//!   service's group when there is one.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The group the systemd unit runs ferry as (`Group=ferry`).
const SERVICE_GROUP: &str = "ferry";

/// Why the file was not replaced, or not for sure: one line naming the path.
#[derive(Debug, thiserror::Error)]
pub enum ReplaceError {
    #[error("{}: {source}; nothing changed", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{}: the new file is in place, but syncing its directory failed ({source}): \
         a power cut may bring the old one back; run it again",
        path.display()
    )]
    SyncDir {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Replaces `file` with `text`; says why a new file could not get the
/// service's group, if it could not.
pub fn replace(file: &Path, text: &[u8]) -> Result<Option<String>, ReplaceError> {
    let tmp = Temp::create(file)?;
    let at = |source| ReplaceError::Write {
        path: tmp.path.clone(),
        source,
    };
    let note = owner_and_mode(file, &tmp.file).map_err(at)?;
    (&tmp.file).write_all(text).map_err(at)?;
    tmp.file.sync_all().map_err(at)?;
    tmp.rename_over(file)?;
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| ReplaceError::SyncDir {
            path: file.to_path_buf(),
            source,
        })?;
    Ok(note)
}

/// Gives `tmp` the owner and mode of `file`, or a new file's; the note
/// when the service's group could not be given.
fn owner_and_mode(file: &Path, tmp: &File) -> std::io::Result<Option<String>> {
    match std::fs::metadata(file) {
        // Keep the file's owner and mode (e.g. root:ferry 0640), so the
        // gateway can still read it after root edits it.
        Ok(meta) => {
            std::os::unix::fs::fchown(tmp, Some(meta.uid()), Some(meta.gid()))?;
            tmp.set_permissions(meta.permissions())?;
            Ok(None)
        }
        // A new file: readable by the service's group, when there is one.
        Err(_) => {
            let mut note = None;
            if let Some(gid) = group_id(SERVICE_GROUP) {
                if let Err(e) = std::os::unix::fs::fchown(tmp, None, Some(gid)) {
                    note = Some(format!(
                        "{} is not in group {SERVICE_GROUP} ({e}): the service cannot read it \
                         until `sudo chgrp {SERVICE_GROUP} {}`",
                        file.display(),
                        file.display()
                    ));
                }
            }
            tmp.set_permissions(std::fs::Permissions::from_mode(0o640))?;
            Ok(note)
        }
    }
}

/// This run's temporary file; removed when dropped unless renamed.
struct Temp {
    path: PathBuf,
    file: File,
    renamed: bool,
}

impl Temp {
    /// `<file>.<pid>.<random>.tmp`, new (never an existing file or link).
    fn create(file: &Path) -> Result<Temp, ReplaceError> {
        let mut name = file.as_os_str().to_owned();
        name.push(format!(
            ".{}.{:016x}.tmp",
            std::process::id(),
            rand::random::<u64>()
        ));
        let path = PathBuf::from(name);
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path);
        match opened {
            Ok(file) => Ok(Temp {
                path,
                file,
                renamed: false,
            }),
            Err(source) => Err(ReplaceError::Write { path, source }),
        }
    }

    fn rename_over(mut self, file: &Path) -> Result<(), ReplaceError> {
        std::fs::rename(&self.path, file).map_err(|source| ReplaceError::Write {
            path: file.to_path_buf(),
            source,
        })?;
        self.renamed = true;
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
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
