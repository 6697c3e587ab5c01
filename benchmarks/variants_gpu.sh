#!/usr/bin/env bash
# Attention variants (sliding window, soft cap) on one NVIDIA GPU in one go, no network needed:
#   1. installs the repo's packages editable (flash_attn_cute too when flash-attn-4 is there);
#   2. the GPU tests of every implementation that declares window / softcap: the Gluon sm_90
#      kernels' file (bands and caps against the float64 oracle, and its causal cases), the
#      conformance kit's window / softcap cases for triton, torch_sdpa:flash and
#      flash_attn_cute, and FA4's multi-tile cases; parallel workers when pytest-xdist is there;
#   3. benchmarks/triton/bench_variants.py (checks at S=9000, then the 16K timings).
# Usage: OUT=dir bash benchmarks/variants_gpu.sh   (about 7 minutes on an H200)
# STEPS picks parts (comma list of tests, bench; default both). Each part has a time cap
# (200 and 260 s). Files in $OUT: env.txt, gpu_tests.txt, variants.txt, variants.json.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEFAULT_STEPS=tests,bench
source benchmarks/_gpu_common.sh
packages=(-e . -e backends/reference -e backends/torch_sdpa -e backends/triton)
tests=(backends/triton/tests/test_triton_gluon.py backends/triton/tests/test_triton_gpu.py
       backends/torch_sdpa/tests/test_sdpa_gpu.py)
select="gluon or band or win or cap"
if $PY -c "import flash_attn.cute" 2>/dev/null; then
  packages+=(-e backends/flash_attn_cute)
  tests+=(backends/flash_attn_cute/tests/test_flash_attn_cute_gpu.py)
  select="$select or multi_tile"
fi
install_editable "${packages[@]}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"
  $PY -m pip list 2>/dev/null | grep -i -E "^(flash-attn-4|nvidia-cutlass-dsl) "
} 2>&1 | tee "$OUT/env.txt"

if step tests; then
  echo "== GPU tests: $select"
  xdist_workers 12
  capped_pytest 200 "$OUT/gpu_tests.txt" "${workers[@]}" "${tests[@]}" -k "$select" \
    --tb=short -rfE
  echo "gpu tests rc=$?"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -30
  tail -2 "$OUT/gpu_tests.txt"
fi

if step bench; then
  echo "== bench_variants"
  timeout 260 $PY benchmarks/triton/bench_variants.py --out "$OUT" > "$OUT/variants.txt" 2>&1
  echo "bench rc=$?"
  grep -E "FAIL|Error" "$OUT/variants.txt" | head -10
  sed -n '/^bf16 B=1/,$p' "$OUT/variants.txt"
fi
echo "variants_gpu done in ${SECONDS} s"
