//! docs/OPERATIONS.md's "Install from source", run as written (without
//! `sudo`, the build, the editor and systemctl, with the binary under
//! test for target/release/ferry) in a mount namespace where /etc,
//! /var/lib, /usr/local/bin and /usr/share/doc are this test's own
//! directories, so nothing is installed on the host. Then: the unit it
//! installed verifies with its ExecStart on the installed binary, its
//! Documentation= files are there, the config is root:ferry 0640 with
//! the store where the unit's StateDirectory is, `ferry status` looks
//! there, and `ferry passwd` as the docs say makes a file the service's
//! group can read.
//!
//! Needs root (a mount namespace, chown), like tests/package.rs.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::ferry_binary;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The first ```sh block after "## Install from source", one command a
/// line (backslash continuations joined), without what cannot run here.
fn documented_commands() -> Vec<String> {
    let doc = std::fs::read_to_string(repo().join("docs/OPERATIONS.md")).unwrap();
    let section = doc
        .split_once("\n## Install from source\n")
        .expect("OPERATIONS.md has an Install from source section")
        .1;
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .expect("a ```sh block in Install from source")
        .0;
    let mut commands = Vec::new();
    let mut line = String::new();
    for part in block.lines() {
        match part.strip_suffix('\\') {
            Some(head) => line.push_str(head),
            None => {
                line.push_str(part);
                commands.push(std::mem::take(&mut line));
            }
        }
    }
    let skipped = ["cargo build", "sudoedit", "sudo systemctl"];
    commands
        .into_iter()
        .filter(|c| !skipped.iter().any(|s| c.starts_with(s)))
        .map(|c| {
            c.replace("target/release/ferry", &ferry_binary().to_string_lossy())
                .replace("sudo ", "")
        })
        .collect()
}

/// The scratch directories mounted over the host's.
struct Scratch {
    _dir: tempfile::TempDir,
    etc: PathBuf,
    var_lib: PathBuf,
    local_bin: PathBuf,
    doc: PathBuf,
    no_systemd: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let scratch = Scratch {
            etc: path("etc"),
            var_lib: path("var-lib"),
            local_bin: path("usr-local-bin"),
            doc: path("usr-share-doc"),
            no_systemd: path("run-systemd"),
            _dir: dir,
        };
        let copied = Command::new("cp")
            .arg("-a")
            .arg("/etc")
            .arg(&scratch.etc)
            .status()
            .unwrap();
        assert!(copied.success(), "cp -a /etc");
        // A box that never had ferry: a host where the package was
        // installed has a user and group ferry; not this copy of its /etc.
        for db in ["passwd", "group", "shadow", "gshadow"] {
            let file = scratch.etc.join(db);
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            let kept: String = text
                .lines()
                .filter(|l| l.split(':').next() != Some("ferry"))
                .map(|l| format!("{l}\n"))
                .collect();
            std::fs::write(&file, kept).unwrap();
        }
        for d in [
            &scratch.var_lib,
            &scratch.local_bin,
            &scratch.doc,
            &scratch.no_systemd,
        ] {
            std::fs::create_dir(d).unwrap();
        }
        scratch
    }

    /// `script` run by sh in the repository, in the namespace, with
    /// `stdin`; its (status, stdout + stderr).
    fn run(&self, script: &str, stdin: &str) -> (bool, String) {
        let mounts = concat!(
            r#"mount --bind "$1" /etc && mount --bind "$2" /var/lib && "#,
            r#"mount --bind "$3" /usr/local/bin && mount --bind "$4" /usr/share/doc && "#,
            r#"{ [ ! -d /run/systemd ] || mount --bind "$5" /run/systemd; } && "#,
            r#"exec sh -ec "$0""#,
        );
        let mut child = Command::new("unshare")
            .args(["-m", "sh", "-c", mounts])
            .arg(script)
            .args([
                &self.etc,
                &self.var_lib,
                &self.local_bin,
                &self.doc,
                &self.no_systemd,
            ])
            .current_dir(repo())
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("unshare ({e}): util-linux's unshare, run as root"));
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), said)
    }
}

