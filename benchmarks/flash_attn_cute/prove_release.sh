#!/usr/bin/env bash
# Prove an FA4 release on an sm_90 GPU: the evidence a row of
# backends/flash_attn_cute/attn_dispatch_flash_attn_cute/_releases.py needs.
# Usage: OUT=dir [STEPS=scan,replay,tests] bash benchmarks/flash_attn_cute/prove_release.sh [WHEEL]
#   WHEEL (e.g. flash_attn_4-4.0.0b40-py3-none-any.whl, the pure-Python wheel that
#   `pip download --no-deps --pre flash-attn-4==4.0.0b40` fetches): installed --no-deps into a
#   private directory put first on PYTHONPATH, so it is the FA4 every step sees; without it the
#   installed FA4 is proven. FA4's disk cache is shared by the steps (FA4_CACHE_DIR to reuse one).
#   scan:   the head-dim scan, every D = Dv in 8..256, MHA and GQA, against the float64 oracle,
#           checked against the release's row (fails where the row admits a wrong head dim or
#           records a correct one as wrong); prints one verdict per case and the row the
#           results make (sm90_head_dims = correct for MHA and GQA, sm90_wrong_backward);
#   replay: the replay GPU tests, the replay switched on for the release (their passing is the
#           evidence for replay_tested=True);
#   tests:  the backend's GPU tests and the fake-compile test (the calls into this FA4).
# Each step is capped under 10 minutes. Files in $OUT: env.txt, scan.txt, replay.txt,
# gpu_tests.txt.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
DEFAULT_STEPS=scan,replay,tests
DEFAULT_OUT=prove_out
source benchmarks/_gpu_common.sh
fa4_disk_cache "$(mktemp -d /tmp/fa4_cache.XXXXXX)"
if [ $# -ge 1 ]; then
  target=$(mktemp -d /tmp/fa4_release.XXXXXX)
  $PY -m pip install -q --no-deps --no-index --target "$target" "$1" || exit 1
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
fi
install_editable -e . -e backends/reference -e backends/torch_sdpa -e backends/triton \
  -e backends/flash_attn_cute
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  $PY -c "import importlib.metadata as md, torch; print('torch', torch.__version__)
print('flash-attn-4', md.version('flash-attn-4'))
from attn_dispatch_flash_attn_cute import _support
print('gate:', _support.fa4_problem() or 'admitted')"
} 2>&1 | tee "$OUT/env.txt"
xdist_workers 8

if step scan; then
  echo "== head-dim scan"
  capped_pytest 570 "$OUT/scan.txt" "${workers[@]}" -rA \
    backends/flash_attn_cute/tests/test_flash_attn_cute_head_dims_gpu.py
  echo "scan rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/scan.txt" | head -20; tail -1 "$OUT/scan.txt"
  $PY - "$OUT/scan.txt" <<'PYEOF'
import re, sys
verdicts = {}
for m in re.finditer(r"sm_90 D=(\d+) (mha|gqa): correct=(True|False)", open(sys.argv[1]).read()):
    verdicts.setdefault(int(m[1]), []).append(m[3] == "True")
correct = sorted(d for d, v in verdicts.items() if len(v) == 2 and all(v))
wrong = sorted(d for d, v in verdicts.items() if not all(v))
print(f"scanned {len(verdicts)} head dims: sm90_head_dims={correct} sm90_wrong_backward={wrong}")
PYEOF
fi

if step replay; then
  echo "== replay GPU tests"
  capped_pytest 570 "$OUT/replay.txt" -rfEs \
    backends/flash_attn_cute/tests/test_flash_attn_cute_replay_gpu.py
  echo "replay rc=$?"; tail -3 "$OUT/replay.txt"
fi

if step tests; then
  echo "== the backend's GPU tests and the fake-compile test"
  capped_pytest 570 "$OUT/gpu_tests.txt" "${workers[@]}" -rfE \
    backends/flash_attn_cute/tests/test_flash_attn_cute_gpu.py \
    backends/flash_attn_cute/tests/test_flash_attn_cute_fake_compile.py
  echo "gpu tests rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -20
  tail -2 "$OUT/gpu_tests.txt"
fi
echo "prove_release done in ${SECONDS} s"
