#!/usr/bin/env bash
# One GPU session: install every backend in editable mode (offline), run the torch_sdpa GPU
# tests, then the default benchmark sweep. Results go to $OUT (or ./gpu_out).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
pkgs=(-e .)
for b in backends/reference backends/torch_sdpa backends/triton; do
  [ -f "$b/pyproject.toml" ] && pkgs+=(-e "$b")
done
$PY -m pip install -q --no-index --no-deps --no-build-isolation "${pkgs[@]}" 2>&1 | tail -3
$PY -m attn_dispatch list 2>&1 | tee -a "$OUT/env.txt"
timeout "${TEST_TIMEOUT:-150}" $PY -m pytest -q -p no:cacheprovider backends/torch_sdpa/tests \
  --tb=line -rf > "$OUT/tests.txt" 2>&1
echo "tests rc=$?"; grep -E "^E |Error" "$OUT/tests.txt" | sort | uniq -c | sort -rn | head -15
tail -3 "$OUT/tests.txt"
timeout "${BENCH_TIMEOUT:-300}" $PY -m attn_dispatch bench --json "$OUT/bench.json" \
  --csv "$OUT/bench.csv" --plot "$OUT/bench.png" "$@" 2> "$OUT/progress.txt" | tee "$OUT/table.txt"
echo "bench rc=${PIPESTATUS[0]}"; tail -3 "$OUT/progress.txt"
