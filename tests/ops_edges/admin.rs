//! The admin server's errors from outside: whoever refuses a request (a
//! handler, the query or path extractor, the router), the answer is JSON
//! `{"error": "..."}` with its status, and quotes little of the request.

use serde_json::Value;

use super::lone_ferry;

/// GET `path`, which must answer `status` with `{"error": "..."}` as
/// JSON; the message.
fn json_error(ferry: &crate::support::Ferry, path: &str, status: u16) -> String {
    let (got, kind, body) = ferry.admin_get_typed(path);
    assert_eq!(got, status, "GET {path}: {body}");
    assert!(
        kind.starts_with("application/json"),
        "GET {path}: Content-Type {kind:?}: {body}"
    );
    let json: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body:?}"));
    json["error"]
        .as_str()
        .unwrap_or_else(|| panic!("GET {path}: no string `error`: {body}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_error_is_json_with_its_status_even_from_the_router() {
    let ferry = lone_ferry("gw-api-errors");
    let long = "A".repeat(4000);
    for (path, status) in [
        // Bad query strings: the extractor's rejection.
        ("/api/dlq?limit=abc", 400),
        ("/api/dlq?after=99999999999999999999", 400),
        ("/api/dlq?newest=maybe", 400),
        ("/api/status?top=-1", 400),
        // Bad path parameters.
        ("/api/dlq/not-a-number", 400),
        ("/api/trace/%FF/x", 400),
        // The handlers' own.
        ("/api/dlq?direction=sideways", 400),
        ("/api/dlq/999999", 404),
        ("/api/trace/press-1/never-sent", 404),
        // No route: under /api and anywhere else.
        ("/api/trace/x", 404),
        ("/api/nothing", 404),
        ("/nothing-here", 404),
    ] {
        let message = json_error(&ferry, path, status);
        assert!(!message.is_empty(), "GET {path}");
    }
    assert_eq!(
        json_error(&ferry, "/api/dlq/999999", 404),
        "no dead letter 999999"
    );
    // What the client sent is quoted up to 128 bytes, never more.
    for path in [
        format!("/api/dlq/{long}"),
        format!("/api/trace/press-1/{long}"),
        format!("/api/dlq?direction={long}"),
        format!("/{long}"),
    ] {
        let status = if path.contains("trace") || path.starts_with("/A") {
            404
        } else {
            400
        };
        let message = json_error(&ferry, &path, status);
        assert!(
            message.len() < 128 + 100,
            "{} bytes for a {}-byte path: {message}",
            message.len(),
            path.len()
        );
    }
    // A method no route serves.
    let url = ferry.admin_url("/api/status");
    let answer = crate::support::admin::post(&url);
    assert_eq!(answer.0, 405, "{answer:?}");
    assert!(answer.1.starts_with("application/json"), "{answer:?}");
    let json: Value = serde_json::from_str(&answer.2).expect("JSON");
    assert!(json["error"].is_string(), "{answer:?}");
}
