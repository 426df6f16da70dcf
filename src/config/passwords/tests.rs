use super::*;

fn path() -> &'static Path {
    Path::new("pw")
}

#[test]
fn a_line_that_is_not_device_colon_argon2id_names_its_line() {
    let good = hash_password("x").unwrap();
    let cases = [
        ("no-colon\n", "line 1: expected device:hash"),
        ("# c\n\nbad id:$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaA\n", "line 3: device id"),
        ("d1:plaintext\n", "line 1: neither an argon2id PHC string"),
        ("d1:$7$x$c2FsdA==$aGFzaA==\n", "line 1: Mosquitto $7$ hash: iterations"),
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
