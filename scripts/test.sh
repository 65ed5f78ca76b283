#!/usr/bin/env bash
# Run the whole test suite (all tiers). Pass pytest options through, e.g.:
#   ./scripts/test.sh -m "not slow"     skip the long crash loops
#   ./scripts/test.sh tests/train -x
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m pytest "$@"
