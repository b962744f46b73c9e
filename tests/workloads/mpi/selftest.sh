#!/usr/bin/env bash
# Checks the MPI workloads themselves (no Stasis, no namespace hosts): each
# normal build must print PASS and exit 0, each -DSELFTEST_CORRUPT build
# must print FAIL and exit 1, with small sizes and 4 local ranks.
#   ./selftest.sh [OUT]      (OUT: where `make` put the binaries; default build)
set -uo pipefail
cd "$(dirname "$0")"
OUT=${1:-build}
make -s OUT="$OUT" all selftest || exit 1
declare -A ARGS=([nqueens]="10 2" [tsp]="10 2" [fft]="8 2" [gauss]="40 2" [matmult]="64 2" [sor]="64 20")
pass=0 fail=0
run() { # BINARY EXPECT(PASS|FAIL) ARGS...
    local bin=$1 want=$2 out rc last
    shift 2
    out=$(timeout 120 mpirun --allow-run-as-root --oversubscribe -np 4 "$bin" "$@" </dev/null 2>&1)
    rc=$?
    last=$(printf '%s\n' "$out" | grep -E '^(PASS|FAIL)' | tail -n1)
    if { [ "$want" = PASS ] && [ "$rc" = 0 ] && [[ "$last" == PASS* ]]; } ||
        { [ "$want" = FAIL ] && [ "$rc" = 1 ] && [[ "$last" == FAIL:* ]]; }; then
        pass=$((pass + 1))
        echo "ok   $bin $*: $last"
    else
        fail=$((fail + 1))
        echo "BAD  $bin $* (wanted $want, exit $rc):"
        printf '%s\n' "$out" | tail -n 20
    fi
}
for p in nqueens tsp fft gauss matmult sor; do
    # shellcheck disable=SC2086
    run "$OUT/$p" PASS ${ARGS[$p]}
    # shellcheck disable=SC2086
    run "$OUT/selftest/$p" FAIL ${ARGS[$p]}
done
echo "mpi workloads: $pass passed, $fail failed"
[ "$fail" = 0 ]
