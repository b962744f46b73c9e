#!/usr/bin/env bash
# Restorer kill campaign, longer than the one CI runs: N random instants
# (default 60) for each of four targets: `stasis restore` plain, --lazy,
# --from a page server, and the lazy restore's filler, SIGKILLed at that
# instant. Afterwards nothing may be left but a whole restored tree that
# passes its own check, and the image must be unchanged. Prints the
# figures; exits non-zero on any problem. SEED picks another sequence.
#   sudo scripts/restore-kill-campaign.sh [N] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
    echo "restore-kill-campaign: needs root (ptrace, clone3 set_tid); run: sudo $0" >&2
    exit 1
fi
STASIS_KILL_TRIALS="${1:-60}" STASIS_KILL_SEED="${2:-$RANDOM}" \
    cargo test -p stasis --test restore_kill --locked \
    a_killed_restorer_or_filler -- --nocapture 2>&1 |
    grep -E "^restore kill campaign|problems:|^(threads|tree) |^test result"
exit "${PIPESTATUS[0]}"
