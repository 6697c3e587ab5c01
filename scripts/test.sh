#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole default test suite: the core, every backend, lint.
# Extra arguments go to pytest (e.g. -m slow for the exhaustive matrices).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
# CI installs FlyDSL (setup.sh): there its compile tests must run, so a missing one fails them.
if [ "${CI:-}" = true ]; then export ATTN_DISPATCH_REQUIRE_FLYDSL=1; fi
bash scripts/setup.sh
echo "test: ruff (lint and format)"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "test: pytest"
shopt -s nullglob
"$PY" -m pytest tests backends/*/tests benchmarks --durations=15 "$@"
if [ "${CI:-}" = true ]; then
  bash backends/flydsl_rocm/ci_oldest.sh
  bash tests/integrations/ci_transformers_newest.sh
fi
