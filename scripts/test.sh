#!/usr/bin/env bash
# Run the test suite. Pass pytest options through, e.g.:
#   ./scripts/test.sh                   the whole tier (what a change must pass; budget 15 min)
#   ./scripts/test.sh -m "not slow"     the quick tier: nothing that takes 3 s or more (3 min)
#   ./scripts/test.sh --soak -m soak    the soak tier alone: long kill loops, the rest of the
#                                       scenario matrix, image builds (CI runs it after the whole)
#   ./scripts/test.sh tests/train -x
# Tests run in RECOVER_TEST_WORKERS processes (pytest-xdist; default 4), handed out as workers
# free up (worksteal): most real-daemon tests spend their time waiting on Slurm (requeue
# delays, slurmd timeouts), so on the 2-core machines we run four at once.
# RECOVER_TEST_WORKERS=0 runs everything in this one process.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian installs slurmctld, slurmd and munged in /usr/sbin, which a non-login PATH may lack;
# without them the Slurm tier would be skipped rather than run.
export PATH="$PATH:/usr/sbin:/sbin"
workers="${RECOVER_TEST_WORKERS:-4}"
# What several workers' tests share (the control-run cache, the one
# demo run) is shared through files, not by pinning tests to a worker.
parallel=(-n "$workers" --dist worksteal)
[[ "$workers" == 0 ]] && parallel=()
start=$SECONDS
status=0
.venv/bin/python -m pytest "${parallel[@]}" "$@" || status=$?
# The suite has a time budget (README, "Tests"): say what this run took.
echo "test.sh: $((SECONDS - start)) s (pytest exit $status)"
exit "$status"
