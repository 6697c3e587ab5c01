"""A target for Nsight Compute: triton:fused_atomic's backward at GQA 64/8 (B=1, D=128, bf16).

Runs the backward three times (the first records the launch plan), so that one launch of the
Gluon dK/dV kernel can be profiled after warm-up::

    ncu --clock-control none --kernel-name regex:_attn_bwd_dkdv_sm90 --launch-skip 2 \\
        --launch-count 1 --section SpeedOfLight --section WarpStateStats \\
        --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis \\
        --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats \\
        -o fused_atomic python3 benchmarks/triton/ncu_target.py --seqlen 4096 [--causal]

(docs/backends/triton.md, "What limits the kernels", and docs/experiments.md, "Where the
fused-atomic kernel is bound", have the numbers of one run.)
Above 4K keys without a mask the table cuts the units past the last whole wave into slices
(``TAIL_SLICES``), a second launch of the kernel per call; ``--no-tail-slices`` turns that off
so that the launch profiled is the whole backward's dK/dV, as in the runs documented.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from attn_dispatch_triton import tuning
from bench_kernels import timed_backward, timing_inputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument(
        "--no-tail-slices",
        action="store_true",
        help="one dK/dV launch per call (config TAIL_SLICES 0)",
    )
    args = ap.parse_args()
    s, heads, kv_heads = args.seqlen, 64, 8
    inputs = timing_inputs(heads, kv_heads, s)
    in_force = (
        tuning.trial_with(
            tuning.arch_of(inputs[0].device),
            "dkdvq",
            128,
            args.causal,
            heads // kv_heads,
            s,
            TAIL_SLICES=0,
        )
        if args.no_tail_slices
        else contextlib.nullcontext()
    )
    with in_force:
        for _ in range(3):
            timed_backward(inputs, args.causal)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
