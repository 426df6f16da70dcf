#!/usr/bin/env bash
# Runs ferry's whole test suite on a fresh Debian machine: installs what the
# integration tests need (Mosquitto, the real upstream broker), then
# `cargo test`. Extra arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
    echo "test.sh: installing mosquitto (the tests' upstream broker)" >&2
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq mosquitto >/dev/null
    # Debian starts the packaged broker on port 1883, which is ferry's own
    # default south port. The tests start their own; stop the one we installed.
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet mosquitto 2>/dev/null; then
        echo "test.sh: stopping and disabling the packaged mosquitto service (port 1883 is ferry's)" >&2
        $sudo_cmd systemctl disable --now mosquitto >/dev/null 2>&1 || true
    fi
fi
# The tests start their own Mosquitto on free ports; the packaged service
# is not needed. Benches are not run here (they are long; see
# docs/BENCHMARKS.md), and there are no doc tests.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --locked --lib --bins --tests --examples "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
sum() { grep -oE "[0-9]+ $1" "$log" | awk '{ n += $1 } END { print n + 0 }'; }
echo "tests: $(sum passed) passed, $(sum failed) failed"
exit "$status"
