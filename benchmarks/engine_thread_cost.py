"""What one layer's forward + backward costs when autograd runs the backward on its device
thread (PyTorch's default for CUDA tensors) against on the calling thread
(``torch.autograd.set_multithreading_enabled(False)``), for sdpa, a C++ node, a trivial Python
``autograd.Function`` and ``ad.attention`` with each GPU implementation forced, each beside a
minimal node that calls ``ad.forward`` / ``ad.backward`` and nothing else. Also times the eager
node's gradient function from inside, on each thread. CUDA only.

    python benchmarks/engine_thread_cost.py [--rounds 7] [--number 200] [--trace DIR]

``--trace DIR`` also writes a ``torch.profiler`` trace (Chrome format) of 10 steps of each
``ad.attention`` row on each thread, to read what the device thread does around the node.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from _minimal_node import minimal_node
from _timing import median_per_call

import attn_dispatch as ad
from attn_dispatch import _autograd

B, H, KV, S, D = 1, 32, 8, 128, 128
IMPLEMENTATIONS = ("flash_attn_cute:sm90", "torch_sdpa:flash", "triton:fused")


def per_step_us(step: Callable[[], None], rounds: int, number: int) -> float:
    return median_per_call(step, torch.device("cuda"), 15, rounds, number) * 1e6


class _Doubling(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def steps() -> dict[str, Callable[[], None]]:
    """Each measured path's step: clear the leaves' gradients, forward, backward."""

    def leaves(*shapes) -> list[torch.Tensor]:
        return [
            torch.randn(*s, device="cuda", dtype=torch.bfloat16).requires_grad_() for s in shapes
        ]

    x = torch.randn(1024, device="cuda", requires_grad=True)
    g = torch.randn(1024, device="cuda")
    qh, kh, vh = leaves((B, H, S, D), (B, KV, S, D), (B, KV, S, D))
    q, k, v = leaves((B, S, H, D), (B, S, KV, D), (B, S, KV, D))
    grad_h, grad = torch.randn_like(qh), torch.randn_like(q)

    def cpp() -> None:
        x.grad = None
        (x * 2).backward(g)

    def python_node() -> None:
        x.grad = None
        _Doubling.apply(x).backward(g)

    def sdpa() -> None:
        qh.grad = kh.grad = vh.grad = None
        F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True).backward(grad_h)

    def forced(name: str) -> Callable[[], None]:
        def step() -> None:
            q.grad = k.grad = v.grad = None
            ad.attention(q, k, v, causal=True, backend=name).backward(grad)

        return step

    def minimal(name: str) -> Callable[[], None]:
        node = minimal_node(name)

        def step() -> None:
            q.grad = k.grad = v.grad = None
            node.apply(q, k, v).backward(grad)

        return step

    found = {"a C++ node": cpp, "a trivial Python node": python_node, "sdpa": sdpa}
    for name in IMPLEMENTATIONS:
        try:
            forced(name)()
        except (ad.UnknownBackendError, ValueError) as exc:
            print(f"{name}: skipped ({type(exc).__name__})", file=sys.stderr)
            continue
        found[f"ad.attention, {name}"] = forced(name)
        found[f"a minimal node over ad.forward / ad.backward, {name}"] = minimal(name)
    return found


def trace(step: Callable[[], None], stem: Path) -> None:
    """Profiler traces of 10 steps on the device thread, then on the calling thread."""
    from torch.profiler import ProfilerActivity, profile

    stem.parent.mkdir(parents=True, exist_ok=True)
    for suffix, threads in (("device_thread", True), ("calling_thread", False)):
        torch.autograd.set_multithreading_enabled(threads)
        try:
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    step()
                torch.cuda.synchronize()
        finally:
            torch.autograd.set_multithreading_enabled(True)
        prof.export_chrome_trace(f"{stem}.{suffix}.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per row (7)")
    parser.add_argument("--number", type=int, default=200, help="steps per round (200)")
    parser.add_argument("--trace", type=Path, help="write profiler traces into this folder")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("engine_thread_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    inside: list[float] = []
    gradients = _autograd._eager_gradients

    def timed(ctx, grad_out):
        start = time.perf_counter_ns()
        try:
            return gradients(ctx, grad_out)
        finally:
            inside.append((time.perf_counter_ns() - start) / 1e3)

    _autograd._eager_gradients = timed
    print("| step | device thread, µs | calling thread, µs | node's gradients inside |")
    print("|---|---|---|---|")
    for name, step in steps().items():
        inside.clear()
        threaded = per_step_us(step, args.rounds, args.number)
        in_worker = statistics.median(inside) if inside else None
        torch.autograd.set_multithreading_enabled(False)
        try:
            inside.clear()
            calling = per_step_us(step, args.rounds, args.number)
            in_caller = statistics.median(inside) if inside else None
        finally:
            torch.autograd.set_multithreading_enabled(True)
        within = "" if in_worker is None else f"{in_worker:.1f} / {in_caller:.1f}"
        if args.trace and name.startswith("ad.attention"):
            trace(step, args.trace / name.split(", ")[1].replace(":", "_"))
        print(f"| {name} | {threaded:.1f} | {calling:.1f} | {within} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
