//! The Debian package, built by `scripts/deb.sh` from the binary under
//! test and installed for real with dpkg into a scratch root: `dpkg
//! --root=DIR --force-script-chrootless` runs the package's own maintainer
//! scripts with `DPKG_ROOT=DIR`, and they change only DIR (useradd
//! `--prefix`, paths under `$DPKG_ROOT`, no systemctl). So the postinst's
//! user, group and store directory are checked as it made them, and the
//! host's /etc/passwd and /var/lib are checked untouched. The scripts' other
//! path, a live install (`DPKG_ROOT` empty: getent, useradd on /etc), runs
//! in a mount namespace over copies of /etc and /var/lib.
//!
//! Needs root (the postinst chowns, as on a real install), dpkg-dev
//! (dpkg-shlibdeps) and systemd-analyze; scripts/test.sh installs both.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::ferry_binary;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `cmd`; its output, or a failure naming what to install.
fn run(cmd: &mut Command, install_hint: &str) -> Output {
    let shown = format!("{cmd:?}");
    cmd.output()
        .unwrap_or_else(|e| panic!("{shown}: {e}: {install_hint}"))
}

/// Runs `cmd` and fails the test, with its stderr, unless it exits 0.
fn ok(cmd: &mut Command, install_hint: &str) -> Output {
    let shown = format!("{cmd:?}");
    let out = run(cmd, install_hint);
    assert!(
        out.status.success(),
        "{shown}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn must_be_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the package test installs with dpkg --root, whose postinst chowns as on a real \
         install: run it as root (sudo -E cargo test --features system-tests --test tests package)"
    );
}

/// The package built from the binary under test, uncompressed (quick).
fn build_package(out: &Path) -> PathBuf {
    let built = ok(
        Command::new(repo().join("scripts/deb.sh"))
            .arg("--binary")
            .arg(ferry_binary())
            .arg("--out")
            .arg(out)
            .args(["--compress", "none"]),
        "deb.sh needs bash, dpkg-deb, dpkg-shlibdeps and strip: apt-get install dpkg-dev binutils",
    );
    let deb = PathBuf::from(String::from_utf8_lossy(&built.stdout).trim());
    let name = deb.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("ferry_{}_", env!("CARGO_PKG_VERSION")))
            && name.ends_with(".deb"),
        "deb.sh names the package ferry_<version>_<arch>.deb: {}",
        deb.display()
    );
    deb
}

/// A scratch root dpkg can install into: its own dpkg database and the
/// account files useradd --prefix edits.
fn scratch_root(root: &Path) {
    for dir in [
        "etc",
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    for (file, text) in [
        ("var/lib/dpkg/status", ""),
        ("var/lib/dpkg/available", ""),
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("etc/group", "root:x:0:\n"),
        ("etc/shadow", "root:*:19000:0:99999:7:::\n"),
        ("etc/gshadow", "root:*::\n"),
    ] {
        std::fs::write(root.join(file), text).unwrap();
    }
}

/// `dpkg --root=ROOT ARGS...` with the maintainer scripts run outside a
/// chroot (DPKG_ROOT=ROOT). The dependencies (libc6...) are the host's,
/// not in the scratch database, hence --force-depends.
fn dpkg(root: &Path, args: &[&str]) -> Output {
    ok(
        Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args([
                "--force-script-chrootless",
                "--force-depends",
                "--force-not-root",
            ])
            .args(["--force-confold"])
            .args(args)
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env_remove("DPKG_ROOT")
            .env_remove("DPKG_ADMINDIR"),
        "dpkg is Debian's package manager",
    )
}

/// Field `n` (1-based) of `name`'s line in the scratch root's etc/`db`.
fn account(root: &Path, db: &str, name: &str, n: usize) -> Option<String> {
    let text = std::fs::read_to_string(root.join("etc").join(db)).unwrap();
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f[0] == name)
        .map(|f| f[n - 1].to_string())
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// What the host has that an install into a scratch root must not touch.
fn host_state() -> (String, String, bool) {
    (
        std::fs::read_to_string("/etc/passwd").unwrap(),
        std::fs::read_to_string("/etc/group").unwrap(),
        Path::new("/var/lib/ferry").exists(),
    )
}

/// `systemd-analyze verify` on the installed unit, its ExecStart on the
/// installed binary (verify refuses a command that does not exist, and
/// /usr/bin/ferry is in the scratch root): as scripts/test.sh does, any
/// output fails, since verify exits 0 on a line it could not parse.
fn verify_unit(root: &Path, work: &Path) {
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/ferry.service")).unwrap();
    let dir = work.join("unit");
    std::fs::create_dir_all(&dir).unwrap();
    let binary = root.join("usr/bin/ferry");
    let copy = dir.join("ferry.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/bin/ferry", &binary.to_string_lossy()),
    )
    .unwrap();
    let hint = "systemd-analyze is in Debian's systemd package (scripts/test.sh installs it)";
    let out = run(
        Command::new("systemd-analyze").arg("verify").arg(&copy),
        hint,
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify on the installed unit: {}: {said}",
        out.status
    );
    // The sandbox stays where it is: above 2.0 ("OK" ends at 3.9), a
    // dropped protection shows here before it ships.
    let out = run(
        Command::new("systemd-analyze")
            .args(["security", "--offline=yes", "--threshold=20"])
            .arg(&copy),
        hint,
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "systemd-analyze security scores the installed unit above 2.0: {}",
        said.lines().last().unwrap_or_default()
    );
}

