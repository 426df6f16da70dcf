//! `ferry.pid`: the running gateway's pid, for people and scripts, and
//! for `ferry status` where `/proc/locks` cannot name the holder of the
//! store's lock.
//!
//! It is no guard: one gateway per store is held by the store's own lock
//! on its database file (`store::lock`), which nothing done to this file
//! can free. It is written only once that lock is held, so a gateway
//! refused at its start never overwrites the running one's pid; it is
//! written whole (a temporary file renamed over it), never half. A pid
//! file that cannot be written (a read-only directory, a directory in its
//! place) is a warning: the gateway runs, and `ferry status` still finds
//! it through the lock.

use std::path::Path;

use tracing::warn;

/// The pid file inside `gateway.data_dir`.
pub const PID_FILE: &str = "ferry.pid";

/// Writes this process's pid to `data_dir/ferry.pid`.
pub fn write(data_dir: &Path) {
    let path = data_dir.join(PID_FILE);
    let tmp = data_dir.join(format!("{PID_FILE}.tmp"));
    let written = std::fs::write(&tmp, format!("{}\n", std::process::id()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        warn!(event = "pid_file_failed", path = %path.display(), error = %e, "cannot write the pid file; the gateway runs, and `ferry status` finds it by its store's lock");
    }
}

/// The pid in `data_dir/ferry.pid`, if one is there: that of the last
/// gateway started there, running or not.
pub fn read(data_dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data_dir.join(PID_FILE)).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_is_written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), None);
        std::fs::write(dir.path().join(PID_FILE), "4242\n").unwrap();
        assert_eq!(read(dir.path()), Some(4242));
        write(dir.path());
        assert_eq!(read(dir.path()), Some(std::process::id()));
        assert!(!dir.path().join("ferry.pid.tmp").exists());
    }

    #[test]
    fn a_directory_in_the_pid_file_s_place_is_only_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(PID_FILE)).unwrap();
        write(dir.path());
        assert_eq!(read(dir.path()), None);
        assert!(!dir.path().join("ferry.pid.tmp").exists());
    }
}
