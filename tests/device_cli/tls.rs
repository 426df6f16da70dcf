//! `ferry device` over TLS, against a gateway whose device listener wants
//! a certificate from its CA naming the device, and whose own certificate
//! names a DNS name only (`gateway.plant`), not the 127.0.0.1 it is
//! reached at: `-c` takes port and TLS from the gateway's config.

use crate::support::{Ferry, FerryOpts, Mosquitto, Pki};

use super::device;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_with_its_certificate_and_the_gateways_name_the_device_is_stored() {
    let pki = Pki::new("devcli-tls");
    let server = pki.server_for("ferry-south", &["gateway.plant"]);
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("gw-devcli-tls", mq.port).with(|c| {
        c.south.tls.cert = server.cert.clone();
        c.south.tls.key = server.key.clone();
        c.south.tls.client_ca = pki.ca.clone();
    }));
    let (own, other) = (pki.client("press-7"), pki.client("press-8"));
    let path = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_owned();
    let (config, ca) = (path(&ferry.config_path), path(&pki.ca));
    let with = |cert: &crate::support::certs::Issued, name: Option<&str>| {
        let mut args = vec![
            "-c".to_owned(),
            config.clone(),
            "--id".into(),
            "press-7".into(),
            "--cafile".into(),
            ca.clone(),
            "--cert".into(),
            path(&cert.cert),
            "--key".into(),
            path(&cert.key),
        ];
        if let Some(name) = name {
            args.extend(["--server-name".into(), name.into()]);
        }
        args.extend(["pub".into(), "up/a".into(), "1".into()]);
        args
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        device(&args, None).await
    };

    let (code, out, err) = run(with(&own, Some("gateway.plant"))).await;
    assert_eq!(code, Some(0), "stdout {out:#?}, stderr {err}");
    assert!(out.iter().any(|l| l.starts_with("stored ")), "{out:#?}");
    let port = ferry.south_port;
    assert!(
        out[0].ends_with(&format!("127.0.0.1:{port}")),
        "from the config: {out:#?}"
    );

    // By IP, the certificate does not name what was reached.
    let (code, _, err) = run(with(&own, None)).await;
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot connect") && err.contains("--server-name"),
        "{err}"
    );

    // press-8's certificate does not make anyone press-7.
    let (code, out, err) = run(with(&other, Some("gateway.plant"))).await;
    assert_eq!(code, Some(1), "stdout {out:#?}, stderr {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!out.iter().any(|l| l.starts_with("stored ")), "{out:#?}");

    // TLS from the config, but no CA to check the gateway with.
    let (code, _, err) = device(
        &["-c", &config, "--id", "press-7", "pub", "up/a", "1"],
        None,
    )
    .await;
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("TLS needs --cafile"), "{err}");
}
