//! One gateway per store, held by the store itself: an exclusive `flock`
//! on a descriptor of the database file, taken before SQLite opens it and
//! kept until after SQLite has closed it.
//!
//! What must always hold:
//! - The lock is on the database file's inode, not on a name: deleting,
//!   renaming or replacing `ferry.pid`, or any other file beside it, does
//!   not free it. A second process cannot take it while the first lives;
//!   the kernel lets it go when the process ends, however it ends.
//! - `flock` locks and SQLite's POSIX (`fcntl`) locks are independent on
//!   Linux: the CLI's connections (read-only, or briefly read-write for a
//!   replay) work while the gateway holds this lock.
//! - Closing any descriptor of the database file drops every POSIX lock
//!   this process holds on it, SQLite's included (then another process
//!   closing its connection could think itself the last one and delete
//!   the WAL under the writer). So this process opens the file outside
//!   SQLite once, here, and closes that descriptor only after the writer's
//!   connection is closed; [`holder`] finds the holder in `/proc/locks`
//!   and never opens the file.
//! - A lock refused because another process holds it stops the start,
//!   naming that process's pid when `/proc/locks` shows it. A lock the
//!   file system cannot give (no lock support: `ENOLCK`, `EOPNOTSUPP`, ...)
//!   stops it too: without it nothing keeps a second gateway off the store.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::error::StoreError;

/// A file's identity: the device and inode it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    pub(super) fn of(meta: &std::fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }

    /// What `path` names now; `None` if nothing (or it cannot be seen).
    pub(super) fn at(path: &Path) -> Option<FileId> {
        std::fs::metadata(path).ok().map(|m| FileId::of(&m))
    }
}

/// The held lock: its descriptor of the database file. Dropping it lets
/// go of the lock; drop it only after the connection is closed.
#[derive(Debug)]
pub(super) struct Hold {
    _file: File,
    /// The inode locked, as opened.
    pub id: FileId,
}

/// Opens (creating if needed: an empty file is an empty database) the
/// database file at `db` and takes the lock.
pub(super) fn take(db: &Path) -> Result<Hold, StoreError> {
    let dir = db.parent().unwrap_or(Path::new(".")).to_path_buf();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(db)
        .map_err(|source| StoreError::Open {
            path: db.to_path_buf(),
            source,
        })?;
    let id = FileId::of(&file.metadata().map_err(|source| StoreError::Open {
        path: db.to_path_buf(),
        source,
    })?);
    loop {
        // SAFETY: flock(2) on a descriptor `file` owns and keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Hold { _file: file, id });
        }
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => StoreError::InUse {
                dir,
                holder: match holder_of(id) {
                    Holder::Pid(pid) => format!("pid {pid}"),
                    _ => "its pid is not known here: /proc/locks does not show it".into(),
                },
            },
            _ => StoreError::Unlockable { dir, source: e },
        });
    }
}

/// Who holds a store's lock, as far as `/proc/locks` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// No process: no gateway runs on this store (or there is none).
    Nobody,
    Pid(u32),
    /// A process this one cannot name (another pid namespace), or
    /// `/proc/locks` cannot be read.
    Unknown,
}

/// Who holds the lock of the database file `db`. Reads `/proc/locks`
/// only: it never opens the file (see the module docs), so it is safe in
/// the gateway's own process.
pub fn holder(db: &Path) -> Holder {
    match FileId::at(db) {
        Some(id) => holder_of(id),
        None => Holder::Nobody,
    }
}

/// How many times `/proc/locks` is read before "nobody holds it" is
/// believed.
const LOCKS_READS: usize = 4;

/// `/proc/locks` is no snapshot: the kernel hands it out a page at a
/// time, and a line can slip past between two pages when other locks come
/// and go (SQLite's, in this process and others). A holder seen in any
/// read is the holder; nobody is believed only once every read says so.
fn holder_of(id: FileId) -> Holder {
    let mut seen = Holder::Nobody;
    for _ in 0..LOCKS_READS {
        seen = match std::fs::read_to_string("/proc/locks") {
            Ok(locks) => flock_holder(&locks, id),
            Err(_) => Holder::Unknown,
        };
        if seen != Holder::Nobody {
            return seen;
        }
    }
    seen
}

