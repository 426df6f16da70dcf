#!/usr/bin/env bash
# Runs ferry's whole test suite on a fresh Debian machine: installs what the
# integration tests need (Mosquitto, the real upstream broker; Chromium, the
# status page test's headless browser; faketime, the clock tests' false
# wall clock; python3-paho-mqtt and mosquitto-clients, the conformance
# suite's clients; libmosquitto-dev and libcjson-dev, the C example's;
# dpkg-dev and strace, the package and sandbox tests'; Node.js with MQTT.js
# from the npm registry, the WebSocket test's), then `cargo test`
# over the workspace: ferry and its fork of rumqttd
# (vendor/rumqttd). Extra arguments go to cargo test.
#
# Plain `cargo test` runs only the fast integration tests, which need no
# more than Mosquitto and its clients and no root; this script turns on
# the rest with ferry's `system-tests` feature (root, the browser,
# libfaketime, the compilers and interpreters, the package; see
# tests/tests.rs), and runs it as root or with sudo for apt-get (the
# package, sandbox, source-install, real-systemd, password-file and
# full-disk tests need root themselves). Beside the tests it runs the
# checks CI holds every change to: `cargo fmt --check`, `cargo clippy`
# and `cargo doc`, warnings denied. A failing check or test makes the
# script fail once everything has run.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
updated=""
# install PACKAGE WHY: apt-get installs it (updating the lists once).
install() {
    echo "test.sh: installing $1 ($2)" >&2
    if [ -z "$updated" ]; then
        $sudo_cmd apt-get update -qq
        updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$1" >/dev/null
}

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    install mosquitto "the tests' upstream broker"
    # Debian starts the packaged broker on port 1883, which is ferry's own
    # default south port. The tests start their own; stop the one we installed.
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet mosquitto 2>/dev/null; then
        echo "test.sh: stopping and disabling the packaged mosquitto service (port 1883 is ferry's)" >&2
        $sudo_cmd systemctl disable --now mosquitto >/dev/null 2>&1 || true
    fi
fi
# The status page is checked in a real headless browser: Debian's chromium.
[ -x /usr/bin/chromium ] || install chromium "the status page test's headless browser"
# The clock tests run ferry under a false wall clock: Debian's libfaketime.
[ -x /usr/bin/faketime ] || install faketime "the clock tests' false wall clock"
# The conformance suite runs the Paho interoperability cases in Debian's
# python3 with its paho-mqtt (tests/conformance/).
[ -f /usr/lib/python3/dist-packages/paho/mqtt/client.py ] || install python3-paho-mqtt "the conformance suite's MQTT 3.1/3.1.1/5 client"
# ... and the stock clients plants use (mosquitto_pub, _sub, _rr).
[ -x /usr/bin/mosquitto_rr ] || install mosquitto-clients "the conformance suite's stock MQTT clients"
# The C example (examples/c/device.c) is compiled against libmosquitto and
# cJSON (tests/examples_c.rs).
[ -f /usr/include/mosquitto.h ] || install libmosquitto-dev "the C example's MQTT client library"
[ -f /usr/include/cjson/cJSON.h ] || install libcjson-dev "the C example's JSON parser"
# systemd-analyze checks the shipped unit (below, and in tests/package.rs).
command -v systemd-analyze >/dev/null 2>&1 || install systemd "for systemd-analyze verify"
# The unit is run under a real systemd, booted in a container on this
# machine's own /usr (tests/systemd_real.rs): systemd-nspawn.
[ -x /usr/bin/systemd-nspawn ] || install systemd-container "the real-systemd test's container"
# The container test (tests/container.rs) builds packaging/Containerfile
# with podman from the .deb and runs it: podman, runc (crun, podman's
# default runtime, refuses a host with cgroup v1 controllers beside a v2
# mount, as this one's) and mmdebstrap (the base image is made from
# Debian's mirror: no container registry is reached).
command -v podman >/dev/null 2>&1 || install podman "the container test's container engine"
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || install runc "the container test's OCI runtime"
command -v mmdebstrap >/dev/null 2>&1 || install mmdebstrap "the container test's base image, from Debian's mirror"
# The package test builds the .deb with scripts/deb.sh: dpkg-shlibdeps
# (its Depends) and strip.
command -v dpkg-shlibdeps >/dev/null 2>&1 || install dpkg-dev "the package test's dpkg-shlibdeps"
command -v strip >/dev/null 2>&1 || install binutils "the package test's strip"
# The sandbox test runs ferry under strace against the unit's syscall filter.
command -v strace >/dev/null 2>&1 || install strace "the sandbox test's system call trace"
# The WebSocket test's client is MQTT.js (tests/js, pinned in its
# package-lock.json), run by Node.js, as browser panels and Node
# dashboards connect.
# The power-cut shim (tests/support/powercut.c) and the C example are
# compiled with the system's gcc.
command -v gcc >/dev/null 2>&1 || install gcc "the power-cut shim's and the C example's compiler"
# The certificate recipe in docs/SECURITY.md is run as written: openssl.
command -v openssl >/dev/null 2>&1 || install openssl "the certificate recipe test's openssl"
command -v node >/dev/null 2>&1 || install nodejs "the WebSocket test's MQTT.js runtime"
command -v npm >/dev/null 2>&1 || install npm "to install MQTT.js for the WebSocket test"
[ -f tests/js/node_modules/mqtt/package.json ] ||
    (cd tests/js && npm ci --no-audit --no-fund --loglevel=error)
