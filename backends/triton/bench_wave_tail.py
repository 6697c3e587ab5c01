"""Does the fused-atomic backward lose its last, partly filled wave of programs? (GQA 64/8).

Without a mask the Gluon dK/dV kernel runs one program per (key block, kv head), each as long
as the others, one per SM at a time (its shared memory). At Sk = 4K / 8K / 16K that is 256 / 512
/ 1024 programs: 1.94 / 3.88 / 7.76 waves on 132 SMs, so the last wave leaves 3% of the SMs'
time idle. With Sq fixed, Sk grown by 1/32 (4224 / 8448 / 16896 keys) makes the program count
a multiple of 132 and adds 3.1% of work: if the idle tail were a full loss the time would not
change; if the tail cost nothing it would grow 3.1%, as cuDNN's (one program per query head)
should. Times are ``triton.testing.do_bench`` medians (µs, L2 flushed) of three rounds in
alternating order with cuDNN's backward, through the planned path with the table's config.

    PYTHONUNBUFFERED=1 python backends/triton/bench_wave_tail.py
"""

from __future__ import annotations

import statistics
import sys

import torch
from attn_dispatch_triton.backward import attention_backward
from bench_kernels import timing_inputs
from triton.testing import do_bench

import attn_dispatch as ad


def times(sq: int, sk: int, rounds: int = 3) -> dict[str, float]:
    q, k, v, out, lse, do = timing_inputs(64, 8, sq, sk)
    calls = {
        "ours": lambda: attention_backward(q, k, v, out, lse, do, causal=False,
                                           bottom_right=False, scale=128 ** -0.5,
                                           atomic_dq=True),
        "cudnn": lambda: ad.backward(q, k, v, out, lse, do, causal=False,
                                     backend="torch_sdpa:cudnn"),
    }
    res: dict[str, list[float]] = {n: [] for n in calls}
    for rnd in range(rounds):
        for name in (list(calls) if rnd % 2 == 0 else list(calls)[::-1]):
            res[name].append(do_bench(calls[name], warmup=10, rep=300) * 1e3)
    return {n: statistics.median(t) for n, t in res.items()}


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for s in (4096, 8192, 16384):
        a, b = times(s, s), times(s, s + s // 32)
        print(f"GQA 64/8 Sq {s}: ours {a['ours']:.0f} -> {b['ours']:.0f} µs "
              f"(x{b['ours'] / a['ours']:.4f}), cuDNN {a['cudnn']:.0f} -> {b['cudnn']:.0f} "
              f"(x{b['cudnn'] / a['cudnn']:.4f}); work x{(s + s // 32) / s:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
