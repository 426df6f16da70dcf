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
            hash: auth.argon2_decoy.clone(),
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
fn the_decoy_is_a_line_of_the_files_most_common_kind() {
    let table = |lines: &[(&str, &str)]| -> passwords::Table {
        lines
            .iter()
            .map(|(d, h)| (DeviceId::new(*d).unwrap(), h.to_string()))
            .collect()
    };
    let argon = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA";
    let seven = |s: &str| format!("$7$101${s}$ZGlnZXN0");
    let t = table(&[
        ("a", &seven("c2FsdDE")),
        ("b", &seven("c2FsdDI")),
        ("c", argon),
    ]);
    let decoy = decoy_of(&t, "ARGON2-DECOY");
    assert!(decoy.starts_with("$7$101$"), "{decoy}");
    // Same rounds: the same kind; other rounds: another kind.
    let argon2 = "$argon2id$v=19$m=19456,t=2,p=1$b3RoZXI$aGFzaA";
    let t = table(&[
        ("a", argon),
        ("b", argon2),
        ("c", "$7$1000$c2FsdA$ZA"),
        ("d", "$7$9$c2FsdA$ZA"),
    ]);
    assert!(decoy_of(&t, "ARGON2-DECOY").starts_with("$argon2id$"));
    assert_eq!(decoy_of(&table(&[]), "ARGON2-DECOY"), "ARGON2-DECOY");
}
