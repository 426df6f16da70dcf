#!/usr/bin/env bash
# The long fuzz run: every protocol property test (src/protocol/props.rs)
# with CASES generated inputs each (default 1,000,000), in release mode.
# CI runs the same properties with proptest's default 256 cases.
#   scripts/fuzz.sh [CASES]
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-1000000}"
echo "fuzz.sh: ${cases} cases per property" >&2
PROPTEST_CASES="$cases" exec cargo test --release --locked --lib protocol::props -- --test-threads=2
