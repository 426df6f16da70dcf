//! The lock that makes `ferry passwd` runs on one password file take turns:
//! an exclusive `flock` on `<file>.lock`, a sidecar file beside it.
//!
//! Why a sidecar and not the password file itself: the file is replaced by
//! a rename, so each run would lock the inode it opened, and the next run
//! opens the new one; two runs would hold "the" lock at once. Why not the
//! directory: it would make unrelated files there (all of /etc/ferry) take
//! turns, and another tool may lock the same directory for its own ends.
//! The sidecar names the file it guards, so an error naming it says what
//! waits on what.
//!
//! Always holds:
//! - the lock file is never renamed, truncated or deleted by ferry, so every
//!   run locks the same inode (deleting it by hand while a run holds it
//!   would let the next run lock a new inode beside the held one: delete it
//!   only when no `ferry passwd` runs; it is empty and harmless to keep);
//! - the kernel lets go of the lock when the holder ends, however it ends
//!   (SIGKILL included), so a dead run never blocks the next one;
//! - the lock is held for file I/O only (read, write, fsync, rename): the
//!   caller asks for the password and hashes it before taking it, so a run
//!   waits behind others' milliseconds, not their prompts or their argon2;
//! - a run waits at most [`WAIT`], then gives up having changed nothing,
//!   with a line naming the lock file and, where the kernel says, its
//!   holder's pid.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a run waits for the lock. Each holder keeps it for a read, a
/// write and two fsyncs (milliseconds; tens on a slow SD card), so even a
/// run queued behind a hundred others gets it well within this; a holder
/// past it is stuck (or is not a `ferry passwd`), and the operator is told.
pub const WAIT: Duration = Duration::from_secs(10);

/// How often a waiting run tries again.
const RETRY: Duration = Duration::from_millis(5);

/// The lock, held until dropped (or the process ends).
#[derive(Debug)]
pub struct PasswdLock {
    _file: File,
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot open the lock file {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot lock {}: {source}", path.display())]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "waited {}s for {}, still held by {holder} (another `ferry passwd` on \
         this file, or whatever that is); nothing changed: try again",
        WAIT.as_secs(),
        path.display()
    )]
    Busy { path: PathBuf, holder: String },
}

/// The lock file guarding `file`: its name with `.lock` added.
pub fn lock_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Takes the lock on `file`, waiting up to [`WAIT`].
pub fn lock(file: &Path) -> Result<PasswdLock, LockError> {
    let path = lock_path(file);
    let lock_file = open(&path).map_err(|source| LockError::Open {
        path: path.clone(),
        source,
    })?;
    let deadline = Instant::now() + WAIT;
    loop {
        match try_lock(&lock_file) {
            Ok(true) => return Ok(PasswdLock { _file: lock_file }),
            Ok(false) if Instant::now() < deadline => std::thread::sleep(RETRY),
            Ok(false) => {
                let holder = match holder(&lock_file) {
                    Some(pid) => format!("pid {pid}"),
                    None => "another process".to_string(),
                };
                return Err(LockError::Busy { path, holder });
            }
            Err(source) => return Err(LockError::Lock { path, source }),
        }
    }
}

/// Opens the lock file, making it (empty, 0600) if it is not there. A
/// symlink is refused: in a directory others can write, one could point
/// the lock anywhere.
fn open(path: &Path) -> std::io::Result<File> {
    let existing = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    match existing {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path),
        other => other,
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: whether it was granted.
fn try_lock(file: &File) -> std::io::Result<bool> {
    loop {
        // SAFETY: flock(2) on a descriptor `file` owns and keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

/// The pid holding a lock on `file`'s inode, as /proc/locks lists it;
/// `None` where that cannot be known (no /proc, a file system whose
/// inode numbers differ from stat's).
fn holder(file: &File) -> Option<u32> {
    let meta = file.metadata().ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    holder_in(&locks, major.into(), minor.into(), meta.ino())
}

/// The pid in the first granted lock of `locks` (/proc/locks' text) on
/// the inode `major:minor:ino`. A line with `->` is a waiter, not a holder.
fn holder_in(locks: &str, major: u64, minor: u64, ino: u64) -> Option<u32> {
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) == Some(&"->") {
            return None;
        }
        // `… <pid> <major>:<minor>:<inode> <start> <end>`, majors and
        // minors in hex.
        let at = fields.iter().position(|f| f.matches(':').count() == 2)?;
        let mut id = fields[at].split(':');
        let same = id.next().and_then(|m| u64::from_str_radix(m, 16).ok()) == Some(major)
            && id.next().and_then(|m| u64::from_str_radix(m, 16).ok()) == Some(minor)
            && id.next().and_then(|i| i.parse().ok()) == Some(ino);
        if !same {
            return None;
        }
        fields.get(at.checked_sub(1)?)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKS: &str = "\
1: POSIX  ADVISORY  WRITE 700 fd:01:1234 0 EOF
2: FLOCK  ADVISORY  WRITE 4321 103:02:98765 0 EOF
2: -> FLOCK  ADVISORY  WRITE 999 103:02:98765 0 EOF
3: OFDLCK ADVISORY  READ  -1 00:05:4 0 EOF
";

    #[test]
    fn the_holder_is_the_granted_lock_on_the_same_device_and_inode() {
        assert_eq!(holder_in(LOCKS, 0x103, 2, 98765), Some(4321));
        assert_eq!(holder_in(LOCKS, 0xfd, 1, 1234), Some(700));
    }

    #[test]
    fn a_waiter_another_inode_or_an_unknown_pid_is_no_holder() {
        let waiting_only = "2: -> FLOCK  ADVISORY  WRITE 999 103:02:98765 0 EOF\n";
        assert_eq!(holder_in(waiting_only, 0x103, 2, 98765), None);
        assert_eq!(holder_in(LOCKS, 0x103, 3, 98765), None);
        assert_eq!(holder_in(LOCKS, 0, 5, 4), None);
        assert_eq!(holder_in("garbage\n\n", 0, 5, 4), None);
    }

    #[test]
    fn the_lock_file_is_the_file_name_with_lock_added() {
        assert_eq!(
            lock_path(Path::new("/etc/ferry/ferry.passwd")),
            Path::new("/etc/ferry/ferry.passwd.lock")
        );
        assert_eq!(lock_path(Path::new("passwd")), Path::new("passwd.lock"));
    }
}
