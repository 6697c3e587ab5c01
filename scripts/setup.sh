#!/usr/bin/env bash
# Install attn_dispatch for development into the project environment `.venv` at the repository
# root (created on the first run; the interpreter it is made from is never installed into, so a
# PEP 668 "externally managed" system python3 works). Safe to run again: what is installed and
# unchanged is not installed again.
# Every pip install of the run is constrained by the stack of the platform (constraints/):
# constraints/nvidia.txt where an NVIDIA driver is present (the measured stack of
# docs/benchmarks.md: torch 2.11.0, triton 3.6.0, flash-attn-4 4.0.0b36), constraints/cpu.txt
# without a GPU driver (the stack CI tests); ROCm has none. A torch of the user's (--system-site-
# packages, TORCH_INDEX_URL, or one installed earlier at another version) is kept, and then only
# the pins other than torch and triton apply.
# Usage: bash scripts/setup.sh [--minimal] [--system-site-packages]
#   --minimal               only the core and the reference backend (enough for `attn-dispatch demo`)
#   --system-site-packages  let .venv see the base interpreter's packages, so an existing CUDA/ROCm
#                           torch is used instead of installing one (also ATTN_DISPATCH_SYSTEM_SITE=1)
# PYTHON names the interpreter .venv is made from (default python3). TORCH_INDEX_URL picks the
# index torch is installed from (default: chosen for the machine, see "PyTorch" below); a torch
# wheel file in a folder is found with PIP_FIND_LINKS=<folder> (pip's own setting).
# Output: one "setup: ..." line per step, and pip's own output (a line per package, progress
# bars) for the steps that download something large: torch, triton and the flash_attn_cute
# backend. Downloads are cached in .cache/pip (PIP_CACHE_DIR), so
# nothing is written outside the clone. The test plugins under tests/plugins are not installed:
# the test session puts them on its own path (tests/conftest.py).
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
if ! "$BASE" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: $BASE is not Python 3.11 or newer (set PYTHON to one, e.g. PYTHON=python3.12)" >&2
  exit 2
fi
VENV=.venv
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
has_nvidia_driver() { [ -e /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1; }
# The pinned stack of this platform (see the header); ROCm has none.
if [ "$(uname -s)" = Linux ] && has_nvidia_driver; then
  STACK=constraints/nvidia.txt
  stack_name="the measured stack"
elif [ "$(uname -s)" = Linux ] && [ -e /dev/kfd ]; then
  STACK=""
else
  STACK=constraints/cpu.txt
  stack_name="the CPU stack CI tests"
fi
# The version a constraints file pins for a distribution (empty: none).
pin() { sed -n "s/^$1==\([^ ;#]*\).*/\1/p" "$2"; }
TORCH_VERSION="$(pin torch "${STACK:-constraints/cpu.txt}")"
# triton for a torch that brings none (the CPU build): the release the H200 measurements used, so
# CI checks the same compiler. A CUDA or ROCm torch pins its own triton, which is kept.
TRITON_FOR_CPU_TORCH="$(pin triton constraints/cpu.txt)"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$PWD/.cache/pip}"

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
# Small steps: quiet. Large downloads: pip's own output, progress bars included.
pip_quiet() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }
pip_loud() { "$PY" -m pip install --disable-pip-version-check --progress-bar on "$@"; }
installed() { "$PY" scripts/setup_installed.py check "$@"; }
# Editable installs of this checkout, skipped when installed from here with the same pyproject.toml.
install_projects() {
  installed "$@" && return 0
  local args=()
  for dir in "$@"; do args+=(-e "$dir"); done
  pip_quiet "${args[@]}"
  "$PY" scripts/setup_installed.py record "$@"
}

