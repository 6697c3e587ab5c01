#!/usr/bin/env bash
# What the flydsl_rocm tests need on a CPU-only Debian/Ubuntu CI machine: the flydsl wheel and an
# LLVM lld able to link gfx942/gfx950 code objects (the package points a private ROCM_PATH at it).
# The kernels use hardware exp2 (no OCML), so rocm-device-libs is not needed.
# --upgrade: the newest FlyDSL the backend accepts, even where an older one is installed
# (ci_oldest.sh covers the oldest).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! command -v ld.lld-19 >/dev/null && ! command -v ld.lld >/dev/null; then
  apt-get update
  apt-get install -y --no-install-recommends lld-19
fi
PY="${PYTHON:-python3}"
"$PY" -m pip install --upgrade "flydsl>=0.4.2,<0.6"
"$PY" -m pip install -e "$here"
