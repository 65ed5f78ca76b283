#!/usr/bin/env bash
# Run the whole test suite (all tiers). Pass pytest options through, e.g.:
#   ./scripts/test.sh -m "not slow"     skip the long crash loops
#   ./scripts/test.sh tests/train -x
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian installs slurmctld, slurmd and munged in /usr/sbin, which a non-login PATH may lack;
# without them the Slurm tier would be skipped rather than run.
export PATH="$PATH:/usr/sbin:/sbin"
exec .venv/bin/python -m pytest "$@"
