//! The admin HTTP server from outside: plain HTTP GETs, Prometheus text
//! parsed by series, and the status page rendered by a real headless
//! Chromium (Debian's `chromium`, which scripts/test.sh installs).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Ferry;

/// Where Debian's package puts Chromium.
const CHROMIUM: &str = "/usr/bin/chromium";

impl Ferry {
    /// `http://127.0.0.1:{admin port}{path}`.
    pub fn admin_url(&self, path: &str) -> String {
        let port = self.admin_port.expect("the admin server is on");
        format!("http://127.0.0.1:{port}{path}")
    }

    /// GET `path` on the admin server: (status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        get(&self.admin_url(path))
    }

    /// GET `path` on the admin server: (status, Content-Type, body).
    pub fn admin_get_typed(&self, path: &str) -> (u16, String, String) {
        get_typed(&self.admin_url(path))
    }

    /// GET `path`, which must answer 200 with JSON.
    pub fn admin_json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.admin_get(path);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
    }

    /// `/metrics`, which must answer 200.
    pub fn metrics(&self) -> Metrics {
        let (status, body) = self.admin_get("/metrics");
        assert_eq!(status, 200, "GET /metrics: {body}");
        Metrics(body)
    }
}

/// GET `url`: (status, body); an error status is an answer too.
pub fn get(url: &str) -> (u16, String) {
    try_get(url).unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// GET `url`: (status, Content-Type or "", body).
pub fn get_typed(url: &str) -> (u16, String, String) {
    super::blocking(|| {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(20))
            .build();
        let answer = match agent.get(url).call() {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("GET {url}: {e}"),
        };
        let status = answer.status();
        let kind = answer.header("content-type").unwrap_or("").to_string();
        (status, kind, answer.into_string().unwrap_or_default())
    })
}

/// POST an empty body to `url`: (status, Content-Type or "", body).
pub fn post(url: &str) -> (u16, String, String) {
    super::blocking(|| {
        let answer = match ureq::post(url).call() {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("POST {url}: {e}"),
        };
        let status = answer.status();
        let kind = answer.header("content-type").unwrap_or("").to_string();
        (status, kind, answer.into_string().unwrap_or_default())
    })
}

/// GET `url`, or why there was no answer (refused, closed, timed out).
pub fn try_get(url: &str) -> Result<(u16, String), String> {
    super::blocking(|| {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(20))
            .build();
        match agent.get(url).call() {
            Ok(r) => Ok((r.status(), r.into_string().map_err(|e| e.to_string())?)),
            Err(ureq::Error::Status(code, r)) => Ok((code, r.into_string().unwrap_or_default())),
            Err(e) => Err(e.to_string()),
        }
    })
}

/// An HTTP answer read off a raw socket.
#[derive(Debug, Clone)]
pub struct RawAnswer {
    pub status: u16,
    /// Header names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawAnswer {
    /// The first header `name` (lowercase), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `error` of a JSON error answer, which it must be:
    /// `Content-Type: application/json` and `{"error": "..."}`.
    pub fn json_error(&self) -> String {
        assert!(
            self.header("content-type")
                .is_some_and(|t| t.starts_with("application/json")),
            "not a JSON answer: {self:?}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"));
        json["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no string `error`: {self:?}"))
            .to_string()
    }
}

/// Sends `request`, byte for byte, on a new connection to 127.0.0.1:`port`
/// and reads until the server closes it (20 s at most): its answer, or
/// `None` when it closed without one.
pub fn raw_http(port: u16, request: &[u8]) -> Option<RawAnswer> {
    use std::io::{Read, Write};
    super::blocking(|| {
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the admin port");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        // A server that answers early may close before all is written.
        let _ = stream.write_all(request);
        let mut got = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if got.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return None
                }
                Err(e) if got.is_empty() => panic!("no answer within 20 s: {e}"),
                Err(_) => break,
            }
        }
        if got.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&got).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no end of head in {text:?}"));
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Some(RawAnswer {
            status,
            headers,
            body: body.to_string(),
        })
    })
}

/// GET `path` with `Host: host` (none when `None`) in HTTP/1.1 (HTTP/1.0
/// when there is no Host), on a new connection to 127.0.0.1:`port`.
pub fn get_as(port: u16, host: Option<&str>, path: &str) -> Option<RawAnswer> {
    let request = match host {
        Some(host) => format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        None => format!("GET {path} HTTP/1.0\r\n\r\n"),
    };
    raw_http(port, request.as_bytes())
}

/// A `/metrics` answer.
#[derive(Debug, Clone)]
pub struct Metrics(pub String);

impl Metrics {
    /// The value of `series` as written, e.g.
    /// `ferry_messages_received_total{direction="up"}`; `None` if absent.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.0.lines().find_map(|l| {
            let value = l.strip_prefix(series)?.strip_prefix(' ')?;
            value.parse().ok()
        })
    }

    /// The value of `series`, which must be there.
    pub fn value(&self, series: &str) -> f64 {
        self.get(series)
            .unwrap_or_else(|| panic!("no {series} in /metrics:\n{}", self.0))
    }

    /// Every metric family named in a `# TYPE` line.
    pub fn families(&self) -> Vec<String> {
        self.0
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_string)
            .collect()
    }
}

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