#[test]
fn the_package_installs_the_service_its_user_and_a_config_the_cli_agrees_with() {
    must_be_root();
    let before = host_state();
    let work = tempfile::tempdir().unwrap();
    let deb = build_package(&work.path().join("out"));
    let root = work.path().join("root");
    scratch_root(&root);

    dpkg(&root, &["-i", &deb.to_string_lossy()]);

    // What dpkg recorded: installed, with the config as its conffile.
    let status = ok(
        Command::new("dpkg-query")
            .arg(format!(
                "--admindir={}",
                root.join("var/lib/dpkg").display()
            ))
            .args([
                "-W",
                "-f=${Status}|${Conffiles}|${Section}|${Depends}",
                "ferry",
            ]),
        "dpkg-query comes with dpkg",
    );
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.starts_with("install ok installed|"), "{status}");
    assert!(
        status.contains(" /etc/ferry/ferry.toml "),
        "conffile: {status}"
    );
    assert!(status.contains("|net|"), "section: {status}");
    assert!(status.contains("libc6"), "depends on libc: {status}");

    // The files, with their modes.
    let binary = root.join("usr/bin/ferry");
    assert_eq!(mode(&binary), 0o755, "{}", binary.display());
    let unit_path = root.join("lib/systemd/system/ferry.service");
    assert_eq!(mode(&unit_path), 0o644);
    for doc in [
        "README.md",
        "CHANGELOG.md",
        "docs/OPERATIONS.md",
        "copyright",
        "changelog.gz",
    ] {
        assert_eq!(
            mode(&root.join("usr/share/doc/ferry").join(doc)),
            0o644,
            "{doc}"
        );
    }

    // The user and group the postinst made, in the scratch root only.
    let uid: u32 = account(&root, "passwd", "ferry", 3)
        .expect("postinst made the user ferry")
        .parse()
        .unwrap();
    let gid: u32 = account(&root, "group", "ferry", 3)
        .expect("postinst made the group ferry")
        .parse()
        .unwrap();
    assert!(uid < 1000 && gid < 1000, "a system user: {uid}:{gid}");
    assert_eq!(
        account(&root, "passwd", "ferry", 4).unwrap(),
        gid.to_string()
    );
    assert_eq!(
        account(&root, "passwd", "ferry", 6).unwrap(),
        "/var/lib/ferry"
    );
    assert_eq!(
        account(&root, "passwd", "ferry", 7).unwrap(),
        "/usr/sbin/nologin"
    );
    let store = root.join("var/lib/ferry");
    let meta = std::fs::metadata(&store).expect("postinst made /var/lib/ferry");
    assert_eq!(
        (meta.uid(), meta.gid(), format!("{:o}", mode(&store))),
        (uid, gid, "750".into()),
        "/var/lib/ferry is ferry:ferry 0750"
    );
    // The config holds north.password once edited: root:ferry 0640.
    let conf = root.join("etc/ferry/ferry.toml");
    let meta = std::fs::metadata(&conf).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), format!("{:o}", mode(&conf))),
        (0, gid, "640".into()),
        "the config is root:ferry 0640"
    );

    // The unit and the config name the same store, for the same user.
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    for line in [
        "ExecStart=/usr/bin/ferry run --config /etc/ferry/ferry.toml",
        "ExecStartPre=/usr/bin/ferry check-config --config /etc/ferry/ferry.toml",
        "User=ferry",
        "Group=ferry",
        "StateDirectory=ferry",
        "Documentation=file:///usr/share/doc/ferry/README.md",
    ] {
        assert!(
            unit.lines().any(|l| l.starts_with(line)),
            "unit lacks {line}"
        );
    }
    for gone in ["DynamicUser", "FERRY_GATEWAY__DATA_DIR", "/usr/local/bin"] {
        assert!(!unit.contains(gone), "the packaged unit still says {gone}");
    }
    for doc in unit
        .lines()
        .filter_map(|l| l.strip_prefix("Documentation="))
        .flat_map(|l| l.split_whitespace())
    {
        let path = doc
            .strip_prefix("file://")
            .expect("a file:// documentation link");
        assert!(
            root.join(path.trim_start_matches('/')).exists(),
            "the unit's Documentation={doc} is not installed"
        );
    }
    let config = std::fs::read_to_string(&conf).unwrap();
    assert!(
        config.lines().any(|l| l == "data_dir = \"/var/lib/ferry\""),
        "the installed config keeps its store where the unit's StateDirectory is"
    );
    assert!(config.lines().any(|l| l == "listen = \"127.0.0.1:1883\""));
    assert!(config.lines().any(|l| l == "listen = \"127.0.0.1:9183\""));
    let checked = ok(
        Command::new(&binary)
            .args(["check-config", "--config"])
            .arg(&conf),
        "the installed binary",
    );
    assert!(String::from_utf8_lossy(&checked.stdout).ends_with(": ok\n"));
    verify_unit(&root, work.path());

    // An upgrade (here the same version again) keeps a local edit of the
    // conffile and its group; the postinst runs again without failing on
    // the user it made before.
    let edited = config.replace("id = \"edge-01\"", "id = \"press-hall-3\"");
    assert_ne!(edited, config);
    std::fs::write(&conf, &edited).unwrap();
    // An existing store directory is the unit's StateDirectory's to fix
    // (systemd chowns it whole at start when its owner is not ferry): an
    // upgrade leaves it as it finds it, here owned by someone else.
    std::os::unix::fs::chown(&store, Some(4321), Some(4321)).unwrap();
    dpkg(&root, &["-i", &deb.to_string_lossy()]);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), edited);
    assert_eq!(std::fs::metadata(&store).unwrap().uid(), 4321);
    let meta = std::fs::metadata(&conf).unwrap();
    assert_eq!(
        (meta.gid(), format!("{:o}", mode(&conf))),
        (gid, "640".into()),
        "an upgrade keeps the config root:ferry 0640"
    );
    let users = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert_eq!(users.matches("\nferry:").count(), 1, "{users}");

    // Remove keeps the store and the config; purge deletes both and
    // leaves the user (files elsewhere may still be its).
    std::fs::write(store.join("ferry.db"), b"messages").unwrap();
    dpkg(&root, &["-r", "ferry"]);
    assert!(!binary.exists() && !unit_path.exists());
    assert!(store.join("ferry.db").exists(), "remove keeps the store");
    assert!(conf.exists(), "remove keeps the conffile");
    dpkg(&root, &["-P", "ferry"]);
    assert!(!store.exists(), "purge deletes the store");
    assert!(!conf.exists(), "purge deletes the conffile");
    assert!(account(&root, "passwd", "ferry", 1).is_some());

    assert_eq!(
        host_state(),
        before,
        "installing into a scratch root changed the host"
    );
}

