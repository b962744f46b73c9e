#!/usr/bin/env bash
# Fuzzes every decoder of untrusted bytes with cargo-fuzz (libFuzzer): the
# targets and their seed corpora are in fuzz/ (see fuzz/README.md).
#
#   scripts/fuzz.sh smoke            each target for 10 s, built at opt-level 1 (what CI runs)
#   scripts/fuzz.sh long [SECONDS]   each target for SECONDS (default 600)
#   scripts/fuzz.sh list             the targets
#
# Environment: FUZZ_TARGETS="a b" (a subset), FUZZ_JOBS=N (targets run at
# once; default one per CPU for smoke, 1 for long), FUZZ_SANITIZER=
# address|none (default: none for smoke, address for long; every decoder
# fuzzed is safe Rust, where AddressSanitizer finds what a panic already
# shows, and building every dependency instrumented took the smoke 5.6
# min here against 3.6).
# Prints the executions of each target; exits non-zero if any target found
# a crash, a hang (an input over 10 s), or an allocation over the limits.
# The input that failed is kept under fuzz/artifacts/TARGET/.
# cargo-fuzz is installed if missing; it runs on stable Rust through
# RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

log() { printf 'fuzz: %s\n' "$*" >&2; }

mode=${1:-smoke}
case "$mode" in
smoke) secs=10 ;;
long) secs=${2:-600} ;;
list) ;;
*)
    echo "usage: $0 smoke | long [SECONDS] | list" >&2
    exit 2
    ;;
esac

if [ -d "$HOME/.cargo/bin" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v c++ >/dev/null 2>&1; then
    # libfuzzer-sys compiles libFuzzer (C++).
    log "installing a C++ compiler"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
cd fuzz

targets=${FUZZ_TARGETS:-$(cargo fuzz list)}
if [ "$mode" = list ]; then
    echo "$targets"
    exit 0
fi
if [ "$mode" = smoke ]; then
    san=${FUZZ_SANITIZER:-none}
else
    san=${FUZZ_SANITIZER:-address}
fi
# The smoke builds without optimizations (a release build of every
# dependency with one codegen unit was most of its time).
dev=
if [ "$mode" = smoke ]; then dev=--dev; fi
if [ "$mode" = smoke ]; then
    jobs=${FUZZ_JOBS:-$(nproc)}
else
    jobs=${FUZZ_JOBS:-1}
fi

log "building the targets (sanitizer: $san)"
cargo fuzz build $dev -s "$san" >&2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Runs one target for $secs seconds. New inputs go to a scratch corpus; the
# committed seeds are only read.
run_one() {
    local t=$1
    mkdir -p "$work/$t" "artifacts/$t"
    local out="$work/$t.log"
    local rc=0
    cargo fuzz run $dev -s "$san" "$t" "$work/$t" "corpus/$t" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
        -print_final_stats=1 -close_fd_mask=1 >"$out" 2>&1 || rc=$?
    local execs
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -1)
    [ -n "$execs" ] || execs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$out" | tail -1)
    if [ "$rc" -eq 0 ]; then
        printf '%-14s ok      %12s executions in %s s\n' "$t" "${execs:-?}" "$secs"
    else
        printf '%-14s FAILED  %12s executions (exit %s); log:\n' "$t" "${execs:-?}" "$rc"
        grep -E 'ERROR|panicked|SUMMARY|artifact|Test unit written' "$out" | head -20 | sed 's/^/    /'
        cp "$out" "artifacts/$t/last-run.log"
        return 1
    fi
}

failed=0
running=0
for t in $targets; do
    run_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n || failed=1
        running=$((running - 1))
    fi
done
while [ "$running" -gt 0 ]; do
    wait -n || failed=1
    running=$((running - 1))
done
if [ "$failed" -ne 0 ]; then
    log "a target failed: the input is under fuzz/artifacts/TARGET/ (reproduce: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET FILE)"
    exit 1
fi
log "every target ran $secs s without a finding"
