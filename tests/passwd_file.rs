//! `ferry passwd` and the password file's owner, group and mode: a new
//! file is 0640 with group `ferry` when that group exists (so the service,
//! `Group=ferry`, can read it), an existing one keeps what it had.
//!
//! Whether a group `ferry` exists is the host's /etc/group; each of those
//! tests runs the real binary in a mount namespace of its own (`unshare
//! -m`) where /etc/group is a file the test wrote, so the host's is never
//! changed. They need root (a mount namespace, chown to another user), as
//! on CI: they are the `system-tests` feature's.
//!
//! Then concurrent runs on one file (a provisioning script's `xargs -P`):
//! every run that says "set" really set it, and a run that cannot get the
//! file's lock in time says so and changes nothing. These run the binary
//! as they are, and check the file with the gateway's own
//! [`passwords::load`] and [`passwords::verify_in`].

use std::io::Write;
use std::os::fd::AsRawFd;
#[cfg(feature = "system-tests")]
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
#[cfg(feature = "system-tests")]
use std::process::Command;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use ferry::config::passwords;
use ferry::ids::DeviceId;

#[cfg(feature = "system-tests")]
use crate::support::ferry_binary;
use crate::support::ferry_command;

/// A gid no host is likely to use for anything else.
#[cfg(feature = "system-tests")]
const FERRY_GID: u32 = 46_251;

/// Runs `ferry passwd FILE press-7` with the password on stdin, seeing
/// `group_file` as /etc/group; as the user and group `as_user` when given.
#[cfg(feature = "system-tests")]
fn passwd_with_groups(group_file: &Path, file: &Path, as_user: Option<u32>) -> Output {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the password file tests mount a private /etc/group (unshare -m): run them as root \
         (sudo -E cargo test --features system-tests --test tests passwd_file)"
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
#[cfg(feature = "system-tests")]
fn groups(dir: &Path, with_ferry: bool) -> std::path::PathBuf {
    let path = dir.join("group");
    let mut text = String::from("root:x:0:\nnogroup:x:65534:\n");
    if with_ferry {
        text.push_str(&format!("ferry:x:{FERRY_GID}:\n"));
    }
    std::fs::write(&path, text).unwrap();
    path
}

#[cfg(feature = "system-tests")]
fn owner_group_mode(path: &Path) -> (u32, u32, u32) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.uid(), meta.gid(), meta.permissions().mode() & 0o7777)
}

#[cfg(feature = "system-tests")]
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

#[cfg(feature = "system-tests")]
#[test]
fn without_a_ferry_group_a_new_password_file_is_0640_with_the_callers_group() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    let out = passwd_with_groups(&groups(dir.path(), false), &file, None);
    assert_eq!(owner_group_mode(&file), (0, 0, 0o640));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note:"));
}

#[cfg(feature = "system-tests")]
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

#[cfg(feature = "system-tests")]
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

/// Starts `ferry passwd FILE DEVICE` with `password` on stdin (a pipe, as
/// a provisioning script gives it).
fn start_passwd(file: &Path, device: &str, password: &str) -> Child {
    let mut child = ferry_command()
        .arg("passwd")
        .arg(file)
        .arg(device)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(format!("{password}\n").as_bytes()).unwrap();
    child
}

