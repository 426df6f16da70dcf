//! The files the writer has open, watched: the database, its WAL and its
//! shared-memory index must stay the files their names give.
//!
//! A data directory deleted, or a database file moved away or replaced,
//! under a running gateway leaves SQLite writing to files no name
//! reaches: every commit still succeeds, and a restart finds none of it.
//! So what must always hold:
//! - After every commit, before any request of the batch is answered, the
//!   writer checks that `ferry.db`, `ferry.db-wal` and `ferry.db-shm` name
//!   the inodes recorded when the store was opened (three `stat`s beside
//!   an fsync). SQLite itself never replaces them while the writer's
//!   connection is open: a checkpoint, `wal_checkpoint(TRUNCATE)` and
//!   `journal_size_limit` truncate the WAL in place, and another
//!   process's connection deletes it only when it can lock the database
//!   exclusively, which the writer's shared lock prevents.
//! - A watcher thread checks the same every [`CHECK_EVERY`] and wakes the
//!   writer when a name has gone, so an idle gateway notices too.
//! - On a mismatch the batch is not answered: the store stops as a
//!   damaged one does (every request is answered with the cause, the
//!   gateway exits), after saving what the still-open connection holds
//!   ([`rescue`]): a checkpoint into `ferry.db` when only the WAL or the
//!   index went; a backup to `ferry.db` when nothing is at that name any
//!   more (the data directory is made again if it went), so a restart
//!   resumes from it; a backup to `ferry.db.rescued-<ms>` beside a file
//!   that replaced it, for the operator to put back. After a backup the
//!   writer's own WAL and index are removed, and a file that took their
//!   names beside the writer's database (or its restored backup) is moved
//!   aside (`.foreign-<ms>`): no database is ever read with another's WAL.
//! - What only the WAL held is lost if the process dies between the WAL's
//!   deletion and the check (under a second when idle, the next commit
//!   under load): nothing answered after the deletion, but some answered
//!   before it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::Connection;
use tokio::sync::mpsc::WeakUnboundedSender;
use tracing::error;

use super::lock::FileId;
use super::op::{Cx, Op, Told};
use crate::health::Heartbeat;

/// How often the watcher thread checks the names.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// One of the store's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    Db,
    Wal,
    Shm,
}

/// What became of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum How {
    /// Nothing is there (or the directory went).
    Deleted,
    /// Another file is.
    Replaced,
}

/// A file whose name no longer gives the file the writer has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Gone {
    pub which: Which,
    pub how: How,
}

/// The store's files and the inodes their names gave at open.
#[derive(Debug)]
pub(super) struct Files {
    /// `ferry.db` as configured (a symlink is followed by `stat`).
    db: PathBuf,
    /// The WAL and the index, beside the file SQLite resolved the
    /// database's name to.
    wal: PathBuf,
    shm: PathBuf,
    /// As recorded at open: the database's from its lock, the others'
    /// from their names (`None`: not there, not checked).
    ids: [Option<FileId>; 3],
}

