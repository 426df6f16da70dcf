//! The status page rendered by a real headless Chromium (Debian's
//! `chromium`, which scripts/test.sh installs): the DOM after the page's
//! scripts ran, a screenshot, and the text of an element. Only the
//! `system-tests` feature's tests use it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian's package puts Chromium.
const CHROMIUM: &str = "/usr/bin/chromium";

/// Loads `url` in headless Chromium, lets its scripts run for `settle` of
/// virtual time (fetches included), and returns the DOM as HTML. Fails,
/// with how to get it, when Chromium is missing.
pub fn render_dom(url: &str, settle: Duration) -> String {
    super::blocking(|| render_now(url, settle, &[]))
}

/// [`render_dom`] in time zone `tz` (the browser's `TZ`).
pub fn render_dom_in_zone(url: &str, settle: Duration, tz: &str) -> String {
    super::blocking(|| render_now_in(url, settle, &[], Some(tz)))
}

/// [`render_dom`] with Chromium given `args` too (e.g. a
/// `--host-resolver-rules` that makes a name resolve to 127.0.0.1).
pub fn render_dom_with(url: &str, settle: Duration, args: &[&str]) -> String {
    super::blocking(|| render_now(url, settle, args))
}

/// Loads `url` in headless Chromium in real time and returns the DOM as
/// HTML once the page has loaded (its load event: every frame and image
/// in it fetched), for a page whose scripts wait on a socket, which
/// virtual time does not wait for.
pub fn render_loaded(url: &str) -> String {
    super::blocking(|| render_now(url, Duration::ZERO, &[]))
}

fn render_now(url: &str, settle: Duration, args: &[&str]) -> String {
    render_now_in(url, settle, args, None)
}

fn render_now_in(url: &str, settle: Duration, args: &[&str], tz: Option<&str>) -> String {
    let profile = tempfile::tempdir().expect("a Chromium profile dir");
    let mut command = chromium(&profile);
    command.args(args);
    if let Some(tz) = tz {
        command.env("TZ", tz);
    }
    if !settle.is_zero() {
        command.arg(format!("--virtual-time-budget={}", settle.as_millis()));
    }
    command.arg("--dump-dom").arg(url);
    let out = run_bounded(command, url);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && dom.contains("</html>"),
        "chromium failed on {url} ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    dom
}

/// Saves a PNG of `url` as headless Chromium draws it at `size` (width,
/// height) once its scripts ran for 5 s of virtual time.
pub fn screenshot(url: &str, out: &Path, (width, height): (u32, u32)) {
    super::blocking(|| {
        let profile = tempfile::tempdir().expect("a Chromium profile dir");
        let mut command = chromium(&profile);
        command
            .arg("--virtual-time-budget=5000")
            .arg("--hide-scrollbars")
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--screenshot={}", out.display()))
            .arg(url);
        let done = run_bounded(command, url);
        assert!(
            done.status.success() && out.exists(),
            "chromium made no screenshot of {url} ({}): {}",
            done.status,
            String::from_utf8_lossy(&done.stderr)
        );
    })
}

/// Headless Chromium with a throwaway profile; fails, with how to get it,
/// when it is missing.
fn chromium(profile: &tempfile::TempDir) -> Command {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} not found: the status page test needs a real headless browser. \
         Install Debian's chromium (`sudo apt-get install chromium`), or run \
         `bash scripts/test.sh`, which installs it"
    );
    let mut command = Command::new(CHROMIUM);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs `command` to its end, within 90 s (then it is killed and the test
/// fails).
fn run_bounded(mut command: Command, url: &str) -> std::process::Output {
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("start {CHROMIUM}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match child.try_wait().expect("wait for chromium") {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                panic!("headless chromium did not finish rendering {url} in 90 s");
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    child.wait_with_output().expect("chromium output")
}

/// The text inside the element with `id` in rendered `html` (the first
/// element's own text, tags stripped).
pub fn text_of(html: &str, id: &str) -> String {
    let marker = format!("id=\"{id}\"");
    let at = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no element #{id} in the page:\n{html}"));
    let open_end = at + html[at..].find('>').expect("the tag closes");
    let tag_start = html[..at].rfind('<').expect("a tag");
    let name: String = html[tag_start + 1..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let close = format!("</{name}>");
    // Nested elements of the same name (tables in tables) are not used.
    let end = open_end + html[open_end..].find(&close).expect("the element closes");
    strip_tags(&html[open_end + 1..end])
}

fn strip_tags(s: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in s.chars() {
        match c {
            '<' => {
                in_tag = true;
                out.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}
