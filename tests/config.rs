//! `ferry check-config` and `FERRY_*` environment overrides, through the
//! real binary (the environment is the process's, so not a unit test).

use crate::support;
use std::path::Path;

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
