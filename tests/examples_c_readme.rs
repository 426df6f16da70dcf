//! examples/c/README.md's command block, run as written but for its first
//! line (`apt-get install ...`: ./scripts/test.sh installs those
//! packages): it compiles `device.c` and runs it against a real gateway
//! (1883 swapped for the gateway's port, the block run from a copy of the
//! repository's `examples/c`), and it prints what the README shows.

use std::path::Path;

use crate::quickstart::{output, terminal};
use crate::support::{Backend, Ferry, FerryOpts, Mosquitto};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_c_examples_readme_runs_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("examples/c/README.md")).expect("the README");
    let block = crate::quickstart::block(&doc, "c-device");
    let (install, rest) = block.split_once('\n').expect("lines");
    assert!(install.starts_with("apt-get install "), "{install}");
    assert!(
        Path::new("/usr/include/mosquitto.h").exists()
            && Path::new("/usr/include/cjson/cJSON.h").exists(),
        "the C example needs libmosquitto-dev and libcjson-dev: `{install}` \
         (or run ./scripts/test.sh, which does)"
    );
    let mq = Mosquitto::start();
    let ferry = Ferry::start(FerryOpts::new("edge-01", mq.port));
    let _backend = Backend::connect_auto_ack(mq.port, "edge-01").await;
    let work = tempfile::tempdir().expect("a temp dir");
    let dir = work.path();
    std::fs::create_dir_all(dir.join("examples/c")).expect("mkdir");
    std::fs::copy(
        root.join("examples/c/device.c"),
        dir.join("examples/c/device.c"),
    )
    .expect("copy device.c");
    let data = tempfile::tempdir().expect("a data dir");
    let script = rest.replace("1883", &ferry.south_port.to_string()).replace(
        "--data-dir /tmp",
        &format!("--data-dir {}", data.path().display()),
    );
    let path = std::env::var("PATH").unwrap_or_default();
    let _device = terminal(dir, "device", &script, &path);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while output(dir, "device")
        .matches("\"status\":\"delivered\"")
        .count()
        < 3
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no three delivered readings within 60 s (the compile included):\n{}",
            output(dir, "device")
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // What the README shows, in order, is what it printed.
    let said = output(dir, "device");
    let events: Vec<String> = said
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    let shown: Vec<String> = block
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    // Each kind of line the README shows, first seen in the order it shows
    // them (how readings and the connection interleave depends on timing).
    let firsts = |all: &[String]| {
        let mut seen: Vec<String> = Vec::new();
        for e in all {
            if !seen.contains(e) {
                seen.push(e.clone());
            }
        }
        seen
    };
    assert_eq!(
        firsts(&events),
        firsts(&shown),
        "the README's sample: {said}"
    );
}
