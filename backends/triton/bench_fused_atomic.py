"""triton:fused_atomic's table choices on a Hopper GPU: the split design against the fused-atomic
one (the Gluon dK/dV kernel adding dQ by TMA reductions) with each GQA slicing and launch order.

For every seed shape (B=1, D=128, bf16) this times ``attention_backward`` through the planned
path as a training step calls it: the split design with the table's configs, then the
fused-atomic design with the table's ``dkdvq`` entry for that shape class replaced by each
variant (``SPLIT`` 1/2/4 heads-slices per GQA group or the launcher's heuristic ``h``; causal
also with ``HEAVY_FIRST``). Each variant's gradients are first compared with the split design's
(relative Frobenius difference < 1e-2; the GPU tests check both against the float64 oracle).
``triton.testing.do_bench`` medians, µs.

    PYTHONUNBUFFERED=1 python backends/triton/bench_fused_atomic.py [--shapes all|gqa|mha]
"""

from __future__ import annotations

import argparse
import sys

import torch
from attn_dispatch_triton import tuning
from attn_dispatch_triton.backward import attention_backward
from bench_kernels import timing_inputs
from triton.testing import do_bench

SEQLENS = (1024, 2048, 4096, 8192, 16384)


def variants(gqa: bool, causal: bool) -> dict[str, dict]:
    """Name -> keys added to the table's ``dkdvq`` config."""
    out: dict[str, dict] = {"h": {}}
    if gqa:
        for split in (1, 2, 4):
            out[f"s{split}"] = {"SPLIT": split}
            if causal:
                out[f"s{split}hf"] = {"SPLIT": split, "HEAVY_FIRST": 1}
    elif causal:
        out["hf"] = {"HEAVY_FIRST": 1}
    return out


def bench_shape(h: int, hk: int, s: int, causal: bool) -> dict[str, float]:
    q, k, v, out, lse, do = timing_inputs(h, hk, s)

    def call(atomic: bool):
        return attention_backward(q, k, v, out, lse, do, causal=causal, bottom_right=False,
                                  scale=128 ** -0.5, atomic_dq=atomic)

    ref = [t.clone() for t in call(False)]
    res = {"split": do_bench(lambda: call(False), warmup=10, rep=200) * 1e3}
    key = tuning.lookup_keys(128, causal, h // hk, s)[-1]  # the most specific class
    base = tuning._TABLES["sm_90"]["*"]["dkdvq"]  # (variants of the generic entry)
    for name, extra in variants(h != hk, causal).items():
        with tuning.trial("sm_90", key, {"dkdvq": {**base, **extra}}):
            got = call(True)
            for g, r in zip(got, ref):
                diff = ((g.double() - r.double()).norm() / r.double().norm()).item()
                if not diff < 1e-2:
                    raise AssertionError(f"{name}: differs from the split design by {diff:.2e}")
            res[name] = do_bench(lambda: call(True), warmup=10, rep=200) * 1e3
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", choices=("all", "gqa", "mha"), default="all")
    args = ap.parse_args()
    if tuning.arch_of(torch.device("cuda")) != "sm_90":
        print("needs an sm_90 GPU (the table entries measured are sm_90's)")
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    kinds = {"all": ((64, 8), (8, 8)), "gqa": ((64, 8),), "mha": ((8, 8),)}[args.shapes]
    for h, hk in kinds:
        for causal in (False, True):
            for s in SEQLENS:
                res = bench_shape(h, hk, s, causal)
                best, name = min((t, n) for n, t in res.items() if n != "split")
                label = f"{'GQA' if h != hk else 'MHA'} {h}/{hk} {s // 1024}K" + (
                    " causal" if causal else "")
                print(f"{label}: " + " ".join(f"{n}={t:.0f}" for n, t in res.items())
                      + f" | best fused-atomic {name}: {best / res['split']:.3f}x split",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
