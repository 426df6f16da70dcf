use super::*;
use std::io::Write;

/// The config `toml`, or its first problem.
fn load_str(toml: &str) -> Result<Config, ConfigError> {
    load_all(toml).map_err(|e| e.first().clone())
}

/// The config `toml`, or every problem it has.
fn load_all(toml: &str) -> Result<Config, ConfigErrors> {
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
            puback_timeout: Duration::from_secs(30),
            mqtt_version: MqttVersion::V311,
            tls: None,
        })
    );
}

#[test]
fn mqtt_version_is_3_1_1_by_default_5_on_request_and_anything_else_names_its_key() {
    let external = "[gateway]\nid = \"g\"\n[south]\nmode = \"external\"\n";
    let cfg = load_str(external).unwrap();
    assert_eq!(cfg.north.mqtt_version, MqttVersion::V311);
    let SouthMode::External(site) = &cfg.south.mode else {
        panic!("external mode");
    };
    assert_eq!(site.mqtt_version, MqttVersion::V311);

    let cfg = load_str(&format!(
        "{external}mqtt_version = \"5\"\n[north]\nmqtt_version = \"5\"\n"
    ))
    .unwrap();
    assert_eq!(cfg.north.mqtt_version, MqttVersion::V5);
    let SouthMode::External(site) = &cfg.south.mode else {
        panic!("external mode");
    };
    assert_eq!(site.mqtt_version, MqttVersion::V5);

    let err = load_str(&format!("{external}mqtt_version = \"5.0\"\n")).unwrap_err();
    assert_eq!(err.key, "south.mqtt_version", "{err}");
    assert!(err.to_string().contains("\"3.1.1\" or \"5\""), "{err}");
    let err = load_str("[gateway]\nid = \"g\"\n[north]\nmqtt_version = \"3\"\n").unwrap_err();
    assert_eq!(err.key, "north.mqtt_version", "{err}");
    // The embedded broker takes each device's own version.
    let err = load_str("[gateway]\nid = \"g\"\n[south]\nmqtt_version = \"5\"\n").unwrap_err();
    assert_eq!(err.key, "south.mqtt_version", "{err}");
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
fn device_auth_keys_are_checked_by_mode_and_listener() {
    let base = "[gateway]\nid = \"g\"\n[south]\n";
    // Defaults: anonymous devices, on loopback only.
    let cfg = load_str(base).unwrap();
    assert_eq!(cfg.south.auth, SouthAuth::None);
    assert!(cfg.south.listen.ip().is_loopback());

    let cases = [
        ("listen = \"0.0.0.0:1883\"\n", "south.auth"),
        ("listen = \"10.1.2.3:1883\"\n", "south.auth"),
        ("auth = \"cert\"\n", "south.auth"),
        ("auth = \"password\"\n", "south.password_file"),
        (
            "auth = \"password\"\npassword_file = \"/nonexistent/pw\"\n",
            "south.password_file",
        ),
        ("password_file = \"/etc/passwd\"\n", "south.password_file"),
        ("mode = \"external\"\nauth = \"password\"\n", "south.auth"),
        (
            "mode = \"external\"\npassword_file = \"/x\"\n",
            "south.password_file",
        ),
    ];
    for (keys, key) in cases {
        let err = load_str(&format!("{base}{keys}")).unwrap_err();
        assert_eq!(err.key, key, "{keys}: {err}");
    }
    let cfg = load_str(&format!(
        "{base}listen = \"0.0.0.0:1883\"\nallow_anonymous = true\n"
    ))
    .unwrap();
    assert_eq!(cfg.south.auth, SouthAuth::None);

    let mut pw = tempfile::NamedTempFile::new().unwrap();
    let hash = super::passwords::hash_password("x").unwrap();
    writeln!(pw, "press-7:{hash}").unwrap();
    let path = pw.path().display().to_string();
    let cfg = load_str(&format!(
        "{base}listen = \"0.0.0.0:1883\"\nauth = \"password\"\npassword_file = \"{path}\"\n"
    ))
    .unwrap();
    assert_eq!(
        cfg.south.auth,
        SouthAuth::Password {
            file: pw.path().to_owned()
        }
    );
    // A file that does not parse names the key and the line.
    writeln!(pw, "no hash here").unwrap();
    let err = load_str(&format!(
        "{base}auth = \"password\"\npassword_file = \"{path}\"\n"
    ))
    .unwrap_err();
    assert_eq!(err.key, "south.password_file");
    assert!(err.reason.contains("line 2"), "{err}");
}

/// A CA-signed server certificate and key, and another key, as PEM files.
struct TestPem {
    dir: tempfile::TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    other_key: PathBuf,
}

fn test_pem() -> TestPem {
    let dir = tempfile::tempdir().unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    TestPem {
        ca: write("ca.pem", ca.pem()),
        cert: write("cert.pem", cert.pem()),
        key: write("key.pem", key.serialize_pem()),
        other_key: write(
            "other.key",
            rcgen::KeyPair::generate().unwrap().serialize_pem(),
        ),
        dir,
    }
}

fn with_raw(change: impl FnOnce(&mut RawConfig)) -> Result<Config, ConfigError> {
    let mut raw = RawConfig::default();
    raw.gateway.id = "g".into();
    change(&mut raw);
    Config::from_raw(raw).map_err(|e| e.first().clone())
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

#[test]
fn log_format_is_text_or_json() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.log_format, LogFormat::Text);
    let cfg = load_str("[gateway]\nid = \"g\"\n[log]\nformat = \"json\"\n").unwrap();
    assert_eq!(cfg.log_format, LogFormat::Json);
    let err = load_str("[gateway]\nid = \"g\"\n[log]\nformat = \"xml\"\n").unwrap_err();
    assert_eq!(err.key, "log.format");
}

