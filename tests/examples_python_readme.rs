//! examples/python/README.md's "Running them against the quick start",
//! run as written, each block in its own shell (the README's terminals),
//! in a temp dir holding copies of `conf/ferry.toml` and
//! `examples/python/`: `py-gateway` (the upstream Mosquitto and `ferry
//! run`), `py-backend` (backend.py), `py-device` (device.py sending three
//! readings) and `py-downlink` (backend.py sending one downlink and exiting
//! once it is delivered). Free ports take the place of 1883, 1884 and 9183
//! (in the commands and the copied config); the test's build of `ferry` is
//! first on the PATH.

use std::path::{Path, PathBuf};

use crate::quickstart::{accepts, block, output, terminal, to_the_end, Ports};

fn doc() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/README.md"))
        .expect("examples/python/README.md")
}

/// Polls `check` for up to 20 s; panics naming `what` with every
/// terminal's output.
async fn wait_for(dir: &Path, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within 20 s: {what}\n--- gateway ---\n{}\n--- backend ---\n{}\n--- device ---\n{}",
            output(dir, "gateway"),
            output(dir, "backend"),
            output(dir, "device")
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_examples_readme_runs_as_written() {
    crate::examples_python::require_python();
    let doc = doc();
    let ports = Ports::free();
    let work = tempfile::tempdir().expect("a temp dir");
    let dir = work.path();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::create_dir_all(dir.join("conf")).expect("mkdir");
    let conf = std::fs::read_to_string(root.join("conf/ferry.toml")).expect("conf/ferry.toml");
    std::fs::write(dir.join("conf/ferry.toml"), ports.swap(&conf)).expect("write the config");
    std::fs::create_dir_all(dir.join("examples/python")).expect("mkdir");
    for file in ["backend.py", "device.py", "ferrymqtt.py"] {
        std::fs::copy(
            root.join("examples/python").join(file),
            dir.join("examples/python").join(file),
        )
        .expect("copy the example");
    }
    let bin: PathBuf = crate::support::ferry_binary()
        .parent()
        .expect("the binary's dir")
        .to_path_buf();
    let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH")
    .into_string()
    .expect("a UTF-8 PATH");

    let _gateway = terminal(
        dir,
        "gateway",
        &ports.swap(&block(&doc, "py-gateway")),
        &path,
    );
    wait_for(dir, "the gateway and the upstream listen", || {
        accepts(ports.south) && accepts(ports.north)
    })
    .await;
    let _backend = terminal(
        dir,
        "backend",
        &ports.swap(&block(&doc, "py-backend")),
        &path,
    );
    wait_for(dir, "the backend online", || {
        output(dir, "backend").contains("\"event\": \"online\"")
    })
    .await;
    let _device = terminal(dir, "device", &ports.swap(&block(&doc, "py-device")), &path);
    wait_for(dir, "three readings delivered", || {
        output(dir, "device")
            .matches("\"status\": \"delivered\"")
            .count()
            >= 3
    })
    .await;
    let said = to_the_end(
        dir,
        "downlink",
        &ports.swap(&block(&doc, "py-downlink")),
        &path,
    )
    .await;
    assert!(said.contains("\"status\": \"delivered\""), "{said}");
    assert!(
        said.contains("\"event\": \"stopped\""),
        "it exits by itself: {said}"
    );
    wait_for(dir, "the device got the downlink", || {
        output(dir, "device").contains("shift B starts 14:00")
    })
    .await;
    let backend = output(dir, "backend");
    assert_eq!(
        backend.matches("\"duplicate\": false").count(),
        3,
        "each reading committed once by the backend: {backend}"
    );
}
