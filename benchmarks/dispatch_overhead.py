"""Dispatch overhead: median ``ad.backward(...)`` time minus a direct call of the chosen
implementation, on tiny CPU tensors, after the decision is cached.

Run: ``PYTHONPATH=tests/plugins ATTN_DISPATCH_TEST_PLUGINS=1 python benchmarks/dispatch_overhead.py
[--device cuda]`` (tests/plugins holds the test plugins and their entry points, never installed:
its ``toy:trivial`` implementation returns its inputs, so the difference is the dispatcher's own
cost).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import timeit

import torch

import attn_dispatch as ad
from attn_dispatch import backend as adb

ROUNDS, NUMBER = 31, 20000


def median_us(fn) -> float:
    """Median over ROUNDS of the mean time of NUMBER calls, in microseconds."""
    return statistics.median(timeit.repeat(fn, number=NUMBER, repeat=ROUNDS)) / NUMBER * 1e6


def main() -> int:
    if os.environ.get("ATTN_DISPATCH_TEST_PLUGINS") != "1":
        sys.exit("set ATTN_DISPATCH_TEST_PLUGINS=1 and PYTHONPATH=tests/plugins")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="where the tiny tensors live")
    device = torch.device(parser.parse_args().device)
    os.environ["ATTN_DISPATCH_PLUGINS"] = "toy"
    ad.reload()
    q, k, v, out, do = (torch.randn(1, 4, 2, 8, device=device) for _ in range(5))
    lse = torch.randn(1, 2, 4, device=device)
    args = (q, k, v, out, lse, do)
    impl = ad._settings.current().registry.implementations["toy:trivial"]
    ad.backward(*args, backend="toy:trivial")  # cache the decision
    inp = adb.make_inputs(*args)  # what the dispatcher hands the implementation
    rows = []
    for label, call in (
        ("forced (backend='toy:trivial')", lambda: ad.backward(*args, backend="toy:trivial")),
        ("use_backend('toy:trivial')", None),
    ):
        if call is None:
            with ad.use_backend("toy:trivial"):
                total = median_us(lambda: ad.backward(*args))
        else:
            total = median_us(call)
        direct = median_us(lambda: impl.backward(inp))
        rows.append((label, total, direct, total - direct))
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in open("/proc/cpuinfo")
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, {cpu}, tensors on {device}"
    )
    print(f"{'path':<34}{'ad.backward µs':>16}{'direct µs':>12}{'overhead µs':>14}")
    for label, total, direct, overhead in rows:
        print(f"{label:<34}{total:>16.2f}{direct:>12.2f}{overhead:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
