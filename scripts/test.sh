#!/usr/bin/env bash
# Run the whole test suite (all tiers). Pass pytest options through, e.g.:
#   ./scripts/test.sh -m "not slow"     skip the long crash loops and the scenario matrix
#   ./scripts/test.sh tests/train -x
# Tests run in RECOVER_TEST_WORKERS processes (pytest-xdist; default 3): most real-daemon
# tests spend their time waiting on Slurm (requeue delays, slurmd timeouts), so on the 2-core
# machines we run on three at once. Measured 2026-12-06: the whole suite 26-27 minutes,
# -m "not slow" 11 (the budgets are 15 and 3: README, "Tests").
# RECOVER_TEST_WORKERS=0 runs everything in this one process.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian installs slurmctld, slurmd and munged in /usr/sbin, which a non-login PATH may lack;
# without them the Slurm tier would be skipped rather than run.
export PATH="$PATH:/usr/sbin:/sbin"
workers="${RECOVER_TEST_WORKERS:-3}"
# Plain load balancing: what several workers' tests share (the control-run cache, the one
# demo run) is shared through files, not by pinning tests to a worker.
parallel=(-n "$workers")
[[ "$workers" == 0 ]] && parallel=()
start=$SECONDS
status=0
.venv/bin/python -m pytest "${parallel[@]}" "$@" || status=$?
# The suite has a time budget (README, "Tests"): say what this run took.
echo "test.sh: $((SECONDS - start)) s (pytest exit $status)"
exit "$status"
