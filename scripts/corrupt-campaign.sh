#!/usr/bin/env bash
# Whole-image corruption campaign, longer than the one CI runs: N trials
# (default 500) of damage (flipped bit, truncation, zeroed range) to a random
# file of a checkpoint of four workloads (one process, threads, a process
# tree, an incremental chain with touch sets), each followed by a restore
# (plain, or --lazy) that must refuse naming the damaged file within 10 s
# and leave nothing behind. Prints the figures; exits non-zero on any
# problem. SEED picks another reproducible sequence.
#   sudo scripts/corrupt-campaign.sh [N] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
    echo "corrupt-campaign: needs root (ptrace, clone3 set_tid); run: sudo $0" >&2
    exit 1
fi
STASIS_CORRUPT_TRIALS="${1:-500}" STASIS_CORRUPT_SEED="${2:-$RANDOM}" \
    cargo test -p stasis --test corruption --locked \
    damaged_images_are_refused_naming_the_file -- --nocapture 2>&1 |
    grep -E "^corruption campaign|problems:|^(heap|threads|tree|chain|inspect) |^test result"
exit "${PIPESTATUS[0]}"