# PyTorch: keep one the environment already sees (installed earlier, or a CUDA/ROCm build of the
# base interpreter through --system-site-packages); else install torch $TORCH_VERSION, the build
# chosen for the machine and said in one line, with its download size, before downloading.
# Without a GPU driver a CPU build is preferred from any source that has one (PyTorch's CPU index,
# else pip's configured indexes and PIP_FIND_LINKS folders): PyPI's Linux x86-64 build is the CUDA
# one, whose libraries are of no use there.
CUDA_TORCH_SIZE="about 2.7 GB to download, 4.6 GB installed: torch, triton and CUDA 13 libraries"
CPU_TORCH_SIZE="about 190 MB to download"
index_reachable() {
  "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15)" \
    "$1/torch/" 2>/dev/null
}
# Whether pip's configured sources offer the CPU build by its local version (+cpu).
cpu_wheel_offered() {
  "$PY" -m pip install --disable-pip-version-check --dry-run --quiet --no-deps \
    "torch==$TORCH_VERSION+cpu" >/dev/null 2>&1
}
install_torch() {
  local index="" spec="torch==$TORCH_VERSION" why
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    index="$TORCH_INDEX_URL"
    why="from $index (TORCH_INDEX_URL)"
  elif [ "$(uname -s)" != Linux ]; then
    why="from PyPI (this OS's build: no CUDA libraries)"
  elif has_nvidia_driver; then
    # PyPI's Linux torch (2.11.0 and later) is the CUDA 13.0 build: the driver must run CUDA 13.
    local cuda
    cuda="$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$' || true)"
    if [ -n "$cuda" ] && [ "$cuda" -lt 13 ]; then
      echo "setup: this NVIDIA driver runs CUDA $cuda, PyPI's torch $TORCH_VERSION needs CUDA 13:" \
        "update the driver, or set TORCH_INDEX_URL to PyTorch's index of a build it runs" \
        "(https://download.pytorch.org/whl/cu12x, see https://pytorch.org/get-started/locally/)" >&2
      exit 1
    fi
    why="with CUDA from PyPI: an NVIDIA driver is present ($CUDA_TORCH_SIZE)"
  elif [ -e /dev/kfd ]; then
    # PyTorch's ROCm builds are on its own index, one per ROCm release (rocmX.Y).
    local rocm
    rocm="$(grep -o '^[0-9]*\.[0-9]*' /opt/rocm/.info/version 2>/dev/null || true)"
    if [ -z "$rocm" ]; then
      echo "setup: an AMD GPU driver is present (/dev/kfd) but no ROCm release was found in" \
        "/opt/rocm/.info/version: set TORCH_INDEX_URL to PyTorch's index for your ROCm" \
        "(https://download.pytorch.org/whl/rocmX.Y), or keep a ROCm torch you have with" \
        "ATTN_DISPATCH_SYSTEM_SITE=1" >&2
      exit 1
    fi
    index="https://download.pytorch.org/whl/rocm$rocm"
    why="for ROCm $rocm from $index: an AMD GPU driver is present (/dev/kfd)"
  elif index_reachable "$TORCH_CPU_INDEX"; then
    index="$TORCH_CPU_INDEX"
    why="CPU-only from $index: no NVIDIA or AMD GPU driver found ($CPU_TORCH_SIZE)"
  elif cpu_wheel_offered; then
    spec="torch==$TORCH_VERSION+cpu"
    why="CPU-only (+cpu) from pip's configured sources: no NVIDIA or AMD GPU driver found and"
    why="$why PyTorch's CPU index ($TORCH_CPU_INDEX) is not reachable ($CPU_TORCH_SIZE)"
  else
    why="with CUDA from pip's configured index ($CUDA_TORCH_SIZE), although no GPU driver"
    why="$why was found: PyTorch's CPU index ($TORCH_CPU_INDEX) is not reachable and no"
    why="$why configured source has torch $TORCH_VERSION+cpu. For the CPU build instead, stop"
    why="$why here (Ctrl-C) and run again with TORCH_INDEX_URL=<an index with CPU wheels> or"
    why="$why PIP_FIND_LINKS=<a folder holding torch-$TORCH_VERSION+cpu-*.whl>"
  fi
  echo "setup: installing torch $TORCH_VERSION $why"
  pip_loud "$spec" ${index:+--index-url "$index"}
}
# The constraints every pip install of the run gets (PIP_CONSTRAINT: the helper scripts' pips
# too, beside any the user set): the platform's stack, less torch and triton where the user's
# torch is kept (a pin of them would replace it).
use_constraints() {
  export PIP_CONSTRAINT="${USER_PIP_CONSTRAINT:+$USER_PIP_CONSTRAINT }$1"
}
USER_PIP_CONSTRAINT="${PIP_CONSTRAINT:-}"
# "torch 2.11.0, triton 3.6.0, ..." for the distributions named (those the stack pins).
stack_versions() {
  local dist sep="" version
  for dist in "$@"; do
    version="$(pin "$dist" "$STACK")"
    if [ -n "$version" ]; then printf '%s%s %s' "$sep" "$dist" "$version"; sep=", "; fi
  done
}
without_torch() {
  local file="$VENV/attn_dispatch_constraints.txt"
  grep -v -E '^(torch|triton)==' "$STACK" >"$file"
  use_constraints "$file"
}
installed_torch="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
if [ -z "$STACK" ]; then
  echo "setup: no pinned stack for ROCm: the newest releases the backends admit"
elif [ -n "$installed_torch" ] && [ "${installed_torch%%+*}" != "$TORCH_VERSION" ]; then
  without_torch
  echo "setup: $stack_name without its torch and triton pins ($STACK; $(stack_versions \
    flash-attn-4 nvidia-cutlass-dsl)): torch $installed_torch is installed, so no torch or" \
    "triton version is forced (remove $VENV for torch $TORCH_VERSION)"
