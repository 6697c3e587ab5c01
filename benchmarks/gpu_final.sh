#!/usr/bin/env bash
# The project's GPU check and benchmarks in one go, on an NVIDIA GPU whose Python has torch,
# triton, transformers and flash-attn-4 (with its CUTLASS DSL) installed; no network needed.
# Installs every package editable (--no-deps), then runs the steps named in STEPS (a comma list;
# default all of them, in this order):
#   tests     the whole test suite with the GPU tests, in parallel workers (pytest -n $WORKERS;
#             TEST_PATHS: only these paths), the 30 slowest tests listed at the end
#   bench     `attn-dispatch bench --repeats 41` eager, the 20 seed shapes, every implementation
#   graphs    the same under CUDA graphs (the GPU's time alone)
#   overhead  the dispatcher's cost (CPU and CUDA) and flash_attn_cute's cost over FA4 called
#             directly (benchmarks/flash_attn_cute/overhead.py)
#   e2e       a full training step through transformers, attn_dispatch against sdpa
#             (benchmarks/e2e_train_step.py)
# and, only when named:
#   sweep     the randomized sweep (tests/sweep, 16 workers) from empty triton and FA4 caches,
#             then again on the caches the first pass filled (seed SWEEP_SEED, else a fresh one):
#             the difference is the compile time (SWEEP_PASSES=cold runs the first pass only)
#   host      one layer's host cost (benchmarks/host_cost.py) and its backward on autograd's
#             device thread against the calling thread (benchmarks/engine_thread_cost.py, with
#             profiler traces of both in traces.tgz)
#   evaluate  the cost tables' held-out evaluation (benchmarks/cost_grid.py evaluate, its
#             shapes from EVAL_SKIP on, capped at EVAL_TIMEOUT seconds; EVAL_WITHOUT_AUTOTUNE=1:
#             the default choice's rows alone) and its report
#   grid      cost-grid rows (benchmarks/cost_grid.py measure, shard GRID_SHARD, points from
#             GRID_SKIP on, capped at GRID_TIMEOUT seconds), for `cost_grid.py tables`
#   tune      `attn-dispatch tune --grid` from empty caches (its own, triton's, FA4's; capped
#             at TUNE_TIMEOUT seconds): its progress and the tables it wrote (tune_tables.tgz)
# evaluate and grid first fill the compile caches from 14 processes (WARM_TIMEOUT seconds).
# Results go to $OUT (at most 8 files); each step has a time cap.
set -u
DEFAULT_STEPS=tests,bench,graphs,overhead,e2e
source "$(dirname "${BASH_SOURCE[0]}")/_gpu_common.sh"
fa4_disk_cache /tmp/fa4_cache

install_editable -e . -e backends/reference -e backends/torch_sdpa -e backends/triton \
  -e backends/flash_attn_cute -e backends/flydsl_rocm
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  git log -1 --format='commit %H' 2>/dev/null
  $PY - <<'EOF'
import importlib.metadata as md
import platform
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version())
for dist in ("triton", "transformers", "flash-attn-4", "nvidia-cutlass-dsl"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        print(dist, "NOT INSTALLED")
EOF
  $PY -m attn_dispatch list
} > "$OUT/env.txt" 2>&1
head -8 "$OUT/env.txt"

