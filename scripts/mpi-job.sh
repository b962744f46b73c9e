#!/usr/bin/env bash
# Runs an MPI program over namespace hosts (scripts/hosts.sh). Needs root.
#
#   mpi-job.sh [--hosts N] [--ranks R] [--prefix P] [--subnet A.B.C.0/24]
#              [--pidfile F] [--keep-hosts] [--rshd] PROG [ARGS...]
#
# N hosts (default 4), R ranks (default 16, spread evenly: ceil(R/N) slots
# per host in the hostfile, filled host by host), prefix P (default
# stasis-h). The hosts are brought up if they are not (and then taken down
# at the end unless --keep-hosts); hosts that were already up are left up.
# PROG is a path, or the name of a program in tests/workloads/mpi (built
# with make if needed).
#
# mpirun runs "on" host 1 (its network namespace, a UTS namespace named
# after it), so all of the job's TCP stays inside the namespaces; it starts
# one orted per other host through scripts/mpi-rsh.sh (one process tree
# across the hosts: mpirun -> sh -> orted -> ranks).
#
# With --rshd, the job is launched as on a cluster with ssh between hosts:
# an `rshd` (tests/workloads/mpi/rshd.c) runs on each host 2..N (its network
# namespace and a UTS namespace named after it) and mpirun's launcher is
# `rsh` (rsh.c), a client that connects to the host's rshd. Each host's part
# of the job is then a tree of its own: host 1 has mpirun (-> rsh clients,
# its ranks), host i has rshd's child `sh` -> orted -> ranks. The rshds are
# killed at the end (their children run until the job ends).
#
# Output, on stdout:
#   mpi-job: hosts=P1,...,PN ranks=R hostfile=F
#   mpi-job: rshd HOST pid=PID         (with --rshd, for each host 2..N)
#   mpi-job: mpirun-pid=PID            (also written to --pidfile F)
#   ... the program's output ...
#   mpi-job: exit=STATUS elapsed=SECONDS
# and the exit status is mpirun's. SIGTERM/SIGINT are passed on to mpirun
# (which stops the job on every host).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
HOSTS=4
RANKS=16
PREFIX=stasis-h
SUBNET=10.213.0.0/24
PIDFILE=
KEEP=0
RSHD=0
RSH_PORT=7222

die() { printf 'mpi-job: %s\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --hosts) HOSTS=${2:?}; shift 2 ;;
        --ranks) RANKS=${2:?}; shift 2 ;;
        --prefix) PREFIX=${2:?}; shift 2 ;;
        --subnet) SUBNET=${2:?}; shift 2 ;;
        --pidfile) PIDFILE=${2:?}; shift 2 ;;
        --keep-hosts) KEEP=1; shift ;;
        --rshd) RSHD=1; shift ;;
        --) shift; break ;;
        -*) die "unknown option: $1" ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || die "usage: $0 [--hosts N] [--ranks R] [--prefix P] [--subnet S] [--pidfile F] [--keep-hosts] [--rshd] PROG [ARGS...]"
[[ "$HOSTS" =~ ^[1-9][0-9]*$ ]] || die "bad --hosts: $HOSTS"
[[ "$RANKS" =~ ^[1-9][0-9]*$ ]] || die "bad --ranks: $RANKS"
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces); run: sudo $0 ..."
command -v mpirun >/dev/null 2>&1 || die "mpirun is missing: run scripts/setup.sh as root"