elif [ "$system_site" = 1 ] || [ -n "${TORCH_INDEX_URL:-}" ]; then
  without_torch
  if [ -n "${TORCH_INDEX_URL:-}" ]; then keep="TORCH_INDEX_URL picks torch"
  else keep="--system-site-packages (ATTN_DISPATCH_SYSTEM_SITE=1) keeps the base interpreter's torch"
  fi
  echo "setup: $stack_name without its torch and triton pins ($STACK; $(stack_versions \
    flash-attn-4 nvidia-cutlass-dsl)): $keep, so no torch or triton version is forced"
else
  use_constraints "$STACK"
  echo "setup: $stack_name: $(stack_versions torch triton flash-attn-4) ($STACK)"
fi
if [ -n "$installed_torch" ]; then
  echo "setup: torch $installed_torch is installed: kept"
else
  install_torch
fi
echo "setup: the core and the reference backend (and numpy, which torch imports)"
installed numpy || pip_quiet numpy
install_projects . backends/reference
if [ "$minimal" = 1 ]; then exit 0; fi

echo "setup: test tools (pytest, ruff)"
installed "pytest>=7" ruff || pip_quiet "pytest>=7" "ruff"
# A CUDA or ROCm torch requires its own triton (PyPI's torch 2.13.0: triton==3.7.1; ROCm builds:
# pytorch-triton-rocm, whose module is also named triton); a second pin would conflict with it.
torch_triton="$("$PY" scripts/setup_installed.py torch-triton)"
triton_backend=(backends/triton)
case "$torch_triton" in
  "")
    echo "setup: triton $TRITON_FOR_CPU_TORCH (this torch brings none; the release measured on the H200)"
    installed "triton==$TRITON_FOR_CPU_TORCH" || pip_loud "triton==$TRITON_FOR_CPU_TORCH"
    ;;
  pytorch-triton-rocm*)
    # attn-dispatch-triton requires "triton", which pytorch-triton-rocm provides under another
    # name: its other requirements are installed here and the package itself without them.
    echo "setup: triton from torch's $torch_triton (kept)"
    triton_backend=()
    if ! installed backends/triton; then
      pip_quiet --no-deps -e backends/triton
      "$PY" scripts/setup_installed.py record backends/triton
    fi
    ;;
  *)
    echo "setup: triton as torch requires it ($torch_triton)"
    installed "$torch_triton" || pip_loud "$torch_triton"
    ;;
esac
# transformers pinned for tests/integrations (tiny models built from configs, no downloads).
TRANSFORMERS="$(pin transformers "${STACK:-constraints/cpu.txt}")"
echo "setup: transformers $TRANSFORMERS (for tests/integrations; about 160 MB with its requirements)"
installed "transformers==$TRANSFORMERS" || pip_quiet "transformers==$TRANSFORMERS"
echo "setup: the torch_sdpa and triton backends"
install_projects backends/torch_sdpa "${triton_backend[@]}"
# FlashAttention-4 with its real dependency (flash-attn-4 and the CUTLASS DSL): its CPU tests
# check supports/explain and compile FA4's kernels in fake mode.
fa4_pins=()
if [ -n "$STACK" ]; then
  for dist in flash-attn-4 nvidia-cutlass-dsl; do
    version="$(pin "$dist" "$STACK")"
    if [ -n "$version" ]; then fa4_pins+=("$dist==$version"); fi
  done
fi
echo "setup: the flash_attn_cute backend (flash-attn-4 and NVIDIA's CUTLASS DSL, 265 MB)"
# A pinned release differing from the one installed installs the backend again (the stack moved).
if ! installed backends/flash_attn_cute "${fa4_pins[@]}"; then
  pip_loud -e backends/flash_attn_cute
  "$PY" scripts/setup_installed.py record backends/flash_attn_cute
fi
# The CUTLASS DSL always brings its CUDA 12 libraries; beside a CUDA 13 torch its cu13 extra adds
# the CUDA 13 ones, of the DSL release FA4 resolved to.
torch_cuda="$("$PY" -c 'import torch; print((torch.version.cuda or "").split(".")[0])')"
if [ "$torch_cuda" = 13 ]; then
  dsl="$("$PY" -c 'import importlib.metadata as m; print(m.version("nvidia-cutlass-dsl"))')"
  echo "setup: the CUTLASS DSL's CUDA 13 libraries (nvidia-cutlass-dsl[cu13]==$dsl)"
  installed "nvidia-cutlass-dsl-libs-cu13==$dsl" || pip_loud "nvidia-cutlass-dsl[cu13]==$dsl"
fi
bash backends/flydsl_rocm/ci_setup.sh
# A test-plugin install left by an older set-up would list toy backends to the user.
if "$PY" -m pip show -q attn-dispatch-test-plugins 2>/dev/null; then
  echo "setup: removing an installed copy of the test plugins (the tests find them on their path)"
  "$PY" -m pip uninstall -y -q attn-dispatch-test-plugins
fi
