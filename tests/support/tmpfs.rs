//! A small tmpfs that can fill up: a disk for one test, mounted as root.
//! Only the `system-tests` feature's tests use it.

use std::fs::{self, File};
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// A small tmpfs mounted for one test (a disk that can fill up); unmounted
/// on drop. Mounting needs root, as `.ci/run` has.
pub struct Tmpfs {
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size_mib: u64) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("ferry-tmpfs-")
            .tempdir()
            .expect("temp dir for a tmpfs");
        let path = dir.path().join("disk");
        fs::create_dir(&path).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test fills a disk: it mounts a {size_mib} MiB tmpfs and so must run as root \
             (as `bash .ci/run` does); mount said: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { path, _dir: dir }
    }

    /// Writes a file of zeros until the disk is full; returns its path.
    pub fn fill(&self) -> PathBuf {
        let ballast = self.path.join("ballast");
        let mut f = File::create(&ballast).expect("create ballast");
        let chunk = vec![0u8; 64 << 10];
        loop {
            if f.write_all(&chunk).is_err() {
                break;
            }
        }
        // What is left is smaller than a chunk: take it too.
        for _ in 0..(64 << 10) {
            if f.write_all(&[0u8; 1]).is_err() {
                break;
            }
        }
        let _ = f.sync_all();
        ballast
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
