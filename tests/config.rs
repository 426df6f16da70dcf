//! The config file through the real binary and the real loader: `ferry
//! check-config`, `FERRY_*` environment overrides (the environment is the
//! process's, so not a unit test), and the harness's own config, which is
//! ferry's `RawConfig` serialized with `toml` and must load back as written.

use std::path::Path;

use ferry::config::{Config, RawConfig};

use crate::support::{self, check_config, config::to_toml, FerryOpts};

fn shipped() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/ferry.toml"))
}

fn check_with_env(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = support::ferry_command();
    cmd.arg("check-config").arg("--config").arg(shipped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("ferry runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_environment_override_is_checked_like_the_file() {
    let (code, stderr) = check_with_env(&[("FERRY_RETRY__JITTER", "5")]);
    assert_eq!(code, Some(64), "stderr: {stderr}");
    assert!(
        stderr.contains("retry.jitter"),
        "stderr must name retry.jitter: {stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}

#[test]
fn a_valid_environment_override_is_accepted() {
    let (code, stderr) = check_with_env(&[
        ("FERRY_NORTH__PORT", "8883"),
        ("FERRY_GATEWAY__DATA_DIR", "/var/lib/ferry"),
    ]);
    assert_eq!(code, Some(0), "stderr: {stderr}");
}

#[test]
fn north_endpoints_come_from_the_environment_comma_separated_and_are_checked_one_by_one() {
    let (code, stderr) =
        check_with_env(&[("FERRY_NORTH__ENDPOINTS", "a.plant:1883, [::1]:1884,b.plant")]);
    assert_eq!(code, Some(0), "stderr: {stderr}");
    let (code, stderr) = check_with_env(&[("FERRY_NORTH__ENDPOINTS", "a.plant:1883,b.plant:0")]);
    assert_eq!(code, Some(64), "stderr: {stderr}");
    assert!(
        stderr.contains("north.endpoints[1]"),
        "stderr must name the second endpoint: {stderr}"
    );
}

#[test]
fn an_unknown_environment_key_is_named() {
    let (code, stderr) = check_with_env(&[("FERRY_NORTH__HOTS", "x")]);
    assert_eq!(code, Some(64), "stderr: {stderr}");
    assert!(
        stderr.contains("north.hots"),
        "stderr must name north.hots: {stderr}"
    );
}

#[test]
fn a_missing_config_file_is_a_usage_error_not_a_panic() {
    let out = support::ferry_command()
        .args(["run", "--config", "/nonexistent/ferry.toml"])
        .output()
        .expect("ferry runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "stderr: {stderr}");
    assert!(
        stderr.contains("/nonexistent/ferry.toml") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// Without `-c`, a command reads the packaged `/etc/ferry/ferry.toml`:
/// checked when it is there, named when it is not.
#[test]
fn without_dash_c_the_packaged_config_is_the_one_read() {
    let out = support::ferry_command()
        .arg("check-config")
        .output()
        .expect("ferry runs");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if Path::new("/etc/ferry/ferry.toml").is_file() {
        assert!(
            out.status.code() == Some(0) || said.contains("/etc/ferry/ferry.toml"),
            "{said}"
        );
    } else {
        assert_eq!(out.status.code(), Some(64), "{said}");
        assert!(
            said.contains("/etc/ferry/ferry.toml is not a readable file"),
            "{said}"
        );
    }
}

/// `config` written as TOML and read back by ferry's own loader.
fn load_back(config: &RawConfig) -> RawConfig {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = support::write_file(dir.path(), "ferry.toml", &to_toml(config));
    RawConfig::load(&path).unwrap_or_else(|e| {
        panic!(
            "the serialized config does not load ({e}); is a FERRY_* variable set?\n{}",
            to_toml(config)
        )
    })
}

/// Two raw configs compared field by field (RawConfig has no PartialEq).
fn assert_same(loaded: &RawConfig, intended: &RawConfig) {
    let as_json = |c: &RawConfig| serde_json::to_value(c).expect("RawConfig serializes");
    assert_eq!(
        as_json(loaded),
        as_json(intended),
        "loaded back:\n{}\nintended:\n{}",
        to_toml(loaded),
        to_toml(intended)
    );
}

#[test]
fn the_serialized_default_and_harness_configs_load_back_as_written() {
    assert_same(&load_back(&RawConfig::default()), &RawConfig::default());

    let intended = FerryOpts::new("gw-round-trip", 18840)
        .with(|c| {
            c.south.listen = "127.0.0.1:18830".to_string();
            c.gateway.data_dir = "/var/lib/ferry".into();
            c.retry.jitter = 0.5;
            c.downlink.batch_size = 7;
            c.groups.insert(
                "line3".to_string(),
                vec!["panel-1".to_string(), "panel-2".to_string()],
            );
        })
        .config;
    let loaded = load_back(&intended);
    assert_same(&loaded, &intended);
    let checked = Config::from_raw(loaded).expect("the harness config passes the checks");
    assert_eq!(checked.gateway.to_string(), "gw-round-trip");
    assert_eq!(checked.south.listen.port(), 18830);
    assert_eq!(checked.north.endpoints[0].port, 18840);
    assert_eq!(checked.retry.jitter, 0.5);
    assert_eq!(checked.downlink.batch_size, 7);
    assert_eq!(checked.groups["line3"].len(), 2);
}

#[test]
fn check_config_accepts_the_shipped_config_and_the_test_config() {
    let text = std::fs::read_to_string(shipped()).expect("read conf/ferry.toml");
    let (code, stderr) = check_config(&text);
    assert_eq!(code, Some(0), "conf/ferry.toml: {stderr}");
    let (code, stderr) = check_config(&FerryOpts::new("gw-check", 1884).to_toml());
    assert_eq!(code, Some(0), "the harness's config: {stderr}");
}

#[test]
fn check_config_rejects_an_unknown_key_with_exit_64_naming_it() {
    let valid = FerryOpts::new("gw-check", 1884).to_toml();
    let mut file: toml::Table = valid.parse().expect("the harness writes TOML");
    file["north"]
        .as_table_mut()
        .expect("[north]")
        .insert("hots".to_string(), "x".into());
    let (code, stderr) = check_config(&file.to_string());
    assert_eq!(code, Some(64), "stderr: {stderr}");
    assert!(
        stderr.contains("north.hots"),
        "stderr must name north.hots: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "a panic is not an error message: {stderr}"
    );
}

#[test]
fn check_config_rejects_a_jitter_above_one_naming_it() {
    let bad = FerryOpts::new("gw-check", 1884)
        .with(|c| c.retry.jitter = 2.0)
        .to_toml();
    assert!(bad.contains("jitter = 2.0"), "{bad}");
    let (code, stderr) = check_config(&bad);
    assert!(
        code.is_some_and(|c| c != 0),
        "exit {code:?}, stderr: {stderr}"
    );
    assert!(
        stderr.contains("retry.jitter"),
        "stderr must name retry.jitter: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "a panic is not an error message: {stderr}"
    );
}

#[test]
fn check_config_names_every_problem_one_line_each() {
    // An unknown key, a quoted number, a range error in another section,
    // a whole number given as a fraction and a bad value checked only
    // after the file is read: five problems, five lines, one run.
    let bad = "[gateway]\nid = \"g\"\n\
               [south]\nport = \"1884\"\nmax_connections = 1.5\n\
               [north]\nhots = \"x\"\n\
               [retry]\njitter = 5.0\n\
               [store]\nsync = \"sometimes\"\n";
    let (code, stderr) = check_config(bad);
    assert_eq!(code, Some(64), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.trim().lines().collect();
    let keys = [
        "north.hots",
        "south.max_connections",
        "south.port",
        "retry.jitter",
        "store.sync",
    ];
    assert_eq!(lines.len(), keys.len(), "one line per problem: {stderr}");
    for key in keys {
        assert!(
            lines.iter().any(|l| l.contains(&format!("`{key}`"))),
            "a line names {key}: {stderr}"
        );
    }
    let port = lines.iter().find(|l| l.contains("south.port")).unwrap();
    assert!(
        port.contains("must be a number") && port.contains("without quotes"),
        "a quoted number is refused, not coerced: {port}"
    );
    assert!(
        lines.iter().all(|l| l.starts_with("ferry: ")),
        "every line is ferry's: {stderr}"
    );
}

#[test]
fn a_toml_syntax_error_is_one_line_with_its_position() {
    let (code, stderr) = check_config("[gateway]\nid = \"g\"\n[south\n");
    assert_eq!(code, Some(64), "stderr: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("line 3"), "the line is given: {stderr}");
}

#[test]
fn a_bad_environment_override_names_the_variable_not_the_file() {
    let (code, stderr) = check_with_env(&[
        ("FERRY_SOUTH__PROT", "1884"),
        ("FERRY_SOUTH__PORT", "abc"),
        ("FERRY_RETRY__JITTER", "7"),
        ("FERRY_SOTH__PORT", "1"),
    ]);
    assert_eq!(code, Some(64), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.trim().lines().collect();
    assert_eq!(lines.len(), 4, "one line per problem: {stderr}");
    for var in [
        "FERRY_SOUTH__PROT",
        "FERRY_SOUTH__PORT",
        "FERRY_RETRY__JITTER",
        "FERRY_SOTH__PORT",
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(&format!("set by the environment variable {var}:"))),
            "a line names {var}: {stderr}"
        );
    }
    // The file's own keys are not blamed on the environment.
    let (code, stderr) = check_config("[gateway]\nid = \"g\"\n[south]\nprot = 1\n");
    assert_eq!(code, Some(64), "stderr: {stderr}");
    assert!(!stderr.contains("environment"), "{stderr}");
}
