#!/usr/bin/env bash
# Runs every check of Stasis, each step even when an earlier one failed:
#   fmt       cargo fmt --all -- --check
#   mpi-workloads  the self-test of the six MPI programs (tests/workloads/mpi)
#   workloads the self-test of the C workloads (each must PASS untouched and
#             FAIL when corrupted), run beside the test build
#   test      cargo test --workspace --locked --no-fail-fast: unit tests and
#             the end-to-end dump/restore tests (real ptrace, clone3,
#             userfaultfd: they need root), TEST_LANES binaries at a time
#   clippy    the lints of `cargo clippy --workspace --all-targets --locked
#             -- -D warnings`, run in the test build (see cargo_test)
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
# The hugetlb workload needs huge pages: keep a pool of at least 64
# (128 MiB with 2 MiB pages; a host that has more keeps them).
if [ -w /proc/sys/vm/nr_hugepages ] && [ "$(cat /proc/sys/vm/nr_hugepages)" -lt 64 ]; then
    echo 64 > /proc/sys/vm/nr_hugepages
fi
# A CI run builds everything once from a clean checkout: incremental
# compilation caches (about 8 GB here) would only be written, never used.
if [ -n "${CI:-}" ]; then
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi
# Tests restore processes at their PIDs while others run beside them: with
# 32768 PIDs (this VM's default) a thread's freed TID is soon taken by
# another test's process and the restore finds it in use (EEXIST). The
# 64-bit kernel's largest PID space makes that 128 times rarer.
if [ -w /proc/sys/kernel/pid_max ] && [ "$(cat /proc/sys/kernel/pid_max)" -lt 4194304 ]; then
    echo 4194304 > /proc/sys/kernel/pid_max
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

# step_beside NAME CMD...: starts CMD in the background (its output kept
# aside) to run beside the next steps; step_joined NAME: waits for it,
# prints its output and records it as `step` does. The workload self-test
# mostly sleeps (each workload runs a while, then is signalled): beside
# the test build it costs the build little and the run its three minutes.
declare -A beside_pid beside_out beside_t0
step_beside() {
    local name=$1
    shift
    beside_out[$name]=$(mktemp)
    beside_t0[$name]=$(date +%s)
    (
        rc=0
        "$@" || rc=$?
        echo "$(date +%s) $rc" >"${beside_out[$name]}.end"
        exit "$rc"
    ) >"${beside_out[$name]}" 2>&1 &
    beside_pid[$name]=$!
}
step_joined() {
    local name=$1 rc end
    set +e
    wait "${beside_pid[$name]}" 2>/dev/null
    rc=$?
    set -e
    echo "== $name (ran beside the steps before)"
    cat "${beside_out[$name]}"
    # Its end and status as it recorded them (a `wait` elsewhere may have
    # reaped it already).
    end=$(date +%s)
    if [ -s "${beside_out[$name]}.end" ]; then
        read -r end rc <"${beside_out[$name]}.end"
    fi
    rm -f "${beside_out[$name]}" "${beside_out[$name]}.end"
    if [ "$rc" -eq 0 ]; then
        steps+=("$name ok ($((end - beside_t0[$name])) s, beside)")
    else
        steps+=("$name FAILED (exit $rc, $((end - beside_t0[$name])) s, beside)")
        failed_steps=$((failed_steps + 1))
    fi
}

# The test binaries, heaviest first (the order lanes take them in); the
# others follow in cargo's order.
HEAVY="workloads concurrent cluster_mpi cluster_hosts dump_kill s3 real_programs versitygw corruption incremental"

# cargo_test: cargo test --workspace --no-fail-fast, with the test binaries
# run TEST_LANES at a time (default: the number of CPUs) rather than one
# after the other: a binary alone seldom keeps every CPU busy (its tests
# wait on processes, hosts and servers too). Each binary runs from its package's directory, as
# under cargo, with its own output kept and printed whole when it ends, with
# cargo's `Running` line before it (the summary below reads those). The doc
# tests run last, through cargo.
#
# Clippy's lints run in this build: the workspace's crates are compiled by
# clippy-driver (RUSTC_WORKSPACE_WRAPPER, as `cargo clippy` runs it), with
# the lints capped at warnings so that a lint does not keep the tests from
# running; the `clippy` step (clippy_verdict) fails on any warning, as
# `cargo clippy --workspace --all-targets -- -D warnings` would. Every
# dependency is built once, not once for clippy and once for the tests.
# The filter prints each diagnostic as cargo would and counts them.
cargo_test() {
    local work rc=0 lanes=${TEST_LANES:-$(nproc)} n=0 i driver
    work=$(mktemp -d)
    driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)
    if [ -z "$driver" ]; then
        echo "test: clippy-driver not found (rustup component add clippy)" | tee -a "$log"
        return 1
    fi
    # (Local to this function: the fuzz build is not linted.)
    local -x RUSTC_WORKSPACE_WRAPPER=$driver CLIPPY_ARGS=--cap-lints=warn__CLIPPY_HACKERY__
    cargo test --workspace --locked --no-run --message-format=json |
        python3 -c '
import json, sys
out, report = open(sys.argv[1], "w"), sys.argv[2]
counts = {"warning": 0, "error": 0}
for line in sys.stdin:
    out.write(line)
    try:
        m = json.loads(line)
    except ValueError:
        sys.stderr.write(line)
        continue
    if m.get("reason") == "compiler-message":
        msg = m["message"]
        sys.stderr.write(msg.get("rendered") or msg["message"] + "\n")
        if msg["level"] in counts:
            counts[msg["level"]] += 1
