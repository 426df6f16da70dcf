//! `ferry passwd` and the password file's owner, group and mode: a new
//! file is 0640 with group `ferry` when that group exists (so the service,
//! `Group=ferry`, can read it), an existing one keeps what it had.
//!
//! Whether a group `ferry` exists is the host's /etc/group; each test runs
//! the real binary in a mount namespace of its own (`unshare -m`) where
//! /etc/group is a file the test wrote, so the host's is never changed.
//! Needs root (a mount namespace, chown to another user), as on CI.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::support::ferry_binary;

/// A gid no host is likely to use for anything else.
const FERRY_GID: u32 = 46_251;

/// Runs `ferry passwd FILE press-7` with the password on stdin, seeing
/// `group_file` as /etc/group; as the user and group `as_user` when given.
fn passwd_with_groups(group_file: &Path, file: &Path, as_user: Option<u32>) -> Output {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the password file tests mount a private /etc/group (unshare -m): run them as root \
         (sudo -E cargo test --test tests passwd_file)"
    );
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-m",
        "sh",
        "-c",
        r#"mount --bind "$0" /etc/group && exec "$@""#,
    ])
    .arg(group_file);
    if let Some(id) = as_user {
        cmd.arg("setpriv")
            .arg(format!("--reuid={id}"))
            .arg(format!("--regid={id}"))
            .arg("--clear-groups");
    }
    cmd.arg(ferry_binary())
        .arg("passwd")
        .arg(file)
        .arg("press-7")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!("unshare ({e}): util-linux's unshare and setpriv are in every Debian install")
    });
    child.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "ferry passwd: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// An /etc/group with root, and `ferry` at [`FERRY_GID`] when `with_ferry`.
fn groups(dir: &Path, with_ferry: bool) -> std::path::PathBuf {
    let path = dir.join("group");
    let mut text = String::from("root:x:0:\nnogroup:x:65534:\n");
    if with_ferry {
        text.push_str(&format!("ferry:x:{FERRY_GID}:\n"));
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn owner_group_mode(path: &Path) -> (u32, u32, u32) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.uid(), meta.gid(), meta.permissions().mode() & 0o7777)
}

#[test]
fn a_new_password_file_is_0640_with_group_ferry_when_that_group_exists() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    let out = passwd_with_groups(&groups(dir.path(), true), &file, None);
    assert_eq!(owner_group_mode(&file), (0, FERRY_GID, 0o640));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("note:"), "nothing to note: {said}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("press-7:"), "{text}");
}

#[test]
fn without_a_ferry_group_a_new_password_file_is_0640_with_the_callers_group() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    let out = passwd_with_groups(&groups(dir.path(), false), &file, None);
    assert_eq!(owner_group_mode(&file), (0, 0, 0o640));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note:"));
}

#[test]
fn a_user_outside_group_ferry_gets_the_file_and_one_line_saying_the_service_cannot_read_it() {
    let dir = tempfile::tempdir().unwrap();
    let group_file = groups(dir.path(), true);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    let file = home.join("passwd");
    let out = passwd_with_groups(&group_file, &file, Some(65534));
    assert_eq!(owner_group_mode(&file), (65534, 65534, 0o640));
    let said = String::from_utf8_lossy(&out.stderr);
    let notes: Vec<&str> = said.lines().filter(|l| l.contains("note:")).collect();
    assert_eq!(notes.len(), 1, "one note: {said}");
    assert!(
        notes[0].contains("not in group ferry") && notes[0].contains("sudo chgrp ferry"),
        "the note says what is wrong and the fix: {said}"
    );
}

#[test]
fn an_existing_password_file_keeps_its_owner_group_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    std::fs::write(&file, "").unwrap();
    std::os::unix::fs::chown(&file, Some(4321), Some(4322)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o604)).unwrap();
    passwd_with_groups(&groups(dir.path(), true), &file, None);
    assert_eq!(owner_group_mode(&file), (4321, 4322, 0o604));
    assert!(std::fs::read_to_string(&file)
        .unwrap()
        .starts_with("press-7:"));
}
