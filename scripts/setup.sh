#!/usr/bin/env bash
# Install attn_dispatch for development into the project environment `.venv` at the repository
# root (created on the first run; the interpreter it is made from is never installed into, so a
# PEP 668 "externally managed" system python3 works). Safe to run again.
# Usage: bash scripts/setup.sh [--minimal] [--system-site-packages]
#   --minimal               only the core and the reference backend (enough for `attn-dispatch demo`)
#   --system-site-packages  let .venv see the base interpreter's packages, so an existing CUDA/ROCm
#                           torch is used instead of the CPU build (also ATTN_DISPATCH_SYSTEM_SITE=1)
# PYTHON names the interpreter .venv is made from (default python3). The test plugins under
# tests/plugins are not installed: the test session puts them on its own path (tests/conftest.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
minimal=0
system_site="${ATTN_DISPATCH_SYSTEM_SITE:-0}"
for arg in "$@"; do
  case "$arg" in
    --minimal) minimal=1 ;;
    --system-site-packages) system_site=1 ;;
    *) echo "setup: unknown option $arg (usage: setup.sh [--minimal] [--system-site-packages])" >&2
       exit 2 ;;
  esac
done
BASE="${PYTHON:-python3}"
VENV=.venv

# Debian/Ubuntu ship python3 without venv/ensurepip (package python3-venv): add it where we may.
ensure_venv_module() {
  "$BASE" -c "import venv, ensurepip" 2>/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing python3-venv (the venv module is missing)"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-venv
    "$BASE" -c "import venv, ensurepip" 2>/dev/null && return 0
  fi
  echo "setup: $BASE cannot create virtual environments (no venv/ensurepip module)." >&2
  echo "setup: install it (Debian/Ubuntu: sudo apt-get install python3-venv) and run again." >&2
  exit 1
}

if [ ! -x "$VENV/bin/python" ]; then
  ensure_venv_module
  venv_args=()
  if [ "$system_site" = 1 ]; then venv_args+=(--system-site-packages); fi
  echo "setup: creating $VENV from $("$BASE" -c 'import sys; print(sys.executable)')"
  "$BASE" -m venv "${venv_args[@]}" "$VENV"
elif [ "$system_site" = 1 ] && ! grep -qi "^include-system-site-packages *= *true" "$VENV/pyvenv.cfg"; then
  echo "setup: $VENV exists without --system-site-packages; remove it to create it with them" >&2
  exit 2
fi
PY="$PWD/$VENV/bin/python"
# Scripts called from here (backends/flydsl_rocm/ci_setup.sh) install into the same environment.
export PYTHON="$PY"
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

# PyTorch: keep one the environment already sees (a CUDA/ROCm build through
# --system-site-packages); else torch 2.13.0 from TORCH_INDEX_URL when set (the CPU-only wheels,
# about 200 MB: https://download.pytorch.org/whl/cpu), else from pip's configured index.
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch 2.13.0${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL}"
  pip_install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
echo "setup: installing the core and the reference backend (and numpy, which torch imports)"
pip_install "numpy" -e . -e backends/reference
if [ "$minimal" = 1 ]; then exit 0; fi

echo "setup: installing the other backends and test tools"
# triton pinned to the release the H200 measurements used, so CI checks the same compiler.
pip_install "pytest>=7" "ruff" "triton==3.6.0"
# transformers pinned for tests/integrations (tiny models built from configs, no downloads).
pip_install "transformers==5.17.0"
pip_install -e backends/torch_sdpa -e backends/triton
# FlashAttention-4 with its real dependency (flash-attn-4 and the CUTLASS DSL): its CPU tests
# check supports/explain and compile FA4's kernels in fake mode.
pip_install -e backends/flash_attn_cute
bash backends/flydsl_rocm/ci_setup.sh
# A test-plugin install left by an older set-up would list toy backends to the user.
if "$PY" -m pip show -q attn-dispatch-test-plugins 2>/dev/null; then
  "$PY" -m pip uninstall -y -q attn-dispatch-test-plugins
fi
