"""The measuring module (``attn_dispatch._measure``) shared by autotune, ``bench`` and the
cost-table writer: CPU timing on its replaceable clock, the cross-check's consensus, versions."""

from __future__ import annotations

import pytest
import torch

from attn_dispatch import _measure

CPU = torch.device("cpu")


class Counted:
    """A function whose every call advances a clock by ``cost`` seconds."""

    def __init__(self, cost: float) -> None:
        self.cost, self.now, self.calls = cost, 0.0, 0

    def __call__(self) -> None:
        self.now += self.cost
        self.calls += 1

    def clock(self) -> float:
        return self.now


def test_seconds_per_call_is_the_median_of_samples_sized_to_their_length(monkeypatch):
    fn = Counted(1e-3)
    monkeypatch.setattr(_measure, "clock", fn.clock)
    seconds = _measure.seconds_per_call(
        fn, CPU, repeats=3, sample_seconds=5e-3, max_calls=100, min_calls=1
    )
    assert seconds == pytest.approx(1e-3)
    assert fn.calls == 1 + 3 * 5  # one call sizes the samples, then 3 samples of 5 calls


def test_a_first_call_beyond_the_bound_is_the_answer(monkeypatch):
    fn = Counted(1.0)
    monkeypatch.setattr(_measure, "clock", fn.clock)
    seconds = _measure.seconds_per_call(
        fn, CPU, repeats=5, sample_seconds=1e-3, max_calls=100, bound=0.5
    )
    assert seconds == 1.0 and fn.calls == 1


class Recording(Counted):
    """``Counted`` whose calls 2 and 3 cost ``slow`` instead: it records them, replays the rest."""

    def __init__(self, cost: float, slow: float) -> None:
        super().__init__(cost)
        self.slow = slow

    def __call__(self) -> None:
        super().__call__()
        if self.calls in (2, 3):
            self.now += self.slow - self.cost


@pytest.mark.parametrize("bound", [float("inf"), 0.05])
def test_the_fastest_settling_call_sizes_the_samples_and_judges_the_bound(monkeypatch, bound):
    fn = Recording(1e-3, slow=1.0)
    fn()  # the caller's warm-up: the call before the recorded ones
    monkeypatch.setattr(_measure, "clock", fn.clock)
    seconds = _measure.seconds_per_call(
        fn, CPU, repeats=3, sample_seconds=4.5e-3, max_calls=100, bound=bound, settle=3
    )
    assert seconds == pytest.approx(1e-3)
    assert fn.calls == 1 + 3 + 3 * 5  # warm-up, settling calls, 3 samples of 5 replays


def test_settling_calls_all_beyond_the_bound_give_the_fastest(monkeypatch):
    fn = Recording(0.8, slow=1.0)
    monkeypatch.setattr(_measure, "clock", fn.clock)
    seconds = _measure.seconds_per_call(
        fn, CPU, repeats=5, sample_seconds=1e-3, max_calls=100, bound=0.5, settle=3
    )
    assert seconds == pytest.approx(0.8) and fn.calls == 3


def test_consensus_excludes_the_one_that_disagrees_and_trusts_priority_between_two():
    dq = torch.randn(2, 8, 2, 4, dtype=torch.float64)
    right, wrong = (dq, dq, dq), (dq, dq, 1.5 * dq)
    three = _measure.consensus({"a": wrong, "b": right, "c": right}, False, torch.float64)
    assert list(three) == ["a"] and "disagree with b, c" in three["a"]
    two = _measure.consensus({"a": right, "b": wrong}, False, torch.float64)
    assert list(two) == ["b"]
    assert _measure.consensus({"a": right, "b": right}, False, torch.float64) == {}


def test_versions_of_a_distribution_that_is_not_installed_are_none():
    found = _measure.distribution_versions(["torch", "no-such-distribution-here"])
    assert found["torch"] is not None
    assert found["no-such-distribution-here"] is None