/// Runs every `(device, password)` at once on `file`; each run's output.
fn passwd_all_at_once(file: &Path, runs: &[(String, String)]) -> Vec<Output> {
    let children: Vec<Child> = runs
        .iter()
        .map(|(device, password)| start_passwd(file, device, password))
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

/// Whether `password` verifies against `device`'s line, as the gateway
/// checks a CONNECT.
fn verifies(table: &passwords::Table, device: &str, password: &str) -> bool {
    table
        .get(&DeviceId::new(device).unwrap())
        .is_some_and(|hash| passwords::verify_in(&mut Vec::new(), password.as_bytes(), hash))
}

/// Every run exited 0 saying "set", and what it set is in the file: the
/// runs that did not, and those that said "set" but whose password does
/// not verify, are listed.
fn assert_each_set_what_it_said(file: &Path, runs: &[(String, String)], outputs: &[Output]) {
    let table = passwords::load(file).unwrap();
    let mut failed = Vec::new();
    let mut lost = Vec::new();
    for ((device, password), out) in runs.iter().zip(outputs) {
        let said = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || !said.contains(&format!("password for {device} set")) {
            failed.push(format!("{device}: {}: {}", out.status, said.trim()));
        } else if !verifies(&table, device, password) {
            lost.push(device.clone());
        }
    }
    assert!(
        failed.is_empty() && lost.is_empty(),
        "{} runs failed: {failed:#?}\n{} said \"set\" but their password does not verify: {lost:?}",
        failed.len(),
        lost.len()
    );
}

#[test]
fn twenty_parallel_runs_on_one_file_each_set_their_own_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    std::fs::write(&file, "# provisioned by the line script\n").unwrap();
    let runs: Vec<(String, String)> = (0..20)
        .map(|n| (format!("dev-{n}"), format!("secret-of-dev-{n}")))
        .collect();
    let outputs = passwd_all_at_once(&file, &runs);
    assert_each_set_what_it_said(&file, &runs, &outputs);

    assert_eq!(passwords::load(&file).unwrap().len(), 20);
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with("# provisioned by the line script\n"),
        "{text}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "passwd" && name != "passwd.lock")
        .collect();
    assert!(left.is_empty(), "no temporary file left behind: {left:?}");
}

#[test]
fn ten_parallel_rotations_each_leave_only_the_new_password_working() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    let mut text = String::new();
    for n in 0..10 {
        let hash = passwords::hash_password(&format!("old-{n}")).unwrap();
        text.push_str(&format!("rot-{n}:{hash}\n"));
    }
    let kept = passwords::hash_password("untouched").unwrap();
    text.push_str(&format!("bystander:{kept}\n"));
    std::fs::write(&file, text).unwrap();

    let runs: Vec<(String, String)> = (0..10)
        .map(|n| (format!("rot-{n}"), format!("new-{n}")))
        .collect();
    let outputs = passwd_all_at_once(&file, &runs);
    assert_each_set_what_it_said(&file, &runs, &outputs);

    let table = passwords::load(&file).unwrap();
    assert_eq!(table.len(), 11);
    for n in 0..10 {
        let device = format!("rot-{n}");
        assert!(
            verifies(&table, &device, &format!("new-{n}")),
            "{device}: the new one"
        );
        assert!(
            !verifies(&table, &device, &format!("old-{n}")),
            "{device}: not the old one"
        );
    }
    assert!(verifies(&table, "bystander", "untouched"));
}

#[test]
fn a_run_that_cannot_get_the_lock_in_time_changes_nothing_and_names_the_lock_and_its_holder() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    let before = format!("keep:{}\n", passwords::hash_password("kept").unwrap());
    std::fs::write(&file, &before).unwrap();
    let lock_path = dir.path().join("passwd.lock");
    let lock = std::fs::File::create(&lock_path).unwrap();
    // SAFETY: flock(2) on a descriptor `lock` owns and keeps open.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);

    let started = Instant::now();
    let out = start_passwd(&file, "keep", "taken-over")
        .wait_with_output()
        .unwrap();
    let waited = started.elapsed();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(!said.contains("password for keep set"), "{said}");
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(30),
        "it waited the bound, then gave up: {waited:?}"
    );
    let line = said
        .lines()
        .find(|l| l.contains(&*lock_path.to_string_lossy()))
        .unwrap_or_else(|| panic!("a line names {}: {said}", lock_path.display()));
    assert!(
        line.contains(&format!("pid {}", std::process::id())),
        "it names the holder: {line}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
    drop(lock);
}
