"""The wall-clock timing loop the benchmark scripts share."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a CPU runs its work as it is called)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_per_call(
    fn: Callable[[], object], device: torch.device, warmup: int, rounds: int, number: int
) -> float:
    """Seconds per call of ``fn``: the median over ``rounds`` of the wall time of ``number``
    back-to-back calls, after ``warmup`` untimed calls; ``device`` is synchronised before and
    after each round, not between calls, so that the launches of a round overlap its kernels."""
    return interleaved_medians({"": fn}, device, warmup, rounds, number)[""]


def interleaved_medians(
    fns: dict[str, Callable[[], object]],
    device: torch.device,
    warmup: int,
    rounds: int,
    number: int,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Seconds per call of each of ``fns``, timed as :func:`median_per_call` times one, but
    round by round across all of them (round 1 of every function, then round 2, ...): a slow
    spell of a host-bound machine then weighs on every row alike, and the rows of one run
    compare. ``progress`` gets a line after each round."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    per_round: dict[str, list[float]] = {name: [] for name in fns}
    for index in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            sync(device)
            per_round[name].append((time.perf_counter() - start) / number)
        if progress is not None:
            progress(f"round {index + 1}/{rounds}")
    return {name: statistics.median(times) for name, times in per_round.items()}
