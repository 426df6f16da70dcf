//! The gateway's life on the north side: retained status while it runs, a
//! clean exit on SIGTERM that leaves `online: false` behind.

use std::time::Duration;

use ferry::client::backend::{BackendClient, BackendEvent, BackendOptions};

use crate::support;

/// The first retained status a fresh subscriber sees.
async fn retained_status(port: u16, gateway: &str, client_id: &str) -> serde_json::Value {
    let mut opts = BackendOptions::new("127.0.0.1", port, gateway);
    opts.client_id = client_id.to_string();
    opts.persistent_session = false;
    let mut backend = BackendClient::connect(opts);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, backend.events.recv()).await {
            Ok(Some(BackendEvent::Status(s))) => return s,
            Ok(Some(_)) => continue,
            _ => panic!("no retained status on ferry/{gateway}/status within 20 s"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_cleanly_and_leaves_the_retained_status_offline() {
    let mosquitto = support::Mosquitto::start();
    let mut ferry = support::Ferry::start(support::FerryOpts::new("gw-life", mosquitto.port));

    // Online once its subscriptions are acknowledged.
    let mut status = retained_status(mosquitto.port, "gw-life", "watch-1").await;
    for _ in 0..50 {
        if status["online"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = retained_status(mosquitto.port, "gw-life", "watch-1").await;
    }
    assert_eq!(status["online"], true, "{status}");

    // The last will carries the time ferry started; a clean exit says when
    // it left.
    let before_exit = support::now_ms();
    assert!(
        ferry.terminate(Duration::from_secs(5)),
        "ferry did not exit within 5 s of SIGTERM:\n{}",
        ferry.log_tail()
    );
    let status = retained_status(mosquitto.port, "gw-life", "watch-2").await;
    assert_eq!(
        status["online"],
        false,
        "after a clean exit: {status}\n{}",
        ferry.log_tail()
    );
    let ts = status["ts"].as_u64().expect("status has ts");
    assert!(
        ts >= before_exit,
        "status ts {ts} predates the exit ({before_exit}): the last will, not a clean exit"
    );
    assert!(
        ferry.log().contains("north session closed"),
        "{}",
        ferry.log_tail()
    );
}