#[test]
fn store_budget_and_retention_default_and_name_their_keys() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.store.max_db_bytes, 8 << 30);
    assert_eq!(cfg.store.retention, Duration::from_secs(30 * 86_400));
    assert_eq!(
        cfg.store.dead_letter_retention,
        Duration::from_secs(90 * 86_400)
    );
    for (toml, key) in [
        ("max_db_bytes = 1000", "store.max_db_bytes"),
        ("max_db_bytes = 0", "store.max_db_bytes"),
        ("retention_days = 0", "store.retention_days"),
        (
            "dead_letter_retention_days = 0",
            "store.dead_letter_retention_days",
        ),
        (
            "dead_letter_retention_days = 40000",
            "store.dead_letter_retention_days",
        ),
    ] {
        let err = load_str(&format!("[gateway]\nid = \"g\"\n[store]\n{toml}\n")).unwrap_err();
        assert_eq!(err.key, key, "{toml}: {err}");
    }
    let cfg =
        load_str("[gateway]\nid = \"g\"\n[store]\nmax_db_bytes = 1048576\nretention_days = 1\n")
            .unwrap();
    assert_eq!(cfg.store.max_db_bytes, 1 << 20);
    assert_eq!(cfg.store.retention, Duration::from_secs(86_400));
}

#[test]
fn alert_thresholds_default_and_name_their_keys() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.alerts.north_down, Duration::from_secs(300));
    assert_eq!(cfg.alerts.backlog_age, Duration::from_secs(3600));
    let err = load_str("[gateway]\nid = \"g\"\n[alerts]\nnorth_down_s = 0\n").unwrap_err();
    assert_eq!(err.key, "alerts.north_down_s");
    let err = load_str("[gateway]\nid = \"g\"\n[alerts]\nbacklog_age_s = 0\n").unwrap_err();
    assert_eq!(err.key, "alerts.backlog_age_s");
    let err = load_str("[gateway]\nid = \"g\"\n[alerts]\nbackend_silent_s = 0\n").unwrap_err();
    assert_eq!(err.key, "alerts.backend_silent_s");
    let err = load_str("[gateway]\nid = \"g\"\n[alerts]\nbacklog = 5\n").unwrap_err();
    assert_eq!(err.key, "alerts.backlog");
}

mod listeners;
mod north;
mod sparkplug;
mod tls;

#[test]
fn every_problem_is_named_not_only_the_first() {
    let err = load_all(
        "[gateway]\nid = \"bad id\"\n[south]\nburst = 0\n[north]\nmax_inflight = 0\n[shutdown]\ngrace_s = 0\n",
    )
    .unwrap_err();
    let keys: Vec<&str> = err.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "gateway.id",
            "south.burst",
            "north.max_inflight",
            "shutdown.grace_s"
        ]
    );
    assert_eq!(err.to_string().lines().count(), 4, "{err}");
}

#[test]
fn a_quoted_number_or_a_fraction_for_a_count_is_refused() {
    let err = load_str("[gateway]\nid = \"g\"\n[north]\nport = \"1883\"\n").unwrap_err();
    assert_eq!(err.key, "north.port");
    assert!(err.reason.contains("without quotes"), "{err}");
    let err = load_str("[gateway]\nid = \"g\"\n[downlink]\nbatch_size = 2.5\n").unwrap_err();
    assert_eq!(err.key, "downlink.batch_size");
    assert!(err.reason.contains("whole number"), "{err}");
    // A fraction where one is meant is fine; so is a whole number there.
    load_str("[gateway]\nid = \"g\"\n[south]\nrate_per_s = 50\n").unwrap();
}

#[test]
fn a_refused_key_leaves_the_others_checked_against_their_defaults() {
    // The bad port is named; its default stands in, so nothing else is.
    let err = load_all("[gateway]\nid = \"g\"\n[south]\nport = \"x\"\n").unwrap_err();
    assert_eq!(err.iter().count(), 1, "{err}");
}

#[test]
fn north_batches_are_off_by_default_and_their_bounds_name_their_keys() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert_eq!(cfg.north.batch_max, 1, "no batches unless asked");
    let cfg =
        load_str("[gateway]\nid = \"g\"\n[north]\nbatch_max = 50\nbatch_linger_ms = 0\n").unwrap();
    assert_eq!(cfg.north.batch_max, 50);
    assert_eq!(cfg.north.batch_linger, std::time::Duration::ZERO);
    for (line, key) in [
        ("batch_max = 0", "north.batch_max"),
        ("batch_max = 1001", "north.batch_max"),
        ("batch_linger_ms = 10001", "north.batch_linger_ms"),
    ] {
        let err = load_str(&format!("[gateway]\nid = \"g\"\n[north]\n{line}\n")).unwrap_err();
        assert_eq!(err.key, key, "{line}: {err}");
    }
}
