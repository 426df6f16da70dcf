//! Running ferry under a false wall clock, as on a box without an RTC:
//! Debian's libfaketime preloaded into `ferry run`, its offset read from a
//! file the test rewrites (a step of the clock, as NTP makes one).

use std::path::{Path, PathBuf};

use super::config::FerryOpts;

/// Where Debian's `faketime` package puts the library, per architecture.
const LIBRARY_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime",
    "/usr/lib/aarch64-linux-gnu/faketime",
    "/usr/lib/arm-linux-gnueabihf/faketime",
    "/usr/lib/faketime",
];

/// libfaketime, or a failure that says how to install it: a test of the
/// clock never passes by skipping.
pub fn library() -> PathBuf {
    LIBRARY_DIRS
        .iter()
        .map(|dir| Path::new(dir).join("libfaketime.so.1"))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "libfaketime is missing (looked in {LIBRARY_DIRS:?}): apt-get install faketime \
                 (scripts/test.sh installs it)"
            )
        })
}

/// A wall clock a test can step: libfaketime reads its offset (`-365d`,
/// `-1h`, `+0`) from this file at every clock read.
pub struct FakeClock {
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl FakeClock {
    /// A clock offset by `offset` (libfaketime's syntax) from the real one.
    pub fn new(offset: &str) -> FakeClock {
        let dir = tempfile::tempdir().expect("temp dir for the fake clock");
        let clock = FakeClock {
            file: dir.path().join("faketime"),
            _dir: dir,
        };
        clock.set(offset);
        clock
    }

    /// Steps the clock to `offset` from the real one.
    pub fn set(&self, offset: &str) {
        std::fs::write(&self.file, format!("{offset}\n")).expect("write the faketime file");
    }

    /// `opts` with ferry run under this clock.
    pub fn on(&self, opts: FerryOpts) -> FerryOpts {
        opts.with_env("LD_PRELOAD", &library().to_string_lossy())
            .with_env("FAKETIME_TIMESTAMP_FILE", &self.file.to_string_lossy())
            // Read the file at every call, so a step takes at once.
            .with_env("FAKETIME_NO_CACHE", "1")
            // An NTP step moves CLOCK_REALTIME only, never CLOCK_MONOTONIC
            // or CLOCK_BOOTTIME; without this libfaketime would offset those
            // too. (Probed: with it, a `-365d` process reads the real
            // monotonic and boottime clocks and a realtime a year behind.)
            .with_env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
    }

    /// `opts` with ferry run under this clock for every clock it reads,
    /// the monotonic ones included: a step forward is time passing at once
    /// for every timer and window in ferry (a minute's window ends without
    /// a minute's wait). Only for what a jump of the monotonic clock cannot
    /// upset beyond the test's purpose; ferry's own timers fire at once.
    pub fn on_every_clock(&self, opts: FerryOpts) -> FerryOpts {
        self.on(opts).with_env("FAKETIME_DONT_FAKE_MONOTONIC", "0")
    }

    /// The wall clock as a process under this clock reads it, in ms (also
    /// proves the library loads and fakes: `date` runs under it).
    pub fn read_ms(&self) -> i64 {
        let out = std::process::Command::new("date")
            .arg("+%s%3N")
            .env("LD_PRELOAD", library())
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .output()
            .expect("run date under libfaketime");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("date printed ms")
    }
}
