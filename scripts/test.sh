#!/usr/bin/env bash
# Runs every test of Stasis: unit tests, the end-to-end dump/restore tests
# (real ptrace, clone3, userfaultfd: they need root), and the self-test of
# the C workloads (each must PASS untouched and FAIL when corrupted).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
if [ "$(id -u)" -ne 0 ]; then
    echo "test: the end-to-end tests need root (ptrace, clone3 set_tid); run: sudo $0" >&2
    exit 1
fi
echo "== workload self-test"
bash tests/workloads/selftest.sh "$(pwd)/target/workloads-selftest"
echo "== cargo test"
cargo test --workspace --locked 2>&1