fn field(etc: &Path, db: &str, name: &str, n: usize) -> Option<String> {
    std::fs::read_to_string(etc.join(db))
        .unwrap()
        .lines()
        .map(|l| l.split(':').map(str::to_string).collect::<Vec<_>>())
        .find(|f| f[0] == name)
        .map(|f| f[n - 1].clone())
}

#[test]
fn the_documented_source_install_gives_a_unit_config_and_store_that_agree() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the source install test mounts over /etc and chowns: run it as root"
    );
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let scratch = Scratch::new();
    // A box that never had ferry (Scratch::new took it out of the copy).
    assert!(field(&scratch.etc, "passwd", "ferry", 1).is_none());
    let commands = documented_commands();
    assert!(
        commands.iter().any(|c| c.starts_with("useradd")),
        "{commands:?}"
    );
    let (ok, said) = scratch.run(&commands.join("\n"), "");
    assert!(ok, "the documented commands failed:\n{said}");
    assert!(
        said.contains("/etc/ferry/ferry.toml: ok"),
        "check-config: {said}"
    );

    // The user and the config, as the unit needs them.
    let gid: u32 = field(&scratch.etc, "group", "ferry", 3)
        .expect("useradd made the group ferry")
        .parse()
        .unwrap();
    let conf = scratch.etc.join("ferry/ferry.toml");
    let meta = std::fs::metadata(&conf).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.permissions().mode() & 0o777),
        (0, gid, 0o640),
        "the config is root:ferry 0640"
    );
    let config = std::fs::read_to_string(&conf).unwrap();
    assert!(
        config.lines().any(|l| l == "data_dir = \"/var/lib/ferry\""),
        "the installed config keeps its store where the unit's StateDirectory is"
    );

    // The unit as installed, verified with its ExecStart on the
    // installed binary (the real path is only inside the namespace).
    let unit = std::fs::read_to_string(scratch.etc.join("systemd/system/ferry.service")).unwrap();
    for doc in unit
        .lines()
        .filter_map(|l| l.strip_prefix("Documentation="))
        .flat_map(str::split_whitespace)
    {
        let path = doc
            .strip_prefix("file:///usr/share/doc/")
            .unwrap_or_else(|| panic!("Documentation={doc} is under /usr/share/doc"));
        assert!(
            scratch.doc.join(path).exists(),
            "the unit's Documentation={doc} is not installed by the documented commands"
        );
    }
    let binary = scratch.local_bin.join("ferry");
    assert_eq!(
        std::fs::metadata(&binary).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let copy = scratch.var_lib.join("ferry.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/local/bin/ferry", &binary.to_string_lossy()),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze: apt-get install systemd (scripts/test.sh does)");
    let verify = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && verify.trim().is_empty(), "{verify}");
    std::fs::remove_file(&copy).unwrap();

    // The CLI, run as the docs say, looks for the store where the service
    // keeps it (before the first start, there is none yet).
    let (_, said) = scratch.run("ferry status -c /etc/ferry/ferry.toml", "");
    assert!(
        said.contains("/var/lib/ferry/ferry.db"),
        "ferry status names the service's store: {said}"
    );
    // `sudo ferry passwd /etc/ferry/passwd press-7`: a file the service reads.
    let (ok, said) = scratch.run("ferry passwd /etc/ferry/passwd press-7", "s3cret\n");
    assert!(ok, "ferry passwd: {said}");
    let meta = std::fs::metadata(scratch.etc.join("ferry/passwd")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.permissions().mode() & 0o777),
        (0, gid, 0o640),
        "the password file is root:ferry 0640"
    );

    assert_eq!(
        std::fs::read_to_string("/etc/passwd").unwrap(),
        host_passwd,
        "the source install in a namespace changed the host"
    );
}
