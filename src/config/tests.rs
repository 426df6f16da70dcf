use super::*;
use std::io::Write;

fn load_str(toml: &str) -> Result<Config, ConfigError> {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(toml.as_bytes()).unwrap();
    Config::load(f.path())
}

#[test]
fn shipped_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/ferry.toml");
    let cfg = Config::load(&path).unwrap();
    assert_eq!(cfg.gateway.as_str(), "edge-01");
    assert_eq!(cfg.north.client_id, "ferry-edge-01");
    assert_eq!(cfg.store.sync, SyncMode::Full);
}

#[test]
fn unknown_key_is_named_with_its_section() {
    let err = load_str("[gateway]\nid = \"g\"\n[north]\nhots = \"x\"\n").unwrap_err();
    assert_eq!(err.key, "north.hots");
}

#[test]
fn unknown_section_is_named() {
    let err = load_str("[gateway]\nid = \"g\"\n[nort]\nhost = \"x\"\n").unwrap_err();
    assert_eq!(err.key, "nort");
}

#[test]
fn out_of_range_values_name_their_key() {
    let err = load_str("[gateway]\nid = \"g\"\n[retry]\njitter = 2.0\n").unwrap_err();
    assert_eq!(err.key, "retry.jitter");
    let err = load_str("[gateway]\nid = \"bad id\"\n").unwrap_err();
    assert_eq!(err.key, "gateway.id");
    let err = load_str("[gateway]\nid = \"g\"\n[south]\nlisten = \"nowhere\"\n").unwrap_err();
    assert_eq!(err.key, "south.listen");
    let err = load_str("[gateway]\nid = \"g\"\n[store]\nsync = \"off\"\n").unwrap_err();
    assert_eq!(err.key, "store.sync");
}

#[test]
fn groups_are_read_and_checked() {
    let cfg =
        load_str("[gateway]\nid = \"g\"\n[groups]\nline3 = [\"panel-1\", \"panel-2\"]\n").unwrap();
    assert_eq!(cfg.groups["line3"].len(), 2);
    let err = load_str("[gateway]\nid = \"g\"\n[groups]\nline3 = [\"bad id\"]\n").unwrap_err();
    assert_eq!(err.key, "groups.line3");
    let err = load_str("[gateway]\nid = \"g\"\n[downlink]\nbatch_size = 5000\n").unwrap_err();
    assert_eq!(err.key, "downlink.batch_size");
}

#[test]
fn wrong_type_names_its_key() {
    let err = load_str("[gateway]\nid = \"g\"\n[north]\nport = \"many\"\n").unwrap_err();
    assert_eq!(err.key, "north.port", "{err}");
}

#[test]
fn shutdown_grace_defaults_to_ten_seconds_and_is_checked() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.shutdown_grace, Duration::from_secs(10));
    let cfg = load_str("[gateway]\nid = \"g\"\n[shutdown]\ngrace_s = 30\n").unwrap();
    assert_eq!(cfg.shutdown_grace, Duration::from_secs(30));
    let err = load_str("[gateway]\nid = \"g\"\n[shutdown]\ngrace_s = 0\n").unwrap_err();
    assert_eq!(err.key, "shutdown.grace_s");
}

#[test]
fn south_mode_is_embedded_by_default_and_external_takes_the_site_broker() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.south.mode, SouthMode::Embedded);
    let cfg = load_str(
        "[gateway]\nid = \"g\"\n[south]\nmode = \"external\"\nhost = \"broker.line\"\nport = 8883\nusername = \"ferry\"\npassword = \"pw\"\n",
    )
    .unwrap();
    assert_eq!(
        cfg.south.mode,
        SouthMode::External(ExternalSouth {
            host: "broker.line".into(),
            port: 8883,
            client_id: "ferry-g-south".into(),
            credentials: Some(("ferry".into(), "pw".into())),
            keep_alive: Duration::from_secs(30),
        })
    );
}

#[test]
fn bad_south_mode_keys_are_named() {
    let err = load_str("[gateway]\nid = \"g\"\n[south]\nmode = \"bridge\"\n").unwrap_err();
    assert_eq!(err.key, "south.mode", "{err}");
    let err =
        load_str("[gateway]\nid = \"g\"\n[south]\nmode = \"external\"\nhost = \"\"\n").unwrap_err();
    assert_eq!(err.key, "south.host", "{err}");
    let err = load_str("[gateway]\nid = \"g\"\n[south]\nmode = \"external\"\npassword = \"pw\"\n")
        .unwrap_err();
    assert_eq!(err.key, "south.username", "{err}");
    let err = load_str("[gateway]\nid = \"g\"\n[south]\nmode = \"external\"\nkeep_alive_s = 1\n")
        .unwrap_err();
    assert_eq!(err.key, "south.keep_alive_s", "{err}");
}

#[test]
fn connect_timeout_defaults_to_five_seconds_and_is_checked() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.south.connect_timeout, Duration::from_secs(5));
    let err = load_str("[gateway]\nid = \"g\"\n[south]\nconnect_timeout_ms = 70000\n").unwrap_err();
    assert_eq!(err.key, "south.connect_timeout_ms", "{err}");
}

#[test]
fn input_limits_default_to_200_per_second_a_burst_of_400_and_256_in_flight() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(
        cfg.south.rate,
        RateLimit {
            per_s: 200.0,
            burst: 400
        }
    );
    assert_eq!(cfg.south.max_inflight_per_device, 256);
    let cfg = load_str(
        "[gateway]\nid = \"g\"\n[south]\nrate_per_s = 50\nburst = 10\nmax_inflight_per_device = 4\n",
    )
    .unwrap();
    assert_eq!(
        cfg.south.rate,
        RateLimit {
            per_s: 50.0,
            burst: 10
        }
    );
    assert_eq!(cfg.south.max_inflight_per_device, 4);
    let cfg = load_str("[gateway]\nid = \"g\"\n[south]\nrate_per_s = 0.5\n").unwrap();
    assert_eq!(cfg.south.rate.per_s, 0.5);
}

#[test]
fn input_limits_out_of_range_name_their_key_and_zero_is_no_off_switch() {
    for (line, key) in [
        ("rate_per_s = 0", "south.rate_per_s"),
        ("rate_per_s = -5.0", "south.rate_per_s"),
        ("rate_per_s = nan", "south.rate_per_s"),
        ("rate_per_s = inf", "south.rate_per_s"),
        ("rate_per_s = 2000000", "south.rate_per_s"),
        ("burst = 0", "south.burst"),
        (
            "max_inflight_per_device = 0",
            "south.max_inflight_per_device",
        ),
        (
            "max_inflight_per_device = 100000",
            "south.max_inflight_per_device",
        ),
    ] {
        let err = load_str(&format!("[gateway]\nid = \"g\"\n[south]\n{line}\n")).unwrap_err();
        assert_eq!(err.key, key, "{line}: {err}");
    }
    let err = load_str("[gateway]\nid = \"g\"\n[south]\nrate_per_s = 0\n").unwrap_err();
    assert!(err.reason.contains("no off switch"), "{err}");
}
