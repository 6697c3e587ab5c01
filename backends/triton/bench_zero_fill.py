"""Where triton:fused_atomic's fp32 dQ scratch is zero-filled: in the preprocess pass (kept) or
by a separate fill before the dK/dV kernel (before), against cuDNN.

For GQA 64/8 (B=1, D=128, bf16) this times ``attention_backward(..., atomic_dq=True)`` both
ways in one process, with launch plans off (a plan replays only the kept way), after checking
that both give the same gradients. Rounds alternate the order; the table prints medians (µs,
``triton.testing.do_bench``, L2 flushed) and cuDNN's time over each.

    ATTN_DISPATCH_TRITON_PLANS=0 PYTHONUNBUFFERED=1 python backends/triton/bench_zero_fill.py
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys

import torch
from attn_dispatch_triton.backward import BackwardLaunch, attention_backward
from triton.testing import do_bench

import attn_dispatch as ad

SHAPES = [(4096, False), (8192, False), (16384, False), (4096, True), (8192, True)]


@contextlib.contextmanager
def fill_before_dkdv():
    """The earlier order: preprocess without the scratch; the dK/dV launch then allocates it
    and fills it with zeros (a separate fill kernel)."""
    kept = BackwardLaunch.run

    def run(self, config):
        self.preprocess(config["pre"])
        self.dkdv(config["dkdvq"], atomic_dq=True)
        self.dq_convert(config["cvt"])
        return self.dq, self.dk, self.dv

    BackwardLaunch.run = run
    try:
        yield
    finally:
        BackwardLaunch.run = kept


def bench_shape(s: int, causal: bool) -> dict[str, list[float]]:
    torch.manual_seed(0)
    q = torch.randn(1, s, 64, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, s, 8, 128, device="cuda", dtype=torch.bfloat16)
    v, do, out = torch.randn_like(k), torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(1, 64, s, device="cuda") + 6.0

    def call():
        return attention_backward(q, k, v, out, lse, do, causal=causal, bottom_right=False,
                                  scale=128 ** -0.5, atomic_dq=True)

    def cudnn():
        return ad.backward(q, k, v, out, lse, do, causal=causal, backend="torch_sdpa:cudnn")

    kept = [t.clone() for t in call()]
    with fill_before_dkdv():
        before = call()
    for a, b in zip(kept, before):
        diff = ((a.double() - b.double()).norm() / b.double().norm()).item()
        if not diff < 1e-2:
            raise AssertionError(f"{s} causal={causal}: the two orders differ by {diff:.2e}")

    def timed(name: str) -> float:
        if name == "fill before":
            with fill_before_dkdv():
                return do_bench(call, warmup=10, rep=200) * 1e3
        return do_bench(cudnn if name == "cudnn" else call, warmup=10, rep=200) * 1e3

    res: dict[str, list[float]] = {n: [] for n in ("cudnn", "fill before", "in preprocess")}
    for rnd in range(4):
        for name in (list(res) if rnd % 2 == 0 else list(res)[::-1]):
            res[name].append(timed(name))
    return res


def main() -> int:
    if os.environ.get("ATTN_DISPATCH_TRITON_PLANS") != "0":
        print("set ATTN_DISPATCH_TRITON_PLANS=0 (a recorded plan replays one order only)")
        return 2
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    lines = []
    for s, causal in SHAPES:
        med = {n: statistics.median(t) for n, t in bench_shape(s, causal).items()}
        label = f"GQA 64/8 {s // 1024}K{' causal' if causal else ''}"
        lines.append(f"{label}: " + "  ".join(
            f"{n} {t:.0f} ({med['cudnn'] / t:.3f})" for n, t in med.items()))
        print(lines[-1], flush=True)
    print("\nmedian µs (cuDNN's time over it):\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