PROG=$1
shift
if [[ "$PROG" != */* ]]; then
    make -s -C "$ROOT/tests/workloads/mpi" "build/$PROG" >&2
    PROG="$ROOT/tests/workloads/mpi/build/$PROG"
fi
PROG=$(realpath "$PROG")
[ -x "$PROG" ] || die "not an executable: $PROG"

# Hosts: reuse them if this prefix is up, else bring them up (and down at the end).
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mpi-job.XXXXXX")
OWN_HOSTS=0
RSHD_PIDS=()
cleanup() {
    local p
    for p in "${RSHD_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${RSHD_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
    if [ "$OWN_HOSTS" = 1 ] && [ "$KEEP" = 0 ]; then
        "$HERE/hosts.sh" down --prefix "$PREFIX" >&2 || true
    fi
}
trap cleanup EXIT
if ! ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "${PREFIX}1"; then
    OWN_HOSTS=1
    "$HERE/hosts.sh" up "$HOSTS" --prefix "$PREFIX" --subnet "$SUBNET" >&2
fi
for i in $(seq 1 "$HOSTS"); do
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "${PREFIX}$i" ||
        die "host ${PREFIX}$i is missing (prefix $PREFIX is up with fewer hosts)"
done
# The subnet of hosts that were already up is whatever they have.
SUBNET="$(ip -n "${PREFIX}1" -4 -o addr show dev eth0 | awk '{print $4}' | head -n1 | cut -d. -f1-3).0/24"

SLOTS=$(((RANKS + HOSTS - 1) / HOSTS))
HOSTFILE="$WORK/hostfile"
names=()
for i in $(seq 1 "$HOSTS"); do
    printf '%s slots=%d\n' "${PREFIX}$i" "$SLOTS" >>"$HOSTFILE"
    names+=("${PREFIX}$i")
done
echo "mpi-job: hosts=$(IFS=,; echo "${names[*]}") ranks=$RANKS hostfile=$HOSTFILE"

RSH_AGENT="$HERE/mpi-rsh.sh"
if [ "$RSHD" = 1 ]; then
    MPIDIR="$ROOT/tests/workloads/mpi"
    make -s -C "$MPIDIR" rsh >&2
    RSH_AGENT="$MPIDIR/build/rsh -p $RSH_PORT"
    base=$(echo "$SUBNET" | cut -d. -f1-3)
    for i in $(seq 2 "$HOSTS"); do
        log="$WORK/rshd.$i.log"
        (
            for fd in $(ls /proc/$BASHPID/fd); do
                [ "$fd" -le 2 ] || eval "exec $fd>&-"
            done
            exec "$HERE/hosts.sh" exec "${PREFIX}$i" "$MPIDIR/build/rshd" "$base.$((10 + i)):$RSH_PORT" </dev/null >"$log"
        ) &
        RSHD_PIDS+=("$!")
        echo "mpi-job: rshd ${PREFIX}$i pid=$!"
        for _ in $(seq 1 100); do
            grep -q '^rshd: listening' "$log" 2>/dev/null && break
            kill -0 "$!" 2>/dev/null || die "rshd on ${PREFIX}$i did not start"
            sleep 0.05
        done
        grep -q '^rshd: listening' "$log" || die "rshd on ${PREFIX}$i is not listening"
    done
fi

T0=$(date +%s%N)
(
    # The job gets stdin/stdout/stderr only (no fd the caller leaked: a
    # checkpoint of the job would have to carry it).
    for fd in $(ls /proc/$BASHPID/fd); do
        [ "$fd" -le 2 ] || eval "exec $fd>&-"
    done
    exec "$HERE/hosts.sh" exec "${PREFIX}1" mpirun --allow-run-as-root --oversubscribe \
        --hostfile "$HOSTFILE" -np "$RANKS" \
        --mca plm_rsh_agent "$RSH_AGENT" \
        --mca pml ob1 --mca btl tcp,self \
        --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET" \
        "$PROG" "$@" </dev/null
) &
MPIRUN=$!
echo "mpi-job: mpirun-pid=$MPIRUN"
if [ -n "$PIDFILE" ]; then
    echo "$MPIRUN" >"$PIDFILE.tmp"
    mv "$PIDFILE.tmp" "$PIDFILE"
fi
trap 'kill -TERM "$MPIRUN" 2>/dev/null || true' TERM INT
status=0
while :; do
    wait "$MPIRUN" && status=0 || status=$?
    # `wait` returns early (status > 128) when a trapped signal arrives.
    kill -0 "$MPIRUN" 2>/dev/null || break
done
echo "mpi-job: exit=$status elapsed=$(awk -v a="$T0" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f\n", (b - a) / 1e9 }')"
exit "$status"