impl Files {
    /// Records the names' inodes now: after the connection is open and
    /// SQLite has opened its WAL and index. `locked` is the inode the
    /// store's lock holds; a name giving another one already is [`Gone`].
    pub(super) fn record(db: &Path, locked: FileId) -> Result<Files, Gone> {
        let real = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_path_buf());
        let beside = |suffix: &str| {
            let mut name = real.clone().into_os_string();
            name.push(suffix);
            PathBuf::from(name)
        };
        let (wal, shm) = (beside("-wal"), beside("-shm"));
        let files = Files {
            ids: [Some(locked), FileId::at(&wal), FileId::at(&shm)],
            db: db.to_path_buf(),
            wal,
            shm,
        };
        files.check()?;
        Ok(files)
    }

    pub(super) fn path(&self, which: Which) -> &Path {
        match which {
            Which::Db => &self.db,
            Which::Wal => &self.wal,
            Which::Shm => &self.shm,
        }
    }

    fn recorded(&self, which: Which) -> Option<FileId> {
        self.ids[which as usize]
    }

    /// Whether every name still gives the inode recorded (the database
    /// first: when it went, the rest usually went with it).
    pub(super) fn check(&self) -> Result<(), Gone> {
        for which in [Which::Db, Which::Wal, Which::Shm] {
            let Some(recorded) = self.recorded(which) else {
                continue;
            };
            let how = match FileId::at(self.path(which)) {
                Some(now) if now == recorded => continue,
                Some(_) => How::Replaced,
                None => How::Deleted,
            };
            return Err(Gone { which, how });
        }
        Ok(())
    }

    /// Whether `which`'s name still gives the file the writer has open.
    fn ours(&self, which: Which) -> bool {
        self.recorded(which).is_some() && FileId::at(self.path(which)) == self.recorded(which)
    }
}

/// The watcher: every [`CHECK_EVERY`], the names; when one has gone, one
/// empty request wakes the writer (whose check after its commit stops the
/// store) and the watcher ends. It also ends once the writer's queue has
/// no sender left (the store closed).
pub(super) fn watch(files: Arc<Files>, writer: WeakUnboundedSender<Op>) {
    loop {
        std::thread::sleep(CHECK_EVERY);
        let Some(tx) = writer.upgrade() else { return };
        if files.check().is_err() {
            let _ = tx.send(Box::new(Told(|_: &mut Cx<'_>| Ok(()))));
            return;
        }
    }
}

/// Where what the connection held went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Rescue {
    /// All of it is in the database file at its own name (checkpointed).
    InPlace,
    /// A backup at the database's own name: a restart resumes from it.
    Restored(PathBuf),
    /// A backup beside a file that took the database's name.
    Beside(PathBuf),
    /// Not saved, for this reason.
    Failed(String),
}

/// Saves what the writer's connection holds after `gone` (see the module
/// docs), logs the ERROR, and returns the cause every request is then
/// answered with.
/// The writer's heartbeat is bumped as the copy goes, so a watchdog sees
/// it alive while it saves a large store.
pub(super) fn stop(conn: &Connection, files: &Files, gone: Gone, beat: &Heartbeat) -> String {
    let rescue = rescue(conn, files, gone, beat);
    let what = match (gone.which, gone.how) {
        (which, How::Deleted) => format!("{} was deleted", files.path(which).display()),
        (which, How::Replaced) => format!(
            "{} was replaced by another file",
            files.path(which).display()
        ),
    };
    let (saved, todo) = match &rescue {
        Rescue::InPlace => (
            format!("everything committed is in {}", files.db.display()),
            "find what deleted or replaced it, then restart ferry: it resumes from there".into(),
        ),
        Rescue::Restored(at) => (
            format!("everything committed was saved to {}", at.display()),
            "find what deleted it, then restart ferry: it resumes from there".into(),
        ),
        Rescue::Beside(at) => (
            format!("everything committed was saved to {}", at.display()),
            format!(
                "with ferry stopped, move the file now at {} away and {} to {}, then start ferry",
                files.db.display(),
                at.display(),
                files.db.display()
            ),
        ),
        Rescue::Failed(why) => (
            format!("it could not be saved ({why})"),
            "what was answered `stored` since the last checkpoint may be lost; check the disk and the data directory".into(),
        ),
    };
    let rescued = match &rescue {
        Rescue::InPlace => files.db.display().to_string(),
        Rescue::Restored(at) | Rescue::Beside(at) => at.display().to_string(),
        Rescue::Failed(_) => String::new(),
    };
    error!(
        event = "store_file_gone",
        file = %files.path(gone.which).display(),
        how = ?gone.how,
        rescued_to = %rescued,
        "store stopped: {what} while the gateway ran; nothing more is answered `stored`; {saved}; {todo}"
    );
    format!("{what} while the gateway ran; {saved}; {todo}")
}

fn rescue(conn: &Connection, files: &Files, gone: Gone, beat: &Heartbeat) -> Rescue {
    if gone.which != Which::Db && files.ours(Which::Db) {
        // The database file is still ours: the WAL's frames go into it,
        // and a file that took the WAL's or the index's name goes aside.
        if checkpointed(conn) {
            for which in [Which::Wal, Which::Shm] {
                if !files.ours(which) {
                    move_aside(files.path(which));
                }
            }
            return Rescue::InPlace;
        }
    }
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut name = files.db.clone().into_os_string();
    name.push(format!(".rescued-{stamp}"));
    let saved = PathBuf::from(name);
    if let Err(why) = backup(conn, &saved, beat) {
        return Rescue::Failed(why);
    }
    // Everything is in the backup: the old WAL and index must never be
    // read with another database file at that name. Files that are not
    // ours are left to the file that replaced the database (they may be
    // its own), unless the backup takes its place.
    let restoring = FileId::at(&files.db).is_none();
    for which in [Which::Wal, Which::Shm] {
        if files.ours(which) {
            let _ = std::fs::remove_file(files.path(which));
        } else if restoring {
            move_aside(files.path(which));
        }
    }
    if restoring && std::fs::rename(&saved, &files.db).is_ok() {
        sync_dir(&files.db);
        return Rescue::Restored(files.db.clone());
    }
    Rescue::Beside(saved)
}

/// `wal_checkpoint(TRUNCATE)`: whether every frame reached the database
/// file (and it was synced).
fn checkpointed(conn: &Connection) -> bool {
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    })
    .is_ok_and(|busy| busy == 0)
}

