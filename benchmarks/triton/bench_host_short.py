"""Host µs per ``ad.backward`` call at MHA 8 (B=1, D=128, bf16), causal and not: both triton
implementations, cuDNN and FA2, forced.

Checks both triton implementations against the reference backend first (rel. Frobenius < 1e-2),
then per row times 1500 calls after warm-up with the GPU synchronised every 20 calls (so the
host never waits on a full launch queue): median host µs per round, three rounds, and their
median. Each triton row also says whether its signature replays a launch plan (and how many
launches it holds) or takes the normal ``kernel[grid]`` path on every call. ``--profile N``
prints, per triton row, the N functions with the most own time under ``cProfile``.
To compare two versions of the backend, run it once per version, alternating, with the other
version's files copied over ``backends/triton/attn_dispatch_triton`` in between (``PYTHONPATH``
does not override an editable install, whose import hook comes first)::

    PYTHONUNBUFFERED=1 python benchmarks/triton/bench_host_short.py [--seqlens 1024,2048]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import attn_dispatch_triton
import torch
from attn_dispatch_triton import _plan

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


def plan_status(args: tuple, causal: bool, backend: str) -> str:
    """Whether a repeated call of ``backend`` replays a plan (recorded on a first call)."""
    _plan.clear()
    for _ in range(2):
        ad.backward(*args, causal=causal, backend=backend)
    plans = _plan.recorded()
    if not plans:
        return "no plan (normal path, or not plannable)"
    return f"plan, {sum(len(p.launches) for p in plans)} launches"


def profile(args: tuple, causal: bool, backend: str, top: int, calls: int = 2000) -> str:
    """The ``top`` functions by own time over ``calls`` calls (GPU synchronised every 20)."""
    prof = cProfile.Profile()
    for i in range(calls):
        if i % 20 == 0:
            torch.cuda.synchronize()
        prof.enable()
        ad.backward(*args, causal=causal, backend=backend)
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return "\n".join(
        line
        for line in text.getvalue().splitlines()
        if line.strip() and not line.startswith("   Ordered by")
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="1024", help="comma list (default 1024)")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="print the N functions with most own time per triton row",
    )
    opts = parser.parse_args(argv)
    print("package:", attn_dispatch_triton.__file__, flush=True)
    for seqlen in (int(s) for s in opts.seqlens.split(",")):
        q, k, v, grad_out = (
            torch.randn(1, seqlen, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4)
        )
        for causal in (False, True):
            label = f"{seqlen:5d} {'causal' if causal else 'full':6s}"
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
                print(f"{label} {impl:22s} {plan_status(args, causal, impl)}", flush=True)
            rounds: dict[str, list[float]] = {impl: [] for impl in IMPLS}
            for _ in range(3):
                for impl in IMPLS:
                    rounds[impl].append(host_us(args, causal, impl))
            for impl, values in rounds.items():
                print(
                    f"{label} {impl:22s} host µs {statistics.median(values):6.1f}  "
                    f"({' '.join(f'{x:.1f}' for x in values)})",
                    flush=True,
                )
            for impl in IMPLS[:2] if opts.profile else ():
                print(
                    f"-- {label} {impl}: cProfile, own time\n"
                    f"{profile(args, causal, impl, opts.profile)}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
