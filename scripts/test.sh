#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole default test suite: the core, every backend, lint.
# Extra arguments go to pytest (e.g. -m slow for the exhaustive matrices).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
bash scripts/setup.sh
echo "test: ruff (lint and format)"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "test: pytest"
shopt -s nullglob
"$PY" -m pytest tests backends/*/tests benchmarks --durations=15 "$@"
