//! `[north]`: one endpoint or a list of them.

use super::*;

#[test]
fn north_host_and_port_are_one_endpoint_when_endpoints_is_empty() {
    let cfg =
        load_str("[gateway]\nid = \"g\"\n[north]\nhost = \"broker.plant\"\nport = 8883\n").unwrap();
    assert_eq!(
        cfg.north.endpoints,
        vec![Endpoint::new("broker.plant", 8883)]
    );
    assert_eq!(cfg.north.prefer_first, Some(Duration::from_secs(30)));
    let cfg = load_str("[gateway]\nid = \"g\"\n[north]\nhost = \"::1\"\n").unwrap();
    assert_eq!(cfg.north.endpoints, vec![Endpoint::new("::1", 1884)]);
}

#[test]
fn north_endpoints_are_read_in_order_with_north_port_for_those_without_one() {
    let cfg = load_str(
        "[gateway]\nid = \"g\"\n[north]\nport = 8883\nendpoints = [\"a.plant:1883\", \"b.plant\", \"[::1]:1884\", \"[fe80::1]\", \"10.0.0.7:1\"]\nprefer_first = false\n",
    )
    .unwrap();
    assert_eq!(
        cfg.north.endpoints,
        vec![
            Endpoint::new("a.plant", 1883),
            Endpoint::new("b.plant", 8883),
            Endpoint::new("::1", 1884),
            Endpoint::new("fe80::1", 8883),
            Endpoint::new("10.0.0.7", 1),
        ]
    );
    assert_eq!(cfg.north.prefer_first, None);
    let cfg = load_str(
        "[gateway]\nid = \"g\"\n[north]\nendpoints = [\"a:1\"]\nprefer_first_check_s = 5\n",
    )
    .unwrap();
    assert_eq!(cfg.north.prefer_first, Some(Duration::from_secs(5)));
}

#[test]
fn bad_north_endpoints_are_named_by_their_place_in_the_list() {
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"endpoints = ["a:1883", ":1883"]"#,
            "north.endpoints[1]",
            "host is empty",
        ),
        (r#"endpoints = ["a:0"]"#, "north.endpoints[0]", "port"),
        (r#"endpoints = ["a:70000"]"#, "north.endpoints[0]", "port"),
        (r#"endpoints = ["a:x"]"#, "north.endpoints[0]", "port"),
        (
            r#"endpoints = ["a:1883", "b", "A:1883"]"#,
            "north.endpoints[2]",
            "north.endpoints[0] again",
        ),
        (
            r#"endpoints = ["b", "b:1884"]"#,
            "north.endpoints[1]",
            "again",
        ),
        (
            r#"endpoints = ["::1:1883"]"#,
            "north.endpoints[0]",
            "brackets",
        ),
        (r#"endpoints = ["[::1:1883"]"#, "north.endpoints[0]", "`]`"),
        (
            r#"endpoints = ["[nope]:1883"]"#,
            "north.endpoints[0]",
            "IPv6",
        ),
        (
            r#"endpoints = ["[::1]1883"]"#,
            "north.endpoints[0]",
            ":port",
        ),
        (
            r#"endpoints = ["a b:1883"]"#,
            "north.endpoints[0]",
            "not a host",
        ),
        (r#"endpoints = [""]"#, "north.endpoints[0]", "empty"),
        (
            r#"endpoints = ["a:1"]
host = "broker.plant""#,
            "north.endpoints",
            "north.host",
        ),
        (
            r#"endpoints = ["a:1"]
prefer_first_check_s = 0"#,
            "north.prefer_first_check_s",
            "between",
        ),
        (
            "prefer_first_check_s = 100000",
            "north.prefer_first_check_s",
            "between",
        ),
        (
            r#"endpoints = ["a:1"]
port = 0"#,
            "north.port",
            "1..=65535",
        ),
    ];
    for (north, key, says) in cases {
        let err = load_str(&format!("[gateway]\nid = \"g\"\n[north]\n{north}\n")).unwrap_err();
        assert_eq!(err.key, *key, "{north}: {err}");
        assert!(err.reason.contains(says), "{north}: {err}");
    }
    let many: Vec<String> = (0..=MAX_ENDPOINTS)
        .map(|i| format!("\"n{i}:1883\""))
        .collect();
    let err = load_str(&format!(
        "[gateway]\nid = \"g\"\n[north]\nendpoints = [{}]\n",
        many.join(", ")
    ))
    .unwrap_err();
    assert_eq!(err.key, "north.endpoints", "{err}");
    assert!(err.reason.contains("at most 16"), "{err}");
}

#[test]
fn the_puback_timeout_is_30_s_by_default_and_a_bound_outside_its_range_names_its_key() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.north.puback_timeout, Duration::from_secs(30));
    let cfg = load_str("[gateway]\nid = \"g\"\n[north]\npuback_timeout_ms = 2500\n").unwrap();
    assert_eq!(cfg.north.puback_timeout, Duration::from_millis(2500));
    for bad in ["0", "999", "3600001"] {
        let err = load_str(&format!(
            "[gateway]\nid = \"g\"\n[north]\npuback_timeout_ms = {bad}\n"
        ))
        .unwrap_err();
        assert_eq!(err.key, "north.puback_timeout_ms", "{bad}: {err}");
    }
    let external = "[gateway]\nid = \"g\"\n[south]\nmode = \"external\"\n";
    let err = load_str(&format!("{external}puback_timeout_ms = 500\n")).unwrap_err();
    assert_eq!(err.key, "south.puback_timeout_ms", "{err}");
}