# rustfmt and clippy are rustup components a minimal toolchain lacks.
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
# The tests start their own Mosquitto on free ports; the packaged service
# is not needed. Benches are not run here (they are long; see
# docs/BENCHMARKS.md), and there are no doc tests. One cargo invocation
# for both packages, so the dependencies both use are built once; the
# fork has unit tests only (and its standalone binary, built as a check).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The examples as programs (cargo test builds them as test harnesses only):
# the README's Sparkplug node is run by tests/readme_devices.rs.
cargo build --locked --examples
set +e
cargo test --locked --workspace --features ferry/system-tests --no-fail-fast \
    --lib --bins --tests --examples "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# Where cargo put the binary (CARGO_TARGET_DIR or a config may move it).
target_dir=$(cargo metadata --locked --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
# The unit, verified as installed except that it runs the binary just
# built (verify refuses an ExecStart that does not exist). systemd-analyze
# exits 0 on a line it could not parse and only says so: any output fails.
if [ "$status" -eq 0 ]; then
    unit_dir=$(mktemp -d)
    sed "s|/usr/local/bin/ferry|$target_dir/debug/ferry|g" systemd/ferry.service >"$unit_dir/ferry.service"
    set +e
    verify=$(systemd-analyze verify "$unit_dir/ferry.service" 2>&1)
    verify_status=$?
    set -e
    rm -rf "$unit_dir"
    if [ "$verify_status" -ne 0 ] || [ -n "$verify" ]; then
        echo "test.sh: systemd-analyze verify systemd/ferry.service failed:" >&2
        echo "$verify" >&2
        status=1
    else
        echo "systemd-analyze verify systemd/ferry.service: ok"
    fi
fi
# The checks beside the tests, each run whatever the others gave:
# formatting; clippy on every target of the workspace, the system tests
# compiled in so that their code is linted too; and the public docs of
# the workspace (ferry's own and the vendored crates': a ferry module's
# docs may name private items, left unlinked there, see Cargo.toml's
# [lints.rustdoc]). Warnings are errors in clippy and the docs.
checks=""
# check NAME COMMAND...: runs COMMAND; its failure fails the script.
check() {
    local name=$1
    shift
    echo "test.sh: $name" >&2
    if "$@"; then
        checks="$checks $name ok;"
    else
        echo "test.sh: $name failed" >&2
        checks="$checks $name FAILED;"
        status=1
    fi
}
check "cargo fmt" cargo fmt --all --check
check "cargo clippy" cargo clippy --locked --workspace --all-targets --features ferry/system-tests \
    -- -D warnings
check "cargo doc" env RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps
# sum WORD [PACKAGE]: the test binaries' "N WORD" counts, all of them or
# those of PACKAGE's binaries (named by cargo's "Running ... (.../NAME-hash)"
# lines; ferry's are ferry-*, tests-*, and its examples; the vendored
# httpdate's 8 count in the total only).
sum() {
    awk -v word="$1" -v pkg="${2:-}" '
        /^ *Running / { bin = $NF; sub(/.*\//, "", bin); sub(/-[0-9a-f]+\)$/, "", bin) }
        /^test result: / {
            if (pkg == "rumqttd" && bin != "rumqttd") next
            if (pkg == "ferry" && (bin == "rumqttd" || bin == "httpdate")) next
            for (i = 1; i < NF; i++) if ($(i + 1) ~ "^" word) n += $i
        }
        END { print n + 0 }' "$log"
}
echo "tests: $(sum passed) passed, $(sum failed) failed" \
    "(ferry $(sum passed ferry) passed, $(sum failed ferry) failed;" \
    "vendored rumqttd $(sum passed rumqttd) passed, $(sum failed rumqttd) failed)"
echo "checks:${checks%;}"
exit "$status"
