#!/usr/bin/env bash
# Install attn_dispatch for development: the core, every backend, the test plugins and the tools
# the tests need. Safe to run again. Usage: bash scripts/setup.sh [--minimal]
#   --minimal  only the core and the reference backend (enough for `attn-dispatch demo`)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

# PyTorch: keep an existing install (a CUDA/ROCm build on a GPU machine); else the CPU build.
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch (CPU build)"
  pip_install "torch==2.13.0"
fi
echo "setup: installing the core and the reference backend"
pip_install -e . -e backends/reference
if [ "${1:-}" = "--minimal" ]; then exit 0; fi

echo "setup: installing the other backends, the test plugins and test tools"
# triton pinned to the release the H200 measurements used, so CI checks the same compiler.
pip_install "pytest>=7" "ruff" "triton==3.6.0"
# transformers pinned for tests/integrations (tiny models built from configs, no downloads).
pip_install "transformers==5.17.0"
pip_install -e backends/torch_sdpa -e backends/triton -e tests/plugins
# FlashAttention-4 with its real dependency (flash-attn-4 and the CUTLASS DSL): its CPU tests
# check supports/explain and compile FA4's kernels in fake mode.
pip_install -e backends/flash_attn_cute
bash backends/flydsl_rocm/ci_setup.sh
