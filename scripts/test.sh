#!/usr/bin/env bash
# Runs every check of Stasis, each step even when an earlier one failed:
#   fmt       cargo fmt --all -- --check
#   clippy    cargo clippy --workspace --all-targets --locked -- -D warnings
#   workloads the self-test of the C workloads (each must PASS untouched and
#             FAIL when corrupted)
#   mpi-workloads  the same for the six MPI programs (tests/workloads/mpi)
#   test      cargo test --workspace --locked --no-fail-fast: unit tests and
#             the end-to-end dump/restore tests (real ptrace, clone3,
#             userfaultfd: they need root)
#   fuzz      bash scripts/fuzz.sh smoke (when that script exists)
# Then the status of each step, the wall time, and one closing line,
# `total: N passed, N failed`, over every test binary. Exits non-zero if any
# step failed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
if [ "$(id -u)" -ne 0 ]; then
    echo "test: the end-to-end tests need root (ptrace, clone3 set_tid); run: sudo $0" >&2
    exit 1
fi
start=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
steps=()
failed_steps=0

# step NAME CMD...: runs CMD, records "NAME ok (Ns)" or "NAME FAILED".
step() {
    local name=$1 t0 rc
    shift
    echo "== $name: $*"
    t0=$(date +%s)
    set +e
    "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
        steps+=("$name ok ($(($(date +%s) - t0)) s)")
    else
        steps+=("$name FAILED (exit $rc, $(($(date +%s) - t0)) s)")
        failed_steps=$((failed_steps + 1))
    fi
}

cargo_test() {
    cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}

step fmt cargo fmt --all -- --check
step clippy cargo clippy --workspace --all-targets --locked -- -D warnings
step workloads bash tests/workloads/selftest.sh "$(pwd)/target/workloads-selftest"
step mpi-workloads bash tests/workloads/mpi/selftest.sh "$(pwd)/target/mpi-workloads-selftest"
step test cargo_test
if [ -f scripts/fuzz.sh ]; then
    step fuzz bash scripts/fuzz.sh smoke
fi

echo "== summary"
# Tests that failed, by binary; a binary that ended without its result line
# (it crashed) counts as one failure.
awk '/^ +Running / { if (bin != "" && !done) { crashed++; print "  crashed: " bin } bin = $0; sub(/^ +Running /, "", bin); done = 0 }
     /^ +Doc-tests / { if (bin != "" && !done) { crashed++; print "  crashed: " bin } bin = $0; sub(/^ +/, "", bin); done = 0 }
     /^test .* \.\.\. FAILED$/ { sub(/ \.\.\. FAILED$/, ""); sub(/^test /, ""); print "  failed: " $0 " (" bin ")" }
     /^test result:/ { done = 1 }
     END { if (bin != "" && !done) { print "  crashed: " bin } }' "$log"
for s in "${steps[@]}"; do
    echo "  $s"
done
elapsed=$(($(date +%s) - start))
printf 'time: %dm%02ds\n' $((elapsed / 60)) $((elapsed % 60))
awk '/^ +(Running|Doc-tests) / { if (bin && !done) crashed++; bin = 1; done = 0 }
     /^test result:/ { done = 1; for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { if (bin && !done) crashed++; printf "total: %d passed, %d failed\n", p, f + crashed }' "$log"
[ "$failed_steps" -eq 0 ]
