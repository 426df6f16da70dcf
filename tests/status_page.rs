//! The status page for the operator at 3 a.m. (issue 34), in headless
//! Chromium against the real gateway: times in the browser's own zone with
//! UTC on hover, the dead letters of the last hour beside the open alerts,
//! the backend's presence unknown while north is down, every card greyed
//! with its age once the gateway stops answering, and a chart axis with
//! ticks.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::chromium::{render_dom, render_dom_in_zone, text_of};
use crate::support::receipts::eventually;
use crate::support::{boot_id, Device, Ferry, FerryOpts, Mosquitto};

const SECS_10: Duration = Duration::from_secs(10);

/// The `title` of the first `<time>` inside element `id`.
fn time_title(dom: &str, id: &str) -> String {
    let at = dom.find(&format!("id=\"{id}\"")).expect("the element");
    let rest = &dom[at..];
    let time = rest.find("<time").expect("a <time> in it");
    let title = rest[time..].find("title=\"").expect("a title") + time + 7;
    rest[title..title + rest[title..].find('"').expect("closed")].to_string()
}

/// Minutes past midnight of "YYYY-MM-DD HH:MM:SS[Z]".
fn minutes(t: &str) -> i64 {
    let hm = &t[11..16];
    hm[..2].parse::<i64>().expect("hours") * 60 + hm[3..].parse::<i64>().expect("minutes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_speaks_local_time_counts_the_hours_dead_letters_and_draws_ticks() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-page-local", mq.port));
    let mut device = Device::connect(ferry.south_port, "press-4").await;
    device.publish_raw(&device.up_topic("t"), "{broken").await;
    assert_eq!(
        device.next_receipt(SECS_10).await.expect("a receipt")["status"],
        "rejected"
    );
    // India is UTC+05:30 all year.
    let dom = render_dom_in_zone(
        &ferry.admin_url("/"),
        Duration::from_secs(5),
        "Asia/Kolkata",
    );
    assert!(dom.contains("data-loaded=\"true\""), "{dom}");
    let shown = text_of(&dom, "started");
    let utc = time_title(&dom, "started");
    assert!(
        utc.ends_with('Z') && !shown.ends_with('Z'),
        "{shown} / {utc}"
    );
    assert_eq!(
        (minutes(&shown) - minutes(&utc)).rem_euclid(24 * 60),
        5 * 60 + 30,
        "local {shown}, UTC {utc}"
    );
    assert_eq!(text_of(&dom, "alert-list"), "kind raised detail none");
    assert_eq!(text_of(&dom, "dead-recent"), "1", "beside the alerts");
    assert!(
        text_of(&dom, "dead-recent-newest").contains("malformed"),
        "{}",
        text_of(&dom, "dead-recent-newest")
    );
    assert_eq!(
        dom.matches("class=\"tick-y\"").count(),
        3,
        "three rate ticks"
    );
    assert!(dom.matches("class=\"tick-x\"").count() >= 2, "time ticks");
    assert!(text_of(&dom, "tp-ticks").contains("now"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_north_is_down_the_backend_is_unknown_not_present() {
    let mut mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-page-north", mq.port));
    eventually(SECS_10, "north up", || {
        ferry.admin_json("/api/status")["north"]["up"] == true
    })
    .await;
    mq.stop();
    eventually(SECS_10, "north down", || {
        ferry.admin_json("/api/status")["north"]["up"] == false
    })
    .await;
    let dom = render_dom(&ferry.admin_url("/"), Duration::from_secs(3));
    assert_eq!(text_of(&dom, "north-state"), "down");
    assert_eq!(text_of(&dom, "backend-state"), "unknown");
    assert!(
        text_of(&dom, "backend-since").contains("north is down"),
        "{}",
        text_of(&dom, "backend-since")
    );
}

/// Answers the page and its first refresh from the gateway's admin port,
/// then nothing but 503: the gateway as a browser sees it when it stops
/// answering.
fn answering_then_gone(admin: u16, answered: usize) -> u16 {
    let server = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = server.local_addr().expect("its port").port();
    let served = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for conn in server.incoming().take(200) {
            let Ok(mut conn) = conn else { continue };
            let served = served.clone();
            std::thread::spawn(move || {
                let mut request = [0u8; 4096];
                let n = conn.read(&mut request).unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..n]).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                if served.fetch_add(1, Ordering::SeqCst) >= answered {
                    let _ = conn.write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\ngone",
                    );
                    return;
                }
                let Ok(mut up) = std::net::TcpStream::connect(("127.0.0.1", admin)) else {
                    return;
                };
                let _ = up.write_all(
                    format!(
                        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{admin}\r\nConnection: close\r\n\r\n"
                    )
                    .as_bytes(),
                );
                let mut response = Vec::new();
                let _ = up.read_to_end(&mut response);
                let _ = conn.write_all(&response);
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_gateway_stops_answering_every_card_is_greyed_with_its_age() {
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-page-gone", mq.port));
    let _device = Device::connect(ferry.south_port, &format!("p-{}", &boot_id()[..6])).await;
    eventually(SECS_10, "the device online", || {
        ferry.admin_json("/api/status")["devices_online"] == 1
    })
    .await;
    let admin = ferry.admin_port.expect("admin on");
    // The page itself and its first refresh's six requests.
    let proxy = answering_then_gone(admin, 7);
    let dom = render_dom(
        &format!("http://127.0.0.1:{proxy}/"),
        Duration::from_secs(7),
    );
    assert!(
        dom.contains("data-loaded=\"true\""),
        "it rendered once: {dom}"
    );
    assert!(dom.contains("class=\"stale\""), "greyed: {dom}");
    let cards = dom.matches("class=\"card\"").count();
    let ages = dom.matches("class=\"stale-age\">as of ").count();
    assert!(cards >= 8 && ages == cards, "{ages} ages on {cards} cards");
    assert!(
        text_of(&dom, "error").contains("Cannot reach the gateway"),
        "{dom}"
    );
    assert_eq!(
        text_of(&dom, "devices-online"),
        "1",
        "the last figures stay"
    );
}
