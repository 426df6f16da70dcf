use super::*;

fn file(lines: &[(&str, &str)]) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    let text: String = lines
        .iter()
        .map(|(d, p)| format!("{d}:{}\n", hash_password(p).unwrap()))
        .collect();
    std::fs::write(f.path(), text).unwrap();
    f
}

fn path() -> &'static Path {
    Path::new("pw")
}

#[test]
fn a_line_that_is_not_device_colon_argon2id_names_its_line() {
    let good = hash_password("x").unwrap();
    let cases = [
        ("no-colon\n", "line 1: expected device:hash"),
        ("# c\n\nbad id:$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaA\n", "line 3: device id"),
        ("d1:plaintext\n", "line 1: not a PHC hash string"),
        ("d1:$scrypt$ln=16,r=8,p=1$aM15713r3Xsvxbi31lqr1Q$nFNh2CVHVjNldFVKDHDlm4CbdRSCdEBsjjJxD+iCs5E\n", "line 1: hash algorithm scrypt"),
    ];
    for (text, want) in cases {
        let err = parse(path(), text).unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}: {err}");
    }
    let twice = format!("d1:{good}\nd1:{good}\n");
    let err = parse(path(), &twice).unwrap_err().to_string();
    assert!(err.contains("line 2: device d1 is named twice"), "{err}");
    let ok = parse(path(), &format!("# devices\n\nd1:{good}\n  d2:{good}  \n")).unwrap();
    assert_eq!(ok.len(), 2);
}

#[test]
fn set_line_replaces_a_device_in_place_and_appends_a_new_one() {
    let d1 = DeviceId::new("d1").unwrap();
    let d3 = DeviceId::new("d3").unwrap();
    let text = "# plant 4\nd1:old\nd2:keep\n";
    assert_eq!(set_line(text, &d1, "new"), "# plant 4\nd1:new\nd2:keep\n");
    assert_eq!(
        set_line(text, &d3, "h"),
        "# plant 4\nd1:old\nd2:keep\nd3:h\n"
    );
    // A comment that happens to start with the device's name stays.
    assert_eq!(set_line("#d1:x\n", &d1, "h"), "#d1:x\nd1:h\n");
    assert_eq!(set_line("", &d1, "h"), "d1:h\n");
}

#[tokio::test]
async fn only_the_right_password_under_the_devices_own_client_id_is_accepted() {
    let f = file(&[("press-7", "s3cret"), ("press-8", "other")]);
    let auth = Authenticator::load(f.path(), Duration::from_secs(30)).unwrap();
    let check = |c: &'static str, u: Option<&'static str>, p: Option<&'static str>| {
        let auth = auth.clone();
        async move { auth.check(c, u, p).await }
    };
    assert_eq!(
        check("press-7", Some("press-7"), Some("s3cret")).await,
        Ok(())
    );
    assert_eq!(
        check("press-7", Some("press-7"), Some("wrong")).await,
        Err(Refusal::WrongPassword)
    );
    assert_eq!(
        check("press-8", Some("press-7"), Some("s3cret")).await,
        Err(Refusal::NotItself)
    );
    assert_eq!(
        check("ghost", Some("ghost"), Some("s3cret")).await,
        Err(Refusal::UnknownDevice)
    );
    assert_eq!(
        check("press-7", None, None).await,
        Err(Refusal::NoCredentials)
    );
    assert_eq!(
        check("press-7", Some("press-7"), None).await,
        Err(Refusal::NoCredentials)
    );
    // Accepted again from the cache, and a wrong password still is not.
    assert_eq!(
        check("press-7", Some("press-7"), Some("s3cret")).await,
        Ok(())
    );
    assert_eq!(
        check("press-7", Some("press-7"), Some("s3cret ")).await,
        Err(Refusal::WrongPassword)
    );
}

