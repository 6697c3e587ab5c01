"""Host µs per ``ad.backward`` call at MHA 8 1K (B=1, D=128, bf16), causal and not: both triton
implementations, cuDNN and FA2, forced.

Checks both triton implementations against the reference backend first (rel. Frobenius < 1e-2),
then per row times 1500 calls after warm-up with the GPU synchronised every 20 calls (so the
host never waits on a full launch queue): median host µs per round, three rounds, and their
median. To compare two versions of the backend, run it once per version with the older
package first on ``PYTHONPATH`` (the first line printed names the package that ran)::

    PYTHONUNBUFFERED=1 python backends/triton/bench_host_short.py
    PYTHONPATH=/path/to/old/backends/triton python backends/triton/bench_host_short.py
"""

from __future__ import annotations

import statistics
import time

import attn_dispatch_triton
import torch

import attn_dispatch as ad

IMPLS = ("triton:fused", "triton:fused_atomic", "torch_sdpa:cudnn", "torch_sdpa:flash")


def host_us(args: tuple, causal: bool, backend: str, calls: int = 1500) -> float:
    """Median host µs of one forced call."""
    for _ in range(20):
        ad.backward(*args, causal=causal, backend=backend)
    times = []
    for i in range(calls):
        if i % 20 == 0:
            torch.cuda.synchronize()
        start = time.perf_counter()
        ad.backward(*args, causal=causal, backend=backend)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def main() -> None:
    print("package:", attn_dispatch_triton.__file__, flush=True)
    q, k, v, grad_out = (torch.randn(1, 1024, 8, 128, device="cuda", dtype=torch.bfloat16)
                         for _ in range(4))
    for causal in (False, True):
        out, lse = ad.forward(q, k, v, causal=causal, backend="triton:fused")
        args = (q, k, v, out, lse, grad_out)
        ref = ad.backward(*args, causal=causal, backend="reference")
        for impl in IMPLS[:2]:
            for _ in range(3):  # the third call replays the launch plan
                got = ad.backward(*args, causal=causal, backend=impl)
            for g, r in zip(got, ref):
                err = ((g.double() - r.double()).norm() / r.double().norm()).item()
                if not err < 1e-2:
                    raise AssertionError(f"{impl}: rel. error {err:.2e} against the reference")
        rounds: dict[str, list[float]] = {impl: [] for impl in IMPLS}
        for _ in range(3):
            for impl in IMPLS:
                rounds[impl].append(host_us(args, causal, impl))
        for impl, values in rounds.items():
            print(f"{'causal' if causal else 'full':6s} {impl:22s} host µs "
                  f"{statistics.median(values):6.1f}  ({' '.join(f'{x:.1f}' for x in values)})",
                  flush=True)


if __name__ == "__main__":
    main()
