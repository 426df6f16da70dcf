//! `[south.sparkplug]`: off by default, a host id that is one topic level,
//! and no host without Sparkplug on.

use super::*;

#[test]
fn sparkplug_is_off_unless_enabled_and_follows_the_host_named() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.sparkplug, None);
    let cfg = load_str("[gateway]\nid = \"g\"\n[south.sparkplug]\nenabled = true\n").unwrap();
    assert_eq!(cfg.sparkplug.unwrap().state_topic(), None);
    let cfg =
        load_str("[gateway]\nid = \"g\"\n[south.sparkplug]\nenabled = true\nhost_id = \"scada\"\n")
            .unwrap();
    assert_eq!(
        cfg.sparkplug.unwrap().state_topic().as_deref(),
        Some("spBv1.0/STATE/scada")
    );
}

#[test]
fn a_bad_host_id_or_one_without_sparkplug_names_its_key() {
    for (toml, why) in [
        ("enabled = true\nhost_id = \"a/b\"", "one topic level"),
        ("enabled = true\nhost_id = \"\"", "empty"),
        ("enabled = true\nhost_id = \"s+\"", "`+`"),
        ("host_id = \"scada\"", "enabled is false"),
    ] {
        let err = load_str(&format!(
            "[gateway]\nid = \"g\"\n[south.sparkplug]\n{toml}\n"
        ))
        .unwrap_err();
        assert_eq!(err.key, "south.sparkplug.host_id", "{toml}");
        assert!(err.reason.contains(why), "{toml}: {}", err.reason);
    }
    let err = load_str("[gateway]\nid = \"g\"\n[south.sparkplug]\nenable = true\n").unwrap_err();
    assert!(err.key.contains("sparkplug"), "{}", err.key);
}
