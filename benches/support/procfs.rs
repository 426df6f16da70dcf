//! Readings from /proc: CPU ticks of processes, threads and the whole
//! machine, memory, the kernel's TCP counters and a listener's accept
//! queue; and the process limits a bench raises.

use std::collections::BTreeMap;

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

/// Busy ticks of the whole machine (all cores), from /proc/stat.
pub fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let f: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest is inside user).
    f.iter().take(8).sum::<u64>() - f.get(3).copied().unwrap_or(0) - f.get(4).copied().unwrap_or(0)
}

/// Counters of the `TcpExt:` lines of /proc/net/netstat (system-wide).
pub fn tcp_ext() -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("TcpExt:")).collect();
    let mut out = BTreeMap::new();
    if let [names, values, ..] = lines[..] {
        for (n, v) in names
            .split_whitespace()
            .zip(values.split_whitespace())
            .skip(1)
        {
            if let Ok(v) = v.parse() {
                out.insert(n.to_string(), v);
            }
        }
    }
    out
}

/// The `TcpExt` counters that tell of a listener that could not keep up.
pub const TCP_EXT_KEYS: [&str; 5] = [
    "ListenOverflows",
    "ListenDrops",
    "SyncookiesSent",
    "TCPReqQFullDoCookies",
    "TCPReqQFullDrop",
];

/// (accept queue now, backlog) of the listening socket on 127.0.0.1:port.
pub fn accept_queue(port: u16) -> Option<(u64, u64)> {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next()?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Some((f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?))
}
