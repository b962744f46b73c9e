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
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --locked 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { printf "total: %d passed, %d failed\n", p, f }' "$log"
exit "$rc"