/// The process holding an exclusive `flock` on `id`, from the text of
/// `/proc/locks`: lines such as `1: FLOCK  ADVISORY  WRITE 4242 fe:00:1234 0 EOF`
/// (the device as hex major:minor, the inode in decimal; `->` marks a
/// waiter, not a holder; pid 0 is one in another pid namespace). The
/// device must match, unless no line matches it and every line on that
/// inode names one pid (a file system whose `stat` shows another device
/// than its locks do: btrfs subvolumes, overlayfs).
fn flock_holder(locks: &str, id: FileId) -> Holder {
    let (major, minor) = (libc::major(id.dev), libc::minor(id.dev));
    let mut exact = None;
    let mut by_inode = Vec::new();
    for line in locks.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, "FLOCK", _, "WRITE", pid, file, ..] = fields.as_slice() else {
            continue;
        };
        let mut parts = file.split(':');
        let (Some(maj), Some(min), Some(ino), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if ino.parse::<u64>() != Ok(id.ino) {
            continue;
        }
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let dev_matches =
            u32::from_str_radix(maj, 16) == Ok(major) && u32::from_str_radix(min, 16) == Ok(minor);
        if dev_matches {
            exact = Some(pid);
        }
        by_inode.push(pid);
    }
    let pid = match exact {
        Some(pid) => pid,
        None => match by_inode.as_slice() {
            [] => return Holder::Nobody,
            [first, rest @ ..] if rest.iter().all(|p| p == first) => *first,
            _ => return Holder::Unknown,
        },
    };
    if pid == 0 {
        Holder::Unknown
    } else {
        Holder::Pid(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(major: u32, minor: u32, ino: u64) -> FileId {
        FileId {
            dev: libc::makedev(major, minor),
            ino,
        }
    }

    #[test]
    fn the_holder_is_the_pid_of_the_write_flock_on_the_inode_and_device() {
        let locks = "\
1: POSIX  ADVISORY  READ 77 fe:00:1234 1073741826 1073742335
2: FLOCK  ADVISORY  WRITE 4242 fe:00:1234 0 EOF
2: -> FLOCK  ADVISORY  WRITE 5151 fe:00:1234 0 EOF
3: FLOCK  ADVISORY  WRITE 9999 fe:01:1234 0 EOF
4: FLOCK  ADVISORY  WRITE 8888 fe:00:12345 0 EOF
";
        assert_eq!(flock_holder(locks, id(0xfe, 0, 1234)), Holder::Pid(4242));
        assert_eq!(flock_holder(locks, id(0xfe, 1, 1234)), Holder::Pid(9999));
        assert_eq!(flock_holder(locks, id(0xfe, 0, 99)), Holder::Nobody);
        // A POSIX lock (SQLite's) or a waiter is no holder.
        assert_eq!(
            flock_holder(
                "1: POSIX  ADVISORY  WRITE 77 fe:00:5 0 EOF\n1: -> FLOCK  ADVISORY  WRITE 5 fe:00:5 0 EOF\n",
                id(0xfe, 0, 5)
            ),
            Holder::Nobody
        );
    }

    #[test]
    fn a_device_seen_otherwise_by_stat_still_finds_a_single_holder_of_the_inode() {
        let one = "1: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF\n";
        assert_eq!(flock_holder(one, id(0, 0x31, 1234)), Holder::Pid(4242));
        let two = "1: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF\n2: FLOCK  ADVISORY  WRITE 17 00:2e:1234 0 EOF\n";
        assert_eq!(flock_holder(two, id(0, 0x31, 1234)), Holder::Unknown);
        let other_namespace = "1: FLOCK  ADVISORY  WRITE 0 fe:00:1234 0 EOF\n";
        assert_eq!(
            flock_holder(other_namespace, id(0xfe, 0, 1234)),
            Holder::Unknown
        );
    }

    #[test]
    fn a_second_hold_on_one_database_is_refused_naming_the_first_and_free_once_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ferry.db");
        assert_eq!(holder(&db), Holder::Nobody, "no database yet");
        let first = take(&db).expect("the first hold");
        assert_eq!(holder(&db), Holder::Pid(std::process::id()));
        // flock belongs to an open file description: a second open in the
        // same process is refused as another process would be.
        let err = take(&db).expect_err("a second hold");
        let line = err.to_string();
        assert!(
            matches!(err, StoreError::InUse { .. })
                && line.contains(&format!("pid {}", std::process::id()))
                && line.contains("in use by another running gateway"),
            "{line}"
        );
        drop(first);
        assert_eq!(holder(&db), Holder::Nobody);
        let _again = take(&db).expect("free again");
    }

    #[test]
    fn the_hold_survives_its_file_being_renamed_and_a_new_file_at_the_name_is_another_store() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ferry.db");
        let _first = take(&db).expect("the first hold");
        // The lock is on the inode: the old file keeps it wherever it goes.
        let moved = dir.path().join("elsewhere.db");
        std::fs::rename(&db, &moved).unwrap();
        assert!(matches!(take(&moved), Err(StoreError::InUse { .. })));
        assert_eq!(holder(&db), Holder::Nobody, "nothing at the name");
    }
}
