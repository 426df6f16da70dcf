//! Bytes that are not HTTP, on a raw socket to the admin port: hyper
//! refuses them before any route sees a request, and answered with an
//! empty body; now each answer is JSON with hyper's status, and a request
//! whose headers never finish gets a 408 in JSON too.

use std::time::{Duration, Instant};

use crate::support::admin::raw_http;

use super::lone_ferry;

#[test]
fn what_hyper_cannot_parse_is_answered_with_its_status_and_a_json_error() {
    let ferry = lone_ferry(|opts| opts, "gw-admin-raw");
    let port = ferry.admin_port.expect("admin on");
    let long_target = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    let long_header = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(500_000)
    );
    // Under hyper's read buffer, so it always arrives whole and parses:
    // refused by the head limit, not answered.
    let whole_header = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(200_000)
    );
    for (request, status, says) in [
        (b"garbage\r\n\r\n".to_vec(), 400, "method"),
        (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n".to_vec(),
            400,
            "method",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n".to_vec(),
            400,
            "header",
        ),
        (
            b"GET / HTTP/9.9\r\nHost: x\r\n\r\n".to_vec(),
            400,
            "version",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n".to_vec(),
            400,
            "content-length",
        ),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(), 400, "HTTP2"),
        (long_target.into_bytes(), 414, "URI"),
        (whole_header.into_bytes(), 431, "too large"),
        (long_header.into_bytes(), 431, "too large"),
    ] {
        let shown = String::from_utf8_lossy(&request[..request.len().min(40)]).into_owned();
        let answer = raw_http(port, &request)
            .unwrap_or_else(|| panic!("{shown:?}: closed without an answer"));
        assert_eq!(answer.status, status, "{shown:?}: {answer:?}");
        let message = answer.json_error();
        assert!(
            message.to_lowercase().contains(&says.to_lowercase()),
            "{shown:?}: {message}"
        );
        assert_eq!(answer.header("connection"), Some("close"), "{answer:?}");
    }
    // Headers that never finish: 408 after the 5 s header timeout, in
    // JSON; a connection that says nothing is closed without a word. Both
    // at once, on threads, so the test waits 5 s once.
    let started = Instant::now();
    let partial = std::thread::spawn(move || raw_http(port, b"GET /healthz HTTP/1.1\r\nHost: x"));
    let silent = std::thread::spawn(move || raw_http(port, b""));
    let partial = partial.join().expect("thread").expect("an answer");
    assert_eq!(partial.status, 408, "{partial:?}");
    assert!(partial.json_error().contains("5 s"), "{partial:?}");
    assert!(silent.join().expect("thread").is_none());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    // The server is still there.
    assert_eq!(ferry.admin_get("/api/status").0, 200);
    assert!(!ferry.log().contains("panicked"));
}
