//! `south.listeners`: several device listeners, each TCP or TLS with the
//! shared `[south.tls]`; every problem named by its place in the list.

use super::*;
use crate::config::RawListener;

fn listener(listen: &str, transport: &str) -> RawListener {
    RawListener {
        listen: listen.into(),
        transport: transport.into(),
        path: String::new(),
    }
}

fn on_path(listen: &str, transport: &str, path: &str) -> RawListener {
    RawListener {
        path: path.into(),
        ..listener(listen, transport)
    }
}

/// Every problem's key, in order.
fn keys(change: impl FnOnce(&mut RawConfig)) -> Vec<String> {
    let mut raw = RawConfig::default();
    raw.gateway.id = "g".into();
    change(&mut raw);
    match Config::from_raw(raw) {
        Ok(_) => Vec::new(),
        Err(e) => e.iter().map(|e| e.key.clone()).collect(),
    }
}

#[test]
fn one_listener_by_default_and_several_when_listed_tls_ones_with_south_tls() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.south.listeners.len(), 1);
    assert_eq!(cfg.south.listeners[0].listen, cfg.south.listen);
    assert!(!cfg.south.listeners[0].tls);

    let pem = test_pem();
    let cfg = with_raw(|c| {
        c.south.tls.cert = pem.cert.clone();
        c.south.tls.key = pem.key.clone();
        c.south.allow_anonymous = true;
        c.south.listeners = vec![
            listener("0.0.0.0:8883", "tls"),
            listener("127.0.0.1:1883", "tcp"),
        ];
    })
    .unwrap();
    let got: Vec<(String, bool)> = cfg
        .south
        .listeners
        .iter()
        .map(|l| (l.listen.to_string(), l.tls))
        .collect();
    assert_eq!(
        got,
        [
            ("0.0.0.0:8883".into(), true),
            ("127.0.0.1:1883".into(), false)
        ]
    );
    assert_eq!(cfg.south.listen.port(), 8883, "listen is the first");
    // The transport is "tcp" unless said; WebSocket on /mqtt unless said.
    let cfg = load_str(
        "[gateway]\nid = \"g\"\n[south]\nlisteners = [{ listen = \"127.0.0.1:1884\" }, \
         { listen = \"127.0.0.1:8080\", transport = \"ws\" }, \
         { listen = \"127.0.0.1:8081\", transport = \"ws\", path = \"/devices/mqtt\" }]\n",
    )
    .unwrap();
    let got: Vec<(bool, Option<&str>)> = cfg
        .south
        .listeners
        .iter()
        .map(|l| (l.tls, l.ws_path.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (false, None),
            (false, Some("/mqtt")),
            (false, Some("/devices/mqtt"))
        ]
    );
}

#[test]
fn bad_listeners_are_named_by_their_place_in_the_list() {
    let got = keys(|c| {
        c.south.listen = "127.0.0.1:1999".into();
        c.south.listeners = vec![
            listener("nowhere", "tcp"),
            listener("127.0.0.1:1884", "tls"),
            listener("127.0.0.1:1885", "wss"),
            listener("127.0.0.1:1886", "quic"),
            listener("127.0.0.1:1887", "tcp"),
            listener("127.0.0.1:1887", "tcp"),
            on_path("127.0.0.1:1888", "tcp", "/mqtt"),
            on_path("127.0.0.1:1889", "ws", "mqtt"),
        ];
    });
    assert_eq!(
        got,
        [
            "south.listen",
            "south.listeners[0].listen",
            "south.listeners[1].transport",
            "south.listeners[2].transport",
            "south.listeners[3].transport",
            "south.listeners[5].listen",
            "south.listeners[6].path",
            "south.listeners[7].path",
        ]
    );
    let pem = test_pem();
    let got = keys(|c| {
        c.south.tls.cert = pem.cert.clone();
        c.south.tls.key = pem.key.clone();
        c.south.listeners = vec![listener("127.0.0.1:1884", "tcp")];
    });
    assert_eq!(got, ["south.tls.cert"], "TLS set for no listener");
    let got = keys(|c| {
        c.south.mode = "external".into();
        c.south.listeners = vec![listener("127.0.0.1:1884", "tcp")];
    });
    assert_eq!(got, ["south.listeners"], "embedded mode only");
}

#[test]
fn an_open_listener_off_loopback_is_refused_though_another_requires_certificates() {
    let pem = test_pem();
    let tls_only = |c: &mut RawConfig| {
        c.south.tls.cert = pem.cert.clone();
        c.south.tls.key = pem.key.clone();
        c.south.tls.client_ca = pem.ca.clone();
        c.south.listeners = vec![listener("0.0.0.0:8883", "tls")];
    };
    assert_eq!(
        keys(tls_only),
        Vec::<String>::new(),
        "certificates prove ids"
    );
    let got = keys(|c| {
        tls_only(c);
        c.south.listeners.push(listener("0.0.0.0:1883", "tcp"));
    });
    assert_eq!(got, ["south.auth"], "plain TCP off loopback with auth none");
    let got = keys(|c| {
        tls_only(c);
        c.south.listeners.push(listener("127.0.0.1:1883", "tcp"));
    });
    assert_eq!(got, Vec::<String>::new(), "plain TCP on loopback");
}

#[test]
fn plain_down_is_one_topic_per_device_in_embedded_mode_only() {
    let cfg =
        load_str("[gateway]\nid = \"g\"\n[south]\nplain_down = \"plant/cmd/{device}\"\n").unwrap();
    let down = cfg.south.plain_down.expect("set");
    assert_eq!(
        down.topic(&crate::ids::DeviceId::new("press-7").unwrap()),
        "plant/cmd/press-7"
    );
    assert!(load_str("[gateway]\nid = \"g\"\n")
        .unwrap()
        .south
        .plain_down
        .is_none());
    for bad in [
        "plant/cmd/+",
        "plant/cmd",
        "devices/{device}",
        "$x/{device}",
    ] {
        assert_eq!(
            keys(|c| c.south.plain_down = Some(bad.into())),
            ["south.plain_down"],
            "{bad}"
        );
    }
    let external = keys(|c| {
        c.south.mode = "external".into();
        c.south.plain_down = Some("plant/cmd/{device}".into());
    });
    assert!(
        external.contains(&"south.plain_down".to_string()),
        "{external:?}"
    );
}
