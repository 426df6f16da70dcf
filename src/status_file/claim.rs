//! The running gateway's claim on its data directory: `ferry.pid` holds
//! its pid, under an exclusive `flock` it keeps for its whole life.
//!
//! The kernel lets go of the lock when the process ends, however it ends
//! (SIGKILL included), so what must always hold is: the lock is taken if
//! and only if a gateway runs on this data directory — whatever its binary
//! is called, and a pid file left by a dead gateway, or naming a pid since
//! reused by another program, reads as not running.
//!
//! A reader ([`holder`]) probes with a shared lock it drops at once; a
//! starting gateway that meets such a probe tries again for
//! [`CLAIM_WAIT`], and one that still finds the lock taken stops: another
//! gateway runs on the same store.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::warn;

/// The pid file inside `gateway.data_dir`.
pub const PID_FILE: &str = "ferry.pid";

/// How long a starting gateway waits for the lock: far longer than a
/// reader's probe holds it, far shorter than a start.
const CLAIM_WAIT: Duration = Duration::from_secs(1);
const CLAIM_RETRY: Duration = Duration::from_millis(10);

/// The claim, held until dropped (or the process ends).
#[derive(Debug)]
pub struct Claim {
    /// `None` if the pid file could not be kept (a warning said so).
    _file: Option<File>,
}

/// Why a gateway may not run on its data directory.
#[derive(Debug, thiserror::Error)]
#[error(
    "gateway.data_dir {} is in use by another running gateway ({holder}): \
     stop it, or give this one a data_dir of its own",
    dir.display()
)]
pub struct ClaimError {
    dir: PathBuf,
    /// `pid N`, or what else is known of it.
    holder: String,
}

/// Whether [`try_claim`] found the lock taken.
enum Taken {
    Free(Claim),
    ByAnother(File),
}

/// Claims `data_dir` for this process: waits up to [`CLAIM_WAIT`] for the
/// lock, then writes its pid. A pid file that cannot be kept at all (a
/// read-only directory, a file system without locks) is a warning, not a
/// reason to stop: only `ferry status` loses sight of the gateway.
pub async fn claim(data_dir: &Path) -> Result<Claim, ClaimError> {
    let deadline = tokio::time::Instant::now() + CLAIM_WAIT;
    loop {
        match try_claim(data_dir) {
            Taken::Free(claim) => return Ok(claim),
            Taken::ByAnother(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(CLAIM_RETRY).await
            }
            Taken::ByAnother(mut file) => {
                let holder = match read_pid(&mut file) {
                    Some(pid) => format!("pid {pid}"),
                    None => format!("it holds {}", data_dir.join(PID_FILE).display()),
                };
                return Err(ClaimError {
                    dir: data_dir.to_path_buf(),
                    holder,
                });
            }
        }
    }
}

/// One attempt at the lock.
fn try_claim(data_dir: &Path) -> Taken {
    let path = data_dir.join(PID_FILE);
    let unkept = |what: &str, e: std::io::Error| {
        warn!(event = "pid_file_failed", path = %path.display(), error = %e, "cannot {what} the pid file; `ferry status` will say the gateway is not running");
        Taken::Free(Claim { _file: None })
    };
    // The store creates it too; the pid file comes first.
    let _ = std::fs::create_dir_all(data_dir);
    // Not truncated on open: until the lock is ours, the pid in it is the
    // holder's.
    let mut file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) => return unkept("open", e),
    };
    match lock(&file, libc::LOCK_EX) {
        Ok(true) => {}
        Ok(false) => return Taken::ByAnother(file),
        Err(e) => return unkept("lock", e),
    }
    let written = file
        .set_len(0)
        .and_then(|()| file.write_all(format!("{}\n", std::process::id()).as_bytes()));
    if let Err(e) = written {
        // The lock alone says running; the pid is for the reader to match.
        warn!(event = "pid_file_failed", path = %path.display(), error = %e, "cannot write the pid file; `ferry status` will say the gateway is not running");
    }
    Taken::Free(Claim { _file: Some(file) })
}

/// The pid of the gateway holding `data_dir`'s claim; `None` if none does
/// (or it has not written its pid yet).
pub fn holder(data_dir: &Path) -> Option<u32> {
    let mut file = File::open(data_dir.join(PID_FILE)).ok()?;
    // A shared lock we get means no gateway holds the exclusive one; it
    // goes when the file is closed, at the end of this function.
    match lock(&file, libc::LOCK_SH) {
        Ok(false) => read_pid(&mut file),
        Ok(true) | Err(_) => None,
    }
}

/// `flock(how | LOCK_NB)`: whether it was granted.
fn lock(file: &File, how: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock(2) on a descriptor `file` owns and keeps open.
    if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(false),
        Some(libc::EINTR) => lock(file, how),
        _ => Err(e),
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(dir: &Path) -> Claim {
        match try_claim(dir) {
            Taken::Free(claim) => claim,
            Taken::ByAnother(_) => panic!("{} is claimed already", dir.display()),
        }
    }

    #[test]
    fn a_held_claim_names_its_pid_and_is_let_go_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(holder(dir.path()), None, "no pid file: no gateway");
        let claim = claimed(dir.path());
        assert_eq!(holder(dir.path()), Some(std::process::id()));
        // A probe does not take it away.
        assert_eq!(holder(dir.path()), Some(std::process::id()));
        assert!(matches!(try_claim(dir.path()), Taken::ByAnother(_)));
        drop(claim);
        assert_eq!(holder(dir.path()), None, "the pid file stays, unheld");
        assert!(dir.path().join(PID_FILE).exists());
        let _again = claimed(dir.path());
    }

    #[test]
    fn a_pid_file_naming_a_live_process_but_unlocked_is_no_gateway() {
        let dir = tempfile::tempdir().unwrap();
        // What a dead gateway leaves, its pid since given to a live
        // process (this one).
        std::fs::write(
            dir.path().join(PID_FILE),
            format!("{}\n", std::process::id()),
        )
        .unwrap();
        assert_eq!(holder(dir.path()), None);
    }

    #[tokio::test]
    async fn a_second_gateway_on_the_same_data_dir_is_refused_naming_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let _first = claim(dir.path()).await.expect("the first claim");
        let err = claim(dir.path()).await.expect_err("a second claim");
        let line = err.to_string();
        assert!(
            line.contains(&format!("pid {}", std::process::id())) && line.contains("data_dir"),
            "{line}"
        );
    }
}
