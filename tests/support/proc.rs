//! Child processes and the machine around them: their output, signals,
//! reaping, resident memory and the open-file limit.

use std::fs;
use std::process::Child;
use std::time::{Duration, Instant};

/// What a child prints, read as it comes: each stdout line on the
/// receiver, and stderr in full from the handle once the child has closed
/// it. Takes both pipes (spawned with `Stdio::piped()`).
pub fn read_output(
    child: &mut Child,
) -> (
    tokio::sync::mpsc::UnboundedReceiver<String>,
    std::thread::JoinHandle<String>,
) {
    use std::io::{BufRead, BufReader};
    let stdout = child.stdout.take().expect("stdout piped");
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    (lines, stderr)
}

pub fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child we own and have not reaped yet.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
}

/// Waits up to `timeout` for the child to exit; true if it did.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

pub fn kill_and_reap(child: &mut Child) {
    signal(child, libc::SIGKILL);
    let _ = child.wait();
}

/// Resident memory of a process, KiB (`VmRSS` in /proc).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Raises this process's open-file limit to its hard limit (children, such
/// as ferry, inherit it); returns the new limit.
pub fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        lim.rlim_cur
    }
}