/// Moves a file that took one of the store's names aside
/// (`NAME.foreign-<ms>`), so no database is ever read with it.
fn move_aside(path: &Path) {
    if FileId::at(path).is_none() {
        return;
    }
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".foreign-{stamp}"));
    let _ = std::fs::rename(path, aside);
}

/// Copies the connection's database to a new file at `to` (its directory
/// made again if it went), synced: SQLite's online backup, a few MiB a
/// step, bumping `beat` at each.
fn backup(conn: &Connection, to: &Path, beat: &Heartbeat) -> Result<(), String> {
    use rusqlite::backup::{Backup, StepResult};
    if let Some(dir) = to.parent() {
        make_dir(dir)?;
    }
    if to.exists() {
        return Err(format!("{} exists", to.display()));
    }
    let failed = |e: rusqlite::Error| format!("backup to {}: {e}", to.display());
    let mut copy = Connection::open(to).map_err(failed)?;
    {
        let backup = Backup::new(conn, &mut copy).map_err(failed)?;
        loop {
            beat.bump();
            match backup.step(1024).map_err(failed)? {
                StepResult::Done => break,
                StepResult::More => {}
                // Only this thread writes the source; the copy is new.
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
    copy.close().map_err(|(_, e)| failed(e))?;
    sync_dir(to);
    Ok(())
}

/// Makes `dir` (and its parents) again. While an `rm -rf` of it is still
/// under way, `mkdir` can find it there and `is_dir` find it gone a moment
/// later ("File exists"): tried again, a few times, until it stands.
fn make_dir(dir: &Path) -> Result<(), String> {
    let mut tries = 0;
    loop {
        match std::fs::create_dir_all(dir) {
            Ok(()) if dir.is_dir() => return Ok(()),
            Ok(()) => {}
            Err(e) if tries >= 20 => return Err(format!("{}: {e}", dir.display())),
            Err(_) => {}
        }
        if tries >= 20 {
            return Err(format!("{}: not a directory", dir.display()));
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// fsync of the directory holding `path`, so its new name lasts.
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent() {
        if let Ok(dir) = std::fs::File::open(dir) {
            let _ = dir.sync_all();
        }
    }
}