if step tests; then
  echo "== tests (GPU included)"
  xdist_workers 14
  # TEST_PATHS narrows the run (the whole suite takes more than one 10-minute call: split it).
  # The suite holds the randomized sweep (tests/sweep: 311 cases from a fresh seed, 2-4 minutes
  # on 16 workers by itself, docs/benchmarks.md section 9); the sweep step runs it alone, logged.
  # shellcheck disable=SC2086
  capped_pytest "${TESTS_TIMEOUT:-420}" "$OUT/gpu_tests.txt" "${workers[@]}" \
    ${TEST_PATHS:-tests backends/*/tests benchmarks} --tb=short -rfE --durations=30
  echo "tests rc=$?"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -20
  tail -1 "$OUT/gpu_tests.txt"
fi

bench() {  # $1: file stem, then extra arguments for attn-dispatch bench
  local stem=$1; shift
  timeout "${BENCH_TIMEOUT:-280}" $PY -m attn_dispatch bench --repeats 41 \
    --json "$OUT/$stem.json" "$@" > "$OUT/$stem.txt" 2> "$OUT/$stem.progress"
  echo "bench rc=$?"
  grep -E "fastest|auto" "$OUT/$stem.txt" | tail -25
}

if step bench; then
  echo "== attn-dispatch bench (eager)"
  bench bench
fi

if step graphs; then
  echo "== attn-dispatch bench --cuda-graphs"
  bench bench_graphs --cuda-graphs
fi

if step overhead; then
  echo "== dispatch overhead, flash_attn_cute over FA4 direct"
  {
    for dev in cpu cuda; do
      PYTHONPATH=tests/plugins ATTN_DISPATCH_TEST_PLUGINS=1 timeout 120 \
        $PY benchmarks/dispatch_overhead.py --device $dev
    done
    timeout 200 $PY benchmarks/flash_attn_cute/overhead.py --rounds 41 --calls 50 \
      --json "$OUT/fa4_overhead.json"
    echo "fa4 overhead rc=$?"
    for cg in "" --cuda-graphs; do
      $PY -m attn_dispatch explain --arch sm_90 --batch 1 --seqlen 1024 --heads 64 \
        --kv-heads 8 --head-dim 128 --dtype bf16 --causal $cg
    done
  } > "$OUT/overhead.txt" 2>&1
  tail -40 "$OUT/overhead.txt"
fi

if step e2e; then
  echo "== end-to-end training step through transformers"
  timeout "${E2E_TIMEOUT:-420}" $PY benchmarks/e2e_train_step.py --json "$OUT/e2e.json" \
    2> "$OUT/e2e.progress" | tee "$OUT/e2e.txt"
  echo "e2e rc=${PIPESTATUS[0]}"; tail -3 "$OUT/e2e.progress"
fi

if step sweep; then
  echo "== randomized sweep: empty compile caches, then warm ones"
  xdist_workers 16
  seed=${SWEEP_SEED:-$RANDOM$RANDOM}
  rm -rf /tmp/sweep_triton /tmp/sweep_fa4
  for pass in ${SWEEP_PASSES:-cold warm}; do
    rm -rf "/tmp/sweep_$pass"; start=$(date +%s)
    ATTN_DISPATCH_SWEEP_SEED=$seed ATTN_DISPATCH_SWEEP_LOG=/tmp/sweep_$pass \
      TRITON_CACHE_DIR=/tmp/sweep_triton FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/sweep_fa4 \
      capped_pytest "${SWEEP_TIMEOUT:-300}" "$OUT/sweep_$pass.txt" "${workers[@]}" tests/sweep
    echo "sweep $pass (seed $seed) rc=$? in $(( $(date +%s) - start )) s"
    tail -1 "$OUT/sweep_$pass.txt"
    $PY -m attn_dispatch.testing.sweep --merge /tmp/sweep_$pass/*.jsonl \
      --json "$OUT/sweep_$pass.json" | tail -14
  done
fi

if step host; then
  echo "== host cost per layer; the backward on autograd's device thread"
  timeout 150 $PY benchmarks/host_cost.py --json "$OUT/host_cost.json" > "$OUT/host_cost.txt" 2>&1
  grep "^|" "$OUT/host_cost.txt"
  rm -rf /tmp/traces
  timeout 200 $PY benchmarks/engine_thread_cost.py --trace /tmp/traces \
    > "$OUT/engine_thread.txt" 2>&1
  cat "$OUT/engine_thread.txt"
  tar czf "$OUT/traces.tgz" -C /tmp traces
fi

# Fills the compile caches for cost_grid.py's step $1, its points from $2 on, from 14
# processes at once.
warm_grid() {
  for i in $(seq 0 13); do
    timeout "${WARM_TIMEOUT:-90}" $PY benchmarks/cost_grid.py "$1" --warm --skip "$2" \
      --shard "$i/14" > /dev/null 2>&1 &
  done
  wait
}

if step evaluate; then
  echo "== held-out evaluation of the cost tables"
  warm_grid evaluate "${EVAL_SKIP:-0}"
  timeout -s INT "${EVAL_TIMEOUT:-400}" $PY benchmarks/cost_grid.py evaluate \
    --skip "${EVAL_SKIP:-0}" ${EVAL_WITHOUT_AUTOTUNE:+--without-autotune} \
    --out "$OUT/evaluate.jsonl" 2> "$OUT/evaluate.progress"
  echo "evaluate rc=$?"; tail -1 "$OUT/evaluate.progress"
  $PY benchmarks/cost_grid.py report "$OUT/evaluate.jsonl" | tee "$OUT/evaluate.md"
fi

if step grid; then
  echo "== cost-grid rows"
  warm_grid measure "${GRID_SKIP:-0}"
  timeout -s INT "${GRID_TIMEOUT:-400}" $PY benchmarks/cost_grid.py measure \
    --shard "${GRID_SHARD:-0/1}" --skip "${GRID_SKIP:-0}" --out "$OUT/grid.jsonl" \
    2> "$OUT/grid.progress"
  echo "grid rc=$?"; tail -1 "$OUT/grid.progress"
fi

if step tune; then
  # a first run on a fresh machine: attn_dispatch's, triton's and FA4's caches all empty
  echo "== attn-dispatch tune --grid from empty caches (the user's own cost tables)"
  rm -rf /tmp/tune_cache /tmp/tune_triton /tmp/tune_fa4
  start=$(date +%s)
  ATTN_DISPATCH_CACHE_DIR=/tmp/tune_cache TRITON_CACHE_DIR=/tmp/tune_triton \
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/tune_fa4 timeout -s INT "${TUNE_TIMEOUT:-560}" \
    $PY -m attn_dispatch tune --grid 2> "$OUT/tune.progress"
  echo "tune rc=$? in $(( $(date +%s) - start )) s"; tail -3 "$OUT/tune.progress"
  if [[ -d /tmp/tune_cache/costs ]]; then
    tar czf "$OUT/tune_tables.tgz" -C /tmp/tune_cache costs
  else
    echo "tune wrote no tables"
  fi
fi
