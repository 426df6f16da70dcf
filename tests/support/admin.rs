//! The admin HTTP server from outside: plain HTTP GETs and Prometheus
//! text parsed by series. The status page in a real browser is
//! `super::chromium`'s.

use std::time::Duration;

use super::Ferry;

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
