//! What the benchmarks share: the test harness (Mosquitto, the `ferry`
//! binary, MQTT clients), the gateway started with production settings,
//! readings from /proc (CPU ticks, memory, pids), the open-file limit, and
//! the pieces of their clap flags that are alike.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use ferry::config::RawConfig;

/// The integration tests' harness, compiled into each bench as well.
#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports)]
pub mod harness;

use harness::{Ferry, FerryOpts, Mosquitto};

// -------------------------------------------------------------------- flags

/// `cargo bench` runs every bench binary with `--bench`: accepted, ignored.
#[derive(clap::Args, Debug, Clone)]
pub struct CargoBench {
    #[arg(long = "bench", hide = true)]
    _bench: bool,
}

/// A clap value parser: whole seconds as a `Duration`.
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    s.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| format!("`{s}` is not a whole number of seconds"))
}

/// Exits with clap's usage error for a flag value that parsed but is out of
/// range.
pub fn invalid<A: clap::CommandFactory>(message: String) -> ! {
    A::command()
        .error(clap::error::ErrorKind::ValueValidation, message)
        .exit()
}

// -------------------------------------------------------------- environment

/// The gateway and its upstream, torn down (ferry first) on drop.
pub struct Env {
    pub ferry: Ferry,
    pub mosquitto: Mosquitto,
    pub ferry_pid: u32,
    pub mosquitto_pid: u32,
}

impl Env {
    /// Mosquitto, and ferry as `gateway` on it with the production timings
    /// of conf/ferry.toml (not the tests' short ones), then `change`.
    pub fn start(gateway: &str, change: impl FnOnce(&mut RawConfig)) -> Env {
        let mosquitto = Mosquitto::start();
        let production = RawConfig::default();
        let opts = FerryOpts::new(gateway, mosquitto.port).with(|c| {
            c.north.ack_timeout_ms = production.north.ack_timeout_ms;
            c.north.keep_alive_s = production.north.keep_alive_s;
            c.retry = production.retry;
            change(c);
        });
        let ferry = Ferry::start(opts);
        Env {
            ferry_pid: ferry.pid().unwrap_or(0),
            mosquitto_pid: mosquitto.pid().unwrap_or(0),
            ferry,
            mosquitto,
        }
    }
}

// --------------------------------------------------------------------- /proc

/// Clock ticks per second, the unit of CPU times in /proc.
pub fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// `(comm, utime + stime)` from a /proc/.../stat file, in clock ticks.
pub fn stat_ticks(path: &str) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // `pid (comm) state ...`; comm may itself hold spaces and parentheses.
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); utime and stime are fields 14 and 15.
    let get = |k: usize| f.get(k - 3).and_then(|v| v.parse::<u64>().ok());
    Some((comm, get(14)? + get(15)?))
}

/// utime + stime of a process (all its threads), in clock ticks; 0 once it
/// is gone.
pub fn cpu_ticks(pid: u32) -> u64 {
    stat_ticks(&format!("/proc/{pid}/stat")).map_or(0, |(_, t)| t)
}

/// CPU ticks per thread of a process, keyed by `comm (tid)`.
pub fn thread_ticks(pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let tid = e.file_name().to_string_lossy().to_string();
        if let Some((comm, ticks)) = stat_ticks(&format!("/proc/{pid}/task/{tid}/stat")) {
            out.insert(format!("{comm} ({tid})"), ticks);
        }
    }
    out
}

/// A `Vm*` line of /proc/{pid}/status (`VmRSS`, `VmHWM`, ...), in KiB.
pub fn vm_kib(pid: u32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Resets the process's VmHWM to its current RSS; false if not allowed.
pub fn reset_peak_rss(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Raises RLIMIT_NOFILE (soft, and hard if allowed) to at least `want`;
/// returns the soft limit in force afterwards. ferry inherits it.
pub fn raise_fd_limit(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur >= want as libc::rlim_t {
            return lim.rlim_cur;
        }
        let raised = libc::rlimit {
            rlim_cur: want as libc::rlim_t,
            rlim_max: lim.rlim_max.max(want as libc::rlim_t),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            let soft = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &soft);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
}

/// The cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}
