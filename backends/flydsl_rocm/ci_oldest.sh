#!/usr/bin/env bash
# The compile/ISA and FlyDSL-API tests again on the oldest FlyDSL the backend accepts (the >=
# bound of FLYDSL_REQUIREMENT), installed into a throwaway directory put first on PYTHONPATH; the
# installed (newest) FlyDSL is left alone. Missing or wrong FlyDSL fails, never skips.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY="${PYTHON:-python3}"
oldest="$("$PY" -c 'from attn_dispatch_flydsl_rocm._support import oldest_flydsl; print(oldest_flydsl())')"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" "flydsl==$oldest"
export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" ATTN_DISPATCH_REQUIRE_FLYDSL=1
export ATTN_DISPATCH_FLYDSL_CACHE="$dir/cache"
"$PY" -c "from importlib.metadata import version as v; assert v('flydsl') == '$oldest', v('flydsl')"
echo "flydsl_rocm: compile/ISA and API tests on flydsl $oldest"
"$PY" -m pytest -q -p no:cacheprovider backends/flydsl_rocm/tests/test_flydsl_compile.py \
  backends/flydsl_rocm/tests/test_flydsl_api.py