out.close()
with open(report, "w") as f:
    f.write("%d %d\n" % (counts["warning"], counts["error"]))
' "$work/build.json" "$lint_report"
    if [ "${PIPESTATUS[0]}" -ne 0 ]; then
        rm -rf "$work"
        echo "test: the build failed" | tee -a "$log"
        return 1
    fi
    # One line per test binary: DIR <tab> SHOWN <tab> EXE <tab> PACKAGE,
    # heaviest first.
    HEAVY=$HEAVY python3 - "$work/build.json" >"$work/bins" <<'PY'
import json, os, sys
heavy = os.environ["HEAVY"].split()
bins = []
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m["profile"]["test"] or not m.get("executable"):
        continue
    t = m["target"]
    root = os.path.dirname(m["manifest_path"])
    src = os.path.relpath(t["src_path"], root)
    shown = src if t["kind"][0] == "test" else "unittests " + src
    rank = heavy.index(t["name"]) if t["kind"][0] == "test" and t["name"] in heavy else len(heavy)
    pkg = m["package_id"].split("#")[0].rstrip("/").split("/")[-1]
    bins.append((rank, len(bins), root, shown, m["executable"], pkg))
for b in sorted(bins):
    print("\t".join(b[2:]))
PY
    # The lanes: each takes the next binary from the list until none is left.
    : >"$work/next"
    lane() {
        local dir shown exe pkg k t0 res cpu
        while :; do
            k=$(flock "$work/next" bash -c 'k=$(wc -l <"$1"); echo x >>"$1"; echo "$k"' _ "$work/next")
            IFS=$'\t' read -r dir shown exe pkg < <(sed -n "$((k + 1))p" "$work/bins") || return 0
            [ -n "$exe" ] || return 0
            t0=$(date +%s)
            echo "     Running $shown ($exe)" >"$work/$k.out"
            res=0
            # (`times` in the subshell: the CPU time of the binary and of
            # every process it waited for, its workloads, stasis runs and
            # servers among them.)
            (
                cd "$dir" || exit 1
                r=0
                LD_LIBRARY_PATH="$(dirname "$exe"):${LD_LIBRARY_PATH:-}" "$exe" || r=$?
                times >"$work/$k.times"
                exit "$r"
            ) >>"$work/$k.out" 2>&1 || res=$?
            echo "$res" >"$work/$k.rc"
            res=$(grep -h '^test result:' "$work/$k.out" | tail -1 | sed 's/; [0-9]* ignored.*//')
            cpu=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); c += a[1] * 60 + a[2] } printf "%.0f", c }' "$work/$k.times" 2>/dev/null)
            printf 'test: %-45s %s (%d s, %s CPU-s)\n' "$pkg $shown" "${res:-ended without a result}" $(($(date +%s) - t0)) "${cpu:-?}"
        done
    }
    # (Only the lanes are waited for: a step running beside is not ours.)
    local lane_pids=()
    for ((i = 0; i < lanes; i++)); do
        lane &
        lane_pids+=($!)
    done
    wait "${lane_pids[@]}"
    n=$(wc -l <"$work/bins")
    for ((i = 0; i < n; i++)); do
        cat "$work/$i.out" >>"$log"
        [ "$(cat "$work/$i.rc" 2>/dev/null)" = 0 ] || rc=1
    done
    # Every binary's output, whole, in the order they were taken.
    cat "$log"
    cargo test --workspace --locked --no-fail-fast --doc 2>&1 | tee -a "$log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    rm -rf "$work"
    return "$rc"
}

# clippy_verdict: the lints of the test build (see cargo_test): fails on
# any warning or error diagnostic of the workspace's crates.
clippy_verdict() {
    local w e
    if ! read -r w e <"$lint_report" 2>/dev/null; then
        echo "clippy: the test build did not finish, so its lints are not known"
        return 1
    fi
    echo "clippy: $w warning(s), $e error(s) in the test build (printed with it)"
    [ "$w" -eq 0 ] && [ "$e" -eq 0 ]
}

lint_report=$(mktemp)
trap 'rm -f "$log" "$lint_report"' EXIT
: >"$lint_report"
step fmt cargo fmt --all -- --check
step mpi-workloads bash tests/workloads/mpi/selftest.sh "$(pwd)/target/mpi-workloads-selftest"
step_beside workloads bash tests/workloads/selftest.sh "$(pwd)/target/workloads-selftest"
step test cargo_test
step_joined workloads
step clippy clippy_verdict
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
# Why each failed, short (the panic message of its `---- NAME stdout ----`
# section, up to the backtrace): CI shows the end of this output only.
awk '/^---- .* stdout ----$/ { if (shown < 8) { grab = 1; n = 0; shown++; print "  why " $2 ":" }; next }
     grab && (/^stack backtrace:/ || /^---- / || /^failures:$/ || n >= 12) { grab = 0 }
     grab && NF { print "    " substr($0, 1, 300); n++ }' "$log"
for s in "${steps[@]}"; do
    echo "  $s"
done
elapsed=$(($(date +%s) - start))
printf 'time: %dm%02ds\n' $((elapsed / 60)) $((elapsed % 60))
awk '/^ +(Running|Doc-tests) / { if (bin && !done) crashed++; bin = 1; done = 0 }
     /^test result:/ { done = 1; for (i = 1; i <= NF; i++) { if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
     END { if (bin && !done) crashed++; printf "total: %d passed, %d failed\n", p, f + crashed }' "$log"
[ "$failed_steps" -eq 0 ]
