#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh) and run the whole default test suite: the core, every backend,
# lint. Extra arguments go to pytest (e.g. -m slow for the exhaustive matrices, or a test file).
# Set-up options (PYTHON, ATTN_DISPATCH_SYSTEM_SITE=1, TORCH_INDEX_URL): see scripts/setup.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# CI installs FlyDSL (setup.sh): there its compile tests must run, so a missing one fails them.
if [ "${CI:-}" = true ]; then export ATTN_DISPATCH_REQUIRE_FLYDSL=1; fi
bash scripts/setup.sh
PY="$PWD/.venv/bin/python"
export PYTHON="$PY"
echo "test: ruff (lint and format)"
"$PY" -m ruff check .
"$PY" -m ruff format --check .
echo "test: pytest"
# With no path among the arguments pytest runs the testpaths of pyproject.toml (tests,
# backends/*/tests, benchmarks); a path given replaces them, options alone add to them.
"$PY" -m pytest --durations=30 "$@"
if [ "${CI:-}" = true ]; then
  bash backends/flydsl_rocm/ci_oldest.sh
  bash tests/integrations/ci_transformers_newest.sh
fi