#[tokio::test]
async fn a_reload_applies_new_and_changed_lines_and_a_broken_file_keeps_the_old_one() {
    let f = file(&[("d1", "one")]);
    let auth = Authenticator::load(f.path(), Duration::from_secs(30)).unwrap();
    assert_eq!(auth.check("d1", Some("d1"), Some("one")).await, Ok(()));
    assert_eq!(
        auth.check("d2", Some("d2"), Some("two")).await,
        Err(Refusal::UnknownDevice)
    );

    // d1's password rotated, d2 added.
    let text = format!(
        "d1:{}\nd2:{}\n",
        hash_password("uno").unwrap(),
        hash_password("two").unwrap()
    );
    std::fs::write(f.path(), &text).unwrap();
    assert_eq!(auth.reload().unwrap(), 2);
    assert_eq!(auth.check("d2", Some("d2"), Some("two")).await, Ok(()));
    // The old password was verified (and cached) before; the cache must not
    // outlive the line it was verified against.
    assert_eq!(
        auth.check("d1", Some("d1"), Some("one")).await,
        Err(Refusal::WrongPassword)
    );
    assert_eq!(auth.check("d1", Some("d1"), Some("uno")).await, Ok(()));

    std::fs::write(f.path(), "d1 has no colon\n").unwrap();
    let err = auth.reload().unwrap_err().to_string();
    assert!(err.contains("line 1"), "{err}");
    assert_eq!(auth.check("d2", Some("d2"), Some("two")).await, Ok(()));
}

#[tokio::test]
async fn a_connect_that_finds_the_verifier_full_or_too_slow_is_refused_busy() {
    let f = file(&[("d1", "one")]);
    // No time at all to wait for an answer.
    let auth = Authenticator::load(f.path(), Duration::ZERO).unwrap();
    assert_eq!(
        auth.check("d1", Some("d1"), Some("one")).await,
        Err(Refusal::Busy)
    );
    // A full queue refuses at once, whatever the wait (no verifier thread
    // here, so nothing drains it meanwhile).
    let auth = Authenticator::load_with(f.path(), Duration::from_secs(30), 0).unwrap();
    let mut waiting = Vec::new();
    while let Ok(()) = auth.verifier.queue.try_send({
        let (answer, answered) = oneshot::channel();
        waiting.push(answered);
        Check {
            hash: auth.decoy.clone(),
            password: "x".into(),
            answer,
        }
    }) {}
    assert_eq!(
        auth.check("d1", Some("d1"), Some("one")).await,
        Err(Refusal::Busy)
    );
    assert_eq!(Refusal::Busy.code(), ConnectReturnCode::ServiceUnavailable);
    assert_eq!(Refusal::NotItself.code(), ConnectReturnCode::NotAuthorized);
    assert_eq!(
        Refusal::WrongPassword.code(),
        ConnectReturnCode::BadUserNamePassword
    );
}

#[test]
fn verifying_in_reused_memory_agrees_with_argon2s_own_verifier() {
    use argon2::password_hash::PasswordVerifier;
    use argon2::{Algorithm, Params, Version};

    let light = Argon2::new(
        Algorithm::Argon2id,
        Version::V0x13,
        Params::new(64, 1, 1, Some(16)).unwrap(),
    );
    let hashes = [
        hash_password("s3cret").unwrap(),
        light
            .hash_password(b"s3cret", &SaltString::generate(&mut OsRng))
            .unwrap()
            .to_string(),
    ];
    // One buffer across checks of different sizes, as a verifier thread has.
    let mut blocks = Vec::new();
    for phc in hashes.iter().chain(hashes.iter().rev()) {
        let parsed = PasswordHash::new(phc).unwrap();
        for password in ["s3cret", "s3cret ", "", "S3CRET"] {
            let theirs = Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok();
            assert_eq!(
                verify_in(&mut blocks, password.as_bytes(), phc),
                theirs,
                "{phc} {password:?}"
            );
            assert_eq!(theirs, password == "s3cret");
        }
    }
    assert!(!verify_in(&mut blocks, b"s3cret", "not a hash"));
    assert!(!verify_in(
        &mut blocks,
        b"s3cret",
        "$argon2id$v=19$m=64,t=1,p=1$c2FsdHNhbHQ"
    ));
}
