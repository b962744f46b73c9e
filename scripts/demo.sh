#!/usr/bin/env bash
# Builds Stasis and runs the built-in demo: start a workload, checkpoint it,
# kill it, restore it, and show it carrying on. Needs root (ptrace, clone3).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
if [ "$(id -u)" -ne 0 ]; then
    echo "demo: stasis needs root (ptrace any process, choose PIDs); run: sudo $0" >&2
    exit 1
fi
cargo build --release --locked -p stasis
./target/release/stasis check >/dev/null || ./target/release/stasis check
exec ./target/release/stasis demo "$@"
