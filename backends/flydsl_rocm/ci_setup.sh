#!/usr/bin/env bash
# What the flydsl_rocm tests need on a CPU-only Debian/Ubuntu CI machine: the flydsl wheel and an
# LLVM lld able to link gfx942/gfx950 code objects (the package points a private ROCM_PATH at it).
# The kernels use hardware exp2 (no OCML), so rocm-device-libs is not needed.
# --upgrade: the newest FlyDSL the backend accepts, even where an older one is installed
# (ci_oldest.sh covers the oldest). Output: one "flydsl_rocm: ..." line per step, pip's own
# output only for a download (flydsl is 275 MB).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
PY="${PYTHON:-python3}"
FLYDSL="flydsl>=0.4.2,<0.6"
installed() { "$PY" "$root/scripts/setup_installed.py" check "$@"; }

# The names attn_dispatch_flydsl_rocm._toolchain looks for.
has_lld() {
  local name
  for name in ld.lld-19 ld.lld-20 ld.lld-18 ld.lld-17 ld.lld; do
    command -v "$name" >/dev/null && return 0
  done
  return 1
}
if has_lld; then
  :
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "flydsl_rocm: installing lld-19 through apt-get (no ld.lld found; it links the code objects)"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends lld-19 >/dev/null
else
  echo "flydsl_rocm: no ld.lld found and not root, so not installed: the compile tests check the" \
    "ISA without linking; for code objects install it (Debian/Ubuntu: sudo apt-get install lld-19)"
fi
if installed "$FLYDSL"; then
  echo "flydsl_rocm: flydsl (a newer release within $FLYDSL, if any)"
  "$PY" -m pip install --quiet --disable-pip-version-check --upgrade "$FLYDSL"
else
  echo "flydsl_rocm: flydsl ($FLYDSL, 275 MB)"
  "$PY" -m pip install --disable-pip-version-check --progress-bar on --upgrade "$FLYDSL"
fi
echo "flydsl_rocm: the flydsl_rocm backend"
if ! installed "$here"; then
  "$PY" -m pip install --quiet --disable-pip-version-check -e "$here"
  "$PY" "$root/scripts/setup_installed.py" record "$here"
fi
