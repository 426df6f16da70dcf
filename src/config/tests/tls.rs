//! `[south.tls]`, `[south.site_tls]` and `[north.tls]`: read, refused by key, paired.

use super::*;

#[test]
fn tls_is_off_unless_configured_and_read_when_it_is() {
    let cfg = load_str("[gateway]\nid = \"g\"\n").unwrap();
    assert!(cfg.south.tls.is_none() && cfg.north.tls.is_none());
    let pem = test_pem();
    let cfg = with_raw(|c| {
        c.south.tls.cert = pem.cert.clone();
        c.south.tls.key = pem.key.clone();
        c.south.tls.client_ca = pem.ca.clone();
        c.north.tls.ca = pem.ca.clone();
    })
    .unwrap();
    let tls = cfg.south.tls.expect("listener TLS");
    assert_eq!(tls.client_ca.as_deref(), Some(pem.ca.as_path()));
    assert!(cfg.north.tls.is_some());
}

#[test]
fn tls_files_that_cannot_be_used_are_named_by_their_key() {
    let pem = test_pem();
    let garbage = pem.dir.path().join("garbage.pem");
    std::fs::write(&garbage, "hello\n").unwrap();
    let missing = PathBuf::from("/nonexistent/cert.pem");
    type Change<'a> = Box<dyn FnOnce(&mut RawConfig) + 'a>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "south.tls.cert",
            Box::new(|c: &mut RawConfig| {
                c.south.tls.cert = missing.clone();
                c.south.tls.key = pem.key.clone();
            }),
        ),
        (
            "south.tls.cert",
            Box::new(|c: &mut RawConfig| {
                c.south.tls.cert = garbage.clone();
                c.south.tls.key = pem.key.clone();
            }),
        ),
        (
            "south.tls.key",
            Box::new(|c: &mut RawConfig| {
                c.south.tls.cert = pem.cert.clone();
                c.south.tls.key = pem.cert.clone();
            }),
        ),
        (
            "south.tls.key",
            Box::new(|c: &mut RawConfig| {
                c.south.tls.cert = pem.cert.clone();
                c.south.tls.key = pem.other_key.clone();
            }),
        ),
        (
            "south.tls.client_ca",
            Box::new(|c: &mut RawConfig| {
                c.south.tls.cert = pem.cert.clone();
                c.south.tls.key = pem.key.clone();
                c.south.tls.client_ca = garbage.clone();
            }),
        ),
        (
            "south.tls.crl",
            Box::new(|c: &mut RawConfig| {
                c.south.tls.cert = pem.cert.clone();
                c.south.tls.key = pem.key.clone();
                c.south.tls.client_ca = pem.ca.clone();
                c.south.tls.crl = garbage.clone();
            }),
        ),
        (
            "north.tls.ca",
            Box::new(|c: &mut RawConfig| c.north.tls.ca = missing.clone()),
        ),
        (
            "north.tls.key",
            Box::new(|c: &mut RawConfig| {
                c.north.tls.ca = pem.ca.clone();
                c.north.tls.cert = pem.cert.clone();
                c.north.tls.key = pem.other_key.clone();
            }),
        ),
    ];
    for (key, change) in cases {
        let err = with_raw(change).unwrap_err();
        assert_eq!(err.key, key, "{err}");
        assert_eq!(err.to_string().lines().count(), 1, "{err}");
    }
}

#[test]
fn tls_keys_must_come_in_their_pairs() {
    let pem = test_pem();
    let err = with_raw(|c| c.south.tls.cert = pem.cert.clone()).unwrap_err();
    assert_eq!(err.key, "south.tls.key", "{err}");
    let err = with_raw(|c| c.south.tls.key = pem.key.clone()).unwrap_err();
    assert_eq!(err.key, "south.tls.cert", "{err}");
    let err = with_raw(|c| c.south.tls.client_ca = pem.ca.clone()).unwrap_err();
    assert_eq!(err.key, "south.tls.client_ca", "{err}");
    let err = with_raw(|c| {
        c.south.tls.cert = pem.cert.clone();
        c.south.tls.key = pem.key.clone();
        c.south.tls.crl = pem.ca.clone();
    })
    .unwrap_err();
    assert_eq!(err.key, "south.tls.crl", "{err}");
    let err = with_raw(|c| {
        c.north.tls.cert = pem.cert.clone();
        c.north.tls.key = pem.key.clone();
    })
    .unwrap_err();
    assert_eq!(err.key, "north.tls.ca", "{err}");
    let err = with_raw(|c| {
        c.north.tls.ca = pem.ca.clone();
        c.north.tls.key = pem.key.clone();
    })
    .unwrap_err();
    assert_eq!(err.key, "north.tls.cert", "{err}");
}

#[test]
fn tls_keys_of_the_other_south_mode_are_refused_by_name() {
    let pem = test_pem();
    let err = with_raw(|c| c.south.site_tls.ca = pem.ca.clone()).unwrap_err();
    assert_eq!(err.key, "south.site_tls.ca", "{err}");
    let err = with_raw(|c| c.south.site_tls.key = pem.key.clone()).unwrap_err();
    assert_eq!(err.key, "south.site_tls.key", "{err}");
    let external = |c: &mut RawConfig| c.south.mode = "external".into();
    let err = with_raw(|c| {
        external(c);
        c.south.tls.client_ca = pem.ca.clone();
    })
    .unwrap_err();
    assert_eq!(err.key, "south.tls.client_ca", "{err}");
    let cfg = with_raw(|c| {
        external(c);
        c.south.site_tls.ca = pem.ca.clone();
    })
    .unwrap();
    match cfg.south.mode {
        SouthMode::External(site) => assert!(site.tls.is_some()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn nested_tls_keys_are_checked_by_name() {
    let err = load_str("[gateway]\nid = \"g\"\n[south.tls]\ncert_file = \"x\"\n").unwrap_err();
    assert_eq!(err.key, "south.tls.cert_file", "{err}");
    let err =
        load_str("[gateway]\nid = \"g\"\n[north.tls]\nca = \"/nonexistent/ca.pem\"\n").unwrap_err();
    assert_eq!(err.key, "north.tls.ca", "{err}");
}