/// The maintainer scripts as they run on a real install (no `DPKG_ROOT`:
/// getent, useradd without `--prefix`, the host's paths), in a mount
/// namespace where /etc and /var/lib are this test's own copies, so the
/// host's accounts and /var/lib are never touched. /run/systemd is an
/// empty directory there, so on a host that runs systemd the scripts see
/// none and call no systemctl.
fn on_a_live_root(etc: &Path, var_lib: &Path, script: &str, args: &[&str]) -> Output {
    let no_systemd = tempfile::tempdir().unwrap();
    ok(
        Command::new("unshare")
            .args(["-m", "sh", "-c"])
            .arg(concat!(
                r#"mount --bind "$0" /etc && mount --bind "$1" /var/lib && "#,
                r#"{ [ ! -d /run/systemd ] || mount --bind "$2" /run/systemd; } && "#,
                r#"shift 2 && exec sh "$@""#,
            ))
            .arg(etc)
            .arg(var_lib)
            .arg(no_systemd.path())
            .arg(repo().join("packaging").join(script))
            .args(args)
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env_remove("DPKG_ROOT")
            // As dpkg runs them (deb-systemd-helper insists).
            .env("DPKG_MAINTSCRIPT_PACKAGE", "ferry")
            .env("DPKG_MAINTSCRIPT_NAME", script),
        "unshare (util-linux) makes a mount namespace; it needs root",
    )
}

