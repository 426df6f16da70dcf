//! The admin server answers only to its own names: a request for any
//! other (what a web page's requests carry after DNS rebinding) is
//! refused on every route, in a browser too, while the listen address,
//! localhost and `admin.allowed_hosts` are served.

#[cfg(feature = "system-tests")]
use std::time::Duration;

use crate::support::admin::get_as;
#[cfg(feature = "system-tests")]
use crate::support::chromium::render_dom_with;
#[cfg(feature = "system-tests")]
use crate::support::Device;
use crate::support::{check_config, logged};

use super::{lone_ferry, ROUTES};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_is_refused_on_every_route_and_the_servers_own_names_are_served() {
    let ferry = lone_ferry(
        // Through the environment, as a list: FERRY_ADMIN__ALLOWED_HOSTS.
        |opts| {
            opts.with_env(
                "FERRY_ADMIN__ALLOWED_HOSTS",
                "ferry.example.com,proxy.example.com:8443",
            )
        },
        "gw-admin-host",
    );
    let port = ferry.admin_port.expect("admin on");
    let evil_on_port = format!("evil.example:{port}");
    let mut refused = 0;
    for path in ROUTES {
        // A rebinding page is served from the attacker's name on the
        // admin port itself, or on another.
        for host in [
            "evil.example",
            evil_on_port.as_str(),
            "127.0.0.1.evil.example",
        ] {
            let answer = get_as(port, Some(host), path).expect("an answer");
            assert_eq!(answer.status, 421, "GET {path} as {host}: {answer:?}");
            let message = answer.json_error();
            assert!(
                message.contains("admin.allowed_hosts"),
                "GET {path} as {host}: {message}"
            );
            refused += 1;
        }
    }
    // The listen address (with its port or without), localhost on a
    // loopback listener, and each allowed name (a port in an entry must
    // match).
    let own = format!("127.0.0.1:{port}");
    let localhost = format!("localhost:{port}");
    for host in [
        own.as_str(),
        "127.0.0.1",
        localhost.as_str(),
        "localhost",
        "ferry.example.com",
        "FERRY.example.com:443",
        "proxy.example.com:8443",
    ] {
        let answer = get_as(port, Some(host), "/healthz").expect("an answer");
        assert!(
            [200, 503].contains(&answer.status),
            "GET /healthz as {host}: {answer:?}"
        );
        let status = get_as(port, Some(host), "/api/status").expect("an answer");
        assert_eq!(status.status, 200, "GET /api/status as {host}: {status:?}");
        // A clock that can be written: the answer has its Date.
        assert!(status.header("date").is_some(), "{status:?}");
    }
    for host in ["proxy.example.com", "proxy.example.com:443", "127.0.0.1:1"] {
        let answer = get_as(port, Some(host), "/api/status").expect("an answer");
        assert_eq!(answer.status, 421, "GET as {host}: {answer:?}");
    }
    // HTTP/1.0 without a Host (a load balancer's plain health check) is
    // served; HTTP/1.1 without one is a bad request, as RFC 9112 says.
    let old = get_as(port, None, "/healthz").expect("an answer");
    assert!([200, 503].contains(&old.status), "{old:?}");
    let bare = crate::support::admin::raw_http(port, b"GET /api/status HTTP/1.1\r\n\r\n")
        .expect("an answer");
    assert_eq!(bare.status, 400, "{bare:?}");
    assert!(bare.json_error().contains("Host"), "{bare:?}");
    refused += 1;

    // Each refusal is a WARN, at most 10 a minute: no flood, no ERROR.
    let log = ferry.log();
    let lines = logged(&log, "admin_host_refused", "WARN");
    assert!(
        refused > 10 && lines == 10,
        "{lines} lines for {refused} refusals:\n{log}"
    );
    assert!(
        logged(&log, "admin_host_refused", "status=421 host=evil.example") > 0,
        "{log}"
    );
    assert!(!log.contains(" ERROR "), "{log}");
}

/// A browser on the box, its name for the attacker's site rebound to
/// 127.0.0.1 (Chromium's host resolver rules stand in for the DNS), loads
/// the admin API as a page of that site would: it gets the 421, not the
/// dead letter's payload, which the same browser reads by the server's own
/// address.
#[cfg(feature = "system-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_sent_to_the_admin_port_by_a_rebound_name_gets_no_dead_letter() {
    let ferry = lone_ferry(|opts| opts, "gw-admin-rebind");
    let port = ferry.admin_port.expect("admin on");
    let device = Device::connect(ferry.south_port, "press-1").await;
    let secret = "recipe-4711-not-json";
    device
        .publish_raw(&device.up_topic("t"), secret.as_bytes().to_vec())
        .await;
    crate::support::receipts::eventually(Duration::from_secs(10), "dead-lettered", || {
        ferry.query_i64("SELECT count(*) FROM dead_letter", []) == 1
    })
    .await;
    let id = ferry.query_i64("SELECT id FROM dead_letter", []);
    let settle = Duration::from_secs(2);
    let own = render_dom_with(
        &format!("http://127.0.0.1:{port}/api/dlq/{id}"),
        settle,
        &[],
    );
    assert!(own.contains(secret), "read by its own address: {own}");
    let rebound = render_dom_with(
        &format!("http://attacker.example:{port}/api/dlq/{id}"),
        settle,
        &["--host-resolver-rules=MAP attacker.example 127.0.0.1"],
    );
    assert!(
        rebound.contains("does not answer to") && !rebound.contains(secret),
        "read through a rebound name: {rebound}"
    );
    assert!(logged(&ferry.log(), "admin_host_refused", "host=attacker.example") > 0);
}

#[test]
fn check_config_names_each_bad_allowed_host_on_a_line_of_its_own() {
    let (code, out) = check_config(
        "[gateway]\nid = \"g\"\n[admin]\nallowed_hosts = [\"ferry.example.com\", \"*.example.com\", \"http://x/\", \"::1\"]\n",
    );
    assert_eq!(code, Some(64), "{out}");
    for (i, says) in [(1, "no wildcards"), (2, "not a URL"), (3, "in brackets")] {
        let key = format!("admin.allowed_hosts[{i}]");
        let lines: Vec<&str> = out.lines().filter(|l| l.contains(&key)).collect();
        assert!(
            lines.len() == 1 && lines[0].contains(says),
            "{key}: {lines:?}\n{out}"
        );
    }
    assert!(!out.contains("allowed_hosts[0]"), "{out}");
}
