"""benchmarks/_timing.py: the rounds of several rows interleave."""

from __future__ import annotations

import torch
from _timing import interleaved_medians


def test_rounds_go_across_the_rows_and_each_row_gets_its_median() -> None:
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b")}
    lines: list[str] = []
    seconds = interleaved_medians(fns, torch.device("cpu"), 1, 3, 2, lines.append)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 3
    assert set(seconds) == {"a", "b"} and all(s >= 0 for s in seconds.values())
    assert lines == ["round 1/3", "round 2/3", "round 3/3"]