#[test]
fn on_a_live_root_postinst_makes_the_user_the_store_and_the_configs_group_and_purge_the_rest() {
    must_be_root();
    let before = host_state();
    let work = tempfile::tempdir().unwrap();
    let etc = work.path().join("etc");
    ok(
        Command::new("cp").arg("-a").arg("/etc").arg(&etc),
        "cp is coreutils",
    );
    let var_lib = work.path().join("var-lib");
    std::fs::create_dir(&var_lib).unwrap();
    // As dpkg unpacks it: root:root 0640.
    std::fs::create_dir_all(etc.join("ferry")).unwrap();
    let conf = etc.join("ferry/ferry.toml");
    std::fs::write(&conf, "[gateway]\nid = \"edge-01\"\n").unwrap();
    std::os::unix::fs::chown(&conf, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o640)).unwrap();
    let had_user = account(work.path(), "passwd", "ferry", 1).is_some();

    on_a_live_root(&etc, &var_lib, "postinst", &["configure", ""]);
    let uid: u32 = account(work.path(), "passwd", "ferry", 3)
        .expect("postinst made the user ferry in /etc/passwd")
        .parse()
        .unwrap();
    let gid: u32 = account(work.path(), "group", "ferry", 3)
        .expect("postinst made the group ferry in /etc/group")
        .parse()
        .unwrap();
    let store = var_lib.join("ferry");
    let meta = std::fs::metadata(&store).expect("postinst made /var/lib/ferry");
    assert_eq!(
        (meta.uid(), meta.gid(), format!("{:o}", mode(&store))),
        (uid, gid, "750".into())
    );
    assert_eq!(std::fs::metadata(&conf).unwrap().gid(), gid);

    // Configured again (an upgrade from 0.1.0): nothing made twice.
    on_a_live_root(&etc, &var_lib, "postinst", &["configure", "0.1.0"]);
    let users = std::fs::read_to_string(etc.join("passwd")).unwrap();
    assert_eq!(
        users.lines().filter(|l| l.starts_with("ferry:")).count(),
        1,
        "one user ferry (it existed before the test: {had_user})"
    );
    // Without systemd, a gateway running on the store: remove stops it
    // (SIGTERM: it exits cleanly), purge never deletes the store under one.
    let mut gateway = gateway_on(work.path(), &store);
    on_a_live_root(&etc, &var_lib, "prerm", &["remove"]);
    let stopped = gateway.try_wait().expect("wait");
    assert!(
        stopped.is_some_and(|s| s.success()),
        "prerm remove stopped the running gateway: {stopped:?}"
    );
    let removed = on_a_live_root(&etc, &var_lib, "postrm", &["remove"]);
    assert!(store.exists(), "remove keeps the store");
    if Path::new("/usr/bin/deb-systemd-helper").exists() {
        assert_eq!(
            std::fs::read_link(etc.join("systemd/system/ferry.service")).ok(),
            Some(PathBuf::from("/dev/null")),
            "remove masks the unit: {removed:?}"
        );
    }
    let mut again = gateway_on(work.path(), &store);
    let kept = on_a_live_root(&etc, &var_lib, "postrm", &["purge"]);
    assert!(store.exists(), "not deleted under a running gateway");
    assert!(
        String::from_utf8_lossy(&kept.stderr).contains("a gateway still runs"),
        "{kept:?}"
    );
    let _ = again.kill();
    let _ = again.wait();
    on_a_live_root(&etc, &var_lib, "postrm", &["purge"]);
    assert!(!store.exists(), "purge deletes the store");
    assert!(
        std::fs::symlink_metadata(etc.join("systemd/system/ferry.service")).is_err(),
        "purge unmasks"
    );

    assert_eq!(
        host_state(),
        before,
        "the live-root scripts changed the host"
    );
}

/// `ferry run` on `store` (a test config beside it, ports free, no admin,
/// no upstream): running once its pid file is there.
fn gateway_on(dir: &Path, store: &Path) -> std::process::Child {
    let port = crate::support::free_port();
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nid = \"edge-pkg\"\ndata_dir = \"{}\"\n[south]\nlisten = \"127.0.0.1:{port}\"\n\
             [north]\nport = {}\n[admin]\nlisten = \"\"\n",
            store.display(),
            crate::support::free_port()
        ),
    )
    .unwrap();
    let _ = std::fs::remove_file(store.join("ferry.pid"));
    let child = Command::new(ferry_binary())
        .args(["run", "--config"])
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start ferry");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !store.join("ferry.pid").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "ferry wrote no pid file"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child
}
