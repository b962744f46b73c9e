#!/bin/sh
# Open MPI's remote launcher for namespace hosts (scripts/hosts.sh), used as
# `mpirun --mca plm_rsh_agent scripts/mpi-rsh.sh`: it stands in for ssh.
# Open MPI calls it as `mpi-rsh.sh HOST COMMAND...` (like ssh, the words of
# COMMAND form one shell command line: Open MPI quotes them for a remote
# shell). It runs that command in HOST's network namespace and a fresh UTS
# namespace named HOST, so the orted there sees itself on HOST. It execs
# down to a shell running COMMAND: on each host the tree is
# mpirun -> sh -> orted (one process tree across the hosts). For a job
# whose hosts' parts are trees of their own (as with ssh on a cluster, so
# that each host's stasis agent can checkpoint its part), use
# `mpi-job.sh --rshd` (tests/workloads/mpi/rshd.c and rsh.c) instead.
# Needs root.
set -eu
while [ $# -gt 0 ]; do
    case "$1" in
        -x | -T | -q) shift ;; # ssh options Open MPI may add: meaningless here
        *) break ;;
    esac
done
[ $# -ge 2 ] || { echo "mpi-rsh: usage: $0 HOST COMMAND..." >&2; exit 2; }
h=$1
shift
# shellcheck disable=SC2016
exec ip netns exec "$h" unshare --uts /bin/sh -c 'hostname "$1" && eval "$0"' "$*" "$h"
