#!/usr/bin/env bash
# The project's GPU check and benchmark in one go (an NVIDIA GPU with torch + triton installed,
# no network needed): install every package editable, run the GPU tests, the demo, the dispatch
# overhead benchmark, then the default `attn-dispatch bench` sweep, eager and under CUDA graphs.
# Results go to $OUT. STEPS picks a part (a comma list of tests, demo, overhead, bench, graphs;
# default all of them), e.g. `STEPS=bench bash benchmarks/gpu_final.sh` for the eager sweep alone.
set -u
STEPS=",${STEPS:-tests,demo,overhead,bench,graphs},"
step() { [[ $STEPS == *",$1,"* ]]; }
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/env.txt"
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . -e backends/reference \
  -e backends/torch_sdpa -e backends/triton 2>&1 | grep -v WARN | tail -3
$PY -m attn_dispatch list | tee -a "$OUT/env.txt"

if step tests; then
echo "== GPU tests"
timeout 600 $PY -m pytest -q -p no:cacheprovider tests/test_attention_op.py \
  tests/test_core_guards.py backends/triton/tests/test_triton_gpu.py \
  backends/triton/tests/test_triton_plans_gpu.py backends/triton/tests/test_triton_gluon.py \
  backends/triton/tests/test_triton_wide_store.py tests/test_bench.py \
  --tb=short -rfE \
  > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$?"; tail -4 "$OUT/gpu_tests.txt"
fi

if step demo; then
echo "== demo"
timeout 120 $PY -m attn_dispatch demo 2>&1 | tee "$OUT/demo.txt" | tail -8
fi

if step overhead; then
echo "== dispatch overhead"
for dev in cpu cuda; do
  PYTHONPATH=tests/plugins ATTN_DISPATCH_TEST_PLUGINS=1 timeout 120 $PY benchmarks/dispatch_overhead.py --device $dev
done 2>&1 | tee "$OUT/dispatch_overhead.txt"
fi

if step bench; then
echo "== bench"
timeout "${BENCH_TIMEOUT:-330}" $PY -m attn_dispatch bench --json "$OUT/bench.json" \
  --csv "$OUT/bench.csv" --plot "$OUT/bench.png" "$@" 2> "$OUT/progress.txt" \
  | tee "$OUT/table.txt"
echo "bench rc=${PIPESTATUS[0]}"; tail -3 "$OUT/progress.txt"
fi

if step graphs; then
echo "== bench under CUDA graphs (the GPU's time alone)"
timeout "${BENCH_TIMEOUT:-330}" $PY -m attn_dispatch bench --cuda-graphs \
  --json "$OUT/bench_graphs.json" --csv "$OUT/bench_graphs.csv" "$@" \
  2> "$OUT/progress_graphs.txt" | tee "$OUT/table_graphs.txt"
echo "bench rc=${PIPESTATUS[0]}"; tail -3 "$OUT/progress_graphs.txt"
fi
