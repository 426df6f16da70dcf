//! The power-loss model: what the disk holds after a power cut is what was
//! fsynced, nothing after it, and maybe part of what was written after it.
//!
//! `ferry run` runs with a small shim preloaded (`powercut.c`, compiled
//! here with gcc) that keeps, beside `gateway.data_dir`, the durable image
//! of each of its files and a log of every write since that file's last
//! fsync. A cut SIGKILLs ferry at an instant the test picks, then replaces
//! the data directory with the image and, as a [`Cut`] says, some of the
//! logged writes, maybe torn; ferry then starts from what is left, as
//! after a reboot. This is the way of SQLite's own crash tests and of
//! Jepsen's LazyFS (there a FUSE file system): writes are seen one by one
//! and a sync is the only barrier. A preloaded shim needs no mount, no
//! privilege and no code in ferry, and it sees the very calls ferry's
//! bundled SQLite makes; it sees neither mmap writes (SQLite maps only its
//! `-shm` file, which it never syncs and rebuilds) nor a statically linked
//! libc (ferry links glibc dynamically).
//!
//! Names (create, unlink, rename) are taken as durable at once; a file that
//! was never fsynced has no image, so a cut leaves it absent.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use rand::Rng;

use super::config::FerryOpts;
use super::ferry::Ferry;

/// The shim's source, compiled once per test process.
const SOURCE: &str = include_str!("powercut.c");
/// A pending-log record's length field for a truncation.
const TRUNCATE: u64 = u64::MAX;
/// Torn writes stop at a sector boundary.
const SECTOR: u64 = 512;

/// The shim, compiled into a directory kept for the test process.
fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("ferry-powercut-")
            .tempdir()
            .expect("temp dir for the shim")
            .keep();
        let source = dir.join("powercut.c");
        let lib = dir.join("libpowercut.so");
        fs::write(&source, SOURCE).expect("write powercut.c");
        let out = Command::new("gcc")
            .args([
                "-shared",
                "-fPIC",
                "-O2",
                "-Wall",
                "-Wno-format-truncation",
                "-o",
            ])
            .arg(&lib)
            .arg(&source)
            .args(["-ldl", "-lpthread"])
            .output()
            .unwrap_or_else(|e| {
                panic!("gcc not found ({e}): apt-get install gcc (the power-loss shim is C)")
            });
        assert!(
            out.status.success(),
            "compiling the power-loss shim failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lib
    })
}

/// What a cut keeps of the writes after each file's last fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Nothing: the disk holds exactly what was fsynced.
    Clean,
    /// The writes of each file in order up to a random one, and that one
    /// torn at a random sector: the disk wrote in order and stopped.
    Torn,
    /// Each write kept, torn or lost at random, in any combination: the
    /// disk reordered what it had not been told to sync.
    Scrambled,
}

/// What one cut did to the files, for a failure's message.
#[derive(Debug, Default)]
pub struct CutReport {
    /// Per file: (unsynced writes, kept whole, kept torn).
    pub files: BTreeMap<String, (usize, usize, usize)>,
}

/// A data directory with the shim's image beside it.
pub struct PowerLoss {
    pub data_dir: PathBuf,
    shadow: PathBuf,
    _root: tempfile::TempDir,
}

impl PowerLoss {
    pub fn new() -> PowerLoss {
        PowerLoss::at(None)
    }

    /// The model on `data_dir` (a directory to be made, on a disk of the
    /// test's choosing: a small tmpfs that fills); its image is kept
    /// elsewhere. `None`: a data directory of its own.
    pub fn at(data_dir: Option<PathBuf>) -> PowerLoss {
        let root = tempfile::Builder::new()
            .prefix("ferry-power-")
            .tempdir()
            .expect("temp dir for the power-loss model");
        let data_dir = data_dir.unwrap_or_else(|| root.path().join("data"));
        let shadow = root.path().join("shadow");
        fs::create_dir(&data_dir).expect("data dir");
        fs::create_dir(&shadow).expect("shadow dir");
        PowerLoss {
            data_dir,
            shadow,
            _root: root,
        }
    }

    /// `opts` with ferry's store in this data directory, under the shim
    /// (before any library `opts` already preloads, as libfaketime).
    pub fn on(&self, opts: FerryOpts) -> FerryOpts {
        let data_dir = self.data_dir.clone();
        let mut preload = shim().to_string_lossy().into_owned();
        if let Some((_, other)) = opts.env.iter().rev().find(|(k, _)| k == "LD_PRELOAD") {
            preload = format!("{preload}:{other}");
        }
        opts.with(|c| c.gateway.data_dir = data_dir)
            .with_env("LD_PRELOAD", &preload)
            .with_env("POWERCUT_DIR", &self.data_dir.to_string_lossy())
            .with_env("POWERCUT_SHADOW", &self.shadow.to_string_lossy())
    }

