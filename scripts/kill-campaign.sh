#!/usr/bin/env bash
# The long dumper-kill campaign of issue 12: every dump mode and `stasis run`
# SIGKILLed at seeded random instants, TRIALS times each, and dumps of a TCP
# node (two `mesh` nodes streaming to each other) likewise (default 75: 8
# campaigns x 75 = 600 kills), plus the deterministic deaths at every step
# of the remote syscalls. Each kill checks that the dumped tree runs on
# untouched; see crates/stasis/tests/dump_kill.rs.
#
#   sudo scripts/kill-campaign.sh [TRIALS] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
trials=${1:-75}
seed=${2:-$(date +%s)}
echo "kill campaign: $trials kills per mode, seed $seed (replay: $0 $trials $seed)"
STASIS_KILL_TRIALS=$trials STASIS_KILL_SEED=$seed \
    cargo test --release --locked -p stasis --test dump_kill -- --test-threads 1 --nocapture 2>&1 |
    grep -E '^(test |kill campaign seed|\[|.*kills, |.*failing points|test result)|panicked' 
