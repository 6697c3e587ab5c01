#!/usr/bin/env bash
# The flash_attn_cute (FlashAttention-4) GPU check in one go, on a Hopper or Blackwell GPU with
# torch, triton and flash-attn-4 (with its CUTLASS DSL) installed; no network needed.
# Usage: OUT=dir bash benchmarks/flash_attn_cute/gpu_check.sh   (about 6-7 minutes on an H200)
#   1. installs the repo's packages editable (--no-deps --no-index), prints the versions;
#   2. first-call compile time per FA4 variant of the seed shapes, in a fresh process with an
#      empty FA4 disk cache, then again in a new process (loads from that cache);
#   3. the backend's GPU tests (conformance kit, torch.compile fullgraph, CUDA-graph capture,
#      compile-once-per-variant), in parallel workers when pytest-xdist is there;
#   4. `attn-dispatch bench --repeats 41 --no-matmul` eager, then under CUDA graphs, with the
#      defaults (sm_90: on; the Blackwell implementation opt-in), each followed by its summary
#      lines and FA4's standing (fa4_table.py).
# STEPS picks parts (comma list of compile, tests, bench, graphs; default all). Each step has a
# time cap (100 + 25, 150, 120, 120 s) so that the whole stays under 10 minutes.
# Files in $OUT (8): env.txt, compile_times.json, compile_times_cached.json, gpu_tests.txt,
# bench_fa4.json, bench_fa4.txt, bench_fa4_graphs.json, bench_fa4_graphs.txt.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DEFAULT_STEPS=compile,tests,bench,graphs
source benchmarks/_gpu_common.sh
# A fresh FA4 disk cache: the first step measures real compilations.
fa4_disk_cache "$(mktemp -d /tmp/fa4_cache.XXXXXX)"

install_editable -e . -e backends/reference -e backends/torch_sdpa -e backends/triton \
  -e backends/flash_attn_cute
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY - <<'EOF'
import importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version())
for dist in ("triton", "flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi",
             "attn-dispatch-flash-attn-cute"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        print(dist, "NOT INSTALLED")
EOF
  echo "FA4 disk cache: $FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
  $PY -m attn_dispatch list
} 2>&1 | tee "$OUT/env.txt"

if step compile; then
  echo "== first-call compile time per variant (empty FA4 disk cache)"
  timeout 100 $PY benchmarks/flash_attn_cute/compile_times.py --json "$OUT/compile_times.json"
  echo "compile rc=$?"
  echo "== the same in a new process (FA4's disk cache filled by the run above)"
  timeout 25 $PY benchmarks/flash_attn_cute/compile_times.py \
    --json "$OUT/compile_times_cached.json"
  echo "compile (cached) rc=$?"
fi

if step tests; then
  echo "== GPU tests"
  xdist_workers 12
  capped_pytest 130 "$OUT/gpu_tests.txt" "${workers[@]}" \
    backends/flash_attn_cute/tests/test_flash_attn_cute_gpu.py --tb=short -rfE
  echo "gpu tests rc=$?"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -20
  tail -2 "$OUT/gpu_tests.txt"
fi

bench() {  # $1: file stem, then extra arguments for attn-dispatch bench
  local stem=$1; shift
  # the backend is opt-in: enabled here so that the automatic rows rank it by its priorities
  timeout "${BENCH_TIMEOUT:-160}" $PY -m attn_dispatch bench --repeats 41 --no-matmul --json "$OUT/$stem.json" "$@" \
    > "$OUT/$stem.txt" 2>&1
  echo "bench rc=$?"
  grep -E "fastest .* auto " "$OUT/$stem.txt"
  [ -f "$OUT/$stem.json" ] && $PY benchmarks/flash_attn_cute/fa4_table.py "$OUT/$stem.json"
}

if step bench; then
  echo "== attn-dispatch bench (eager)"
  bench bench_fa4
fi

if step graphs; then
  echo "== attn-dispatch bench --cuda-graphs"
  bench bench_fa4_graphs --cuda-graphs
fi
echo "gpu_check done in ${SECONDS} s"