    /// Cuts the power under `ferry`: SIGKILL, then the data directory
    /// becomes what the disk would hold, as `cut` says. The image is then
    /// the new durable state (ferry is not restarted here).
    pub fn cut(&self, ferry: &mut Ferry, cut: Cut, rng: &mut impl Rng) -> CutReport {
        ferry.kill();
        let mut report = CutReport::default();
        clear(&self.data_dir);
        let mut logs = Vec::new();
        for entry in read_dir(&self.shadow) {
            let name = entry.file_name().to_string_lossy().into_owned();
            match name.strip_suffix(".pending") {
                Some(file) => logs.push((file.to_string(), entry.path())),
                None => {
                    fs::copy(entry.path(), self.data_dir.join(&name)).expect("copy an image");
                }
            }
        }
        for (file, log) in logs {
            let records = read_log(&log);
            if records.is_empty() {
                continue;
            }
            let kept = replay(&self.data_dir.join(&file), &records, cut, rng);
            report.files.insert(file, (records.len(), kept.0, kept.1));
        }
        // What is on disk now is durable: the next run starts from it.
        clear(&self.shadow);
        for entry in read_dir(&self.data_dir) {
            fs::copy(entry.path(), self.shadow.join(entry.file_name())).expect("copy to the image");
        }
        report
    }
}

/// One write (or truncation) logged by the shim.
struct Record {
    offset: u64,
    /// `None`: a truncation to `offset`.
    bytes: Option<Vec<u8>>,
}

fn read_log(path: &Path) -> Vec<Record> {
    let raw = fs::read(path).expect("read a pending log");
    let mut records = Vec::new();
    let mut at = 0;
    let word = |at: usize| u64::from_ne_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
    while at + 16 <= raw.len() {
        let (offset, len) = (word(at), word(at + 8));
        at += 16;
        if len == TRUNCATE {
            records.push(Record {
                offset,
                bytes: None,
            });
            continue;
        }
        let end = at + len as usize;
        if end > raw.len() {
            // The process died while appending this record: the write was
            // not seen whole by the log, and a torn log record is dropped.
            break;
        }
        records.push(Record {
            offset,
            bytes: Some(raw[at..end].to_vec()),
        });
        at = end;
    }
    records
}

/// Applies what `cut` keeps of `records` to `path`: (kept whole, torn).
fn replay(path: &Path, records: &[Record], cut: Cut, rng: &mut impl Rng) -> (usize, usize) {
    use std::os::unix::fs::FileExt;
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open an image file");
    let (mut whole, mut torn) = (0, 0);
    let stop = rng.gen_range(0..records.len());
    for (i, r) in records.iter().enumerate() {
        // How many bytes of this write reach the disk (all for a
        // truncation that happens).
        let keep = match (cut, &r.bytes) {
            (Cut::Clean, _) => None,
            (Cut::Torn, _) if i > stop => None,
            (Cut::Torn, Some(b)) if i == stop => Some(torn_len(b.len() as u64, rng)),
            (Cut::Torn, _) => Some(u64::MAX),
            (Cut::Scrambled, Some(b)) => match rng.gen_range(0..3) {
                0 => None,
                1 => Some(torn_len(b.len() as u64, rng)),
                _ => Some(u64::MAX),
            },
            (Cut::Scrambled, None) => rng.gen_bool(0.5).then_some(u64::MAX),
        };
        let Some(keep) = keep else { continue };
        match &r.bytes {
            None => file.set_len(r.offset).expect("truncate an image file"),
            Some(b) => {
                let n = keep.min(b.len() as u64) as usize;
                file.write_all_at(&b[..n], r.offset)
                    .expect("write an image file");
                if n == b.len() {
                    whole += 1;
                } else {
                    torn += 1;
                }
            }
        }
    }
    (whole, torn)
}

/// A torn write's length: whole sectors of it, fewer than all of them.
fn torn_len(len: u64, rng: &mut impl Rng) -> u64 {
    let sectors = len.div_ceil(SECTOR);
    if sectors <= 1 {
        return 0;
    }
    rng.gen_range(0..sectors) * SECTOR
}

fn read_dir(dir: &Path) -> Vec<fs::DirEntry> {
    fs::read_dir(dir)
        .expect("read a dir")
        .map(|e| e.expect("dir entry"))
        .collect()
}

fn clear(dir: &Path) {
    for entry in read_dir(dir) {
        fs::remove_file(entry.path()).expect("remove a file");
    }
}
