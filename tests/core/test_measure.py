"""The measuring module (``attn_dispatch._measure``) shared by autotune, ``bench`` and the
cost-table writer: CPU timing on its replaceable clock, the cross-check's consensus, versions."""

from __future__ import annotations

import itertools

import pytest
import torch

import attn_dispatch as ad
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


class Drifting:
    """A device that slows down as it works: each call costs ``cost`` times ``1 + rate * t``,
    ``t`` the seconds worked so far (one clock for all the functions it makes)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.now = rate, 0.0
        self.calls: list[str] = []

    def function(self, name: str, cost: float):
        def call() -> None:
            self.now += cost * (1 + self.rate * self.now)
            self.calls.append(name)

        return call

    def clock(self) -> float:
        return self.now


MEASURE = dict(repeats=5, sample_seconds=4.0, max_calls=100)


def test_candidates_timed_in_rounds_rank_alike_on_a_drifting_device(monkeypatch):
    # b is 5% faster than a; timed one after the other, b runs on a device already slowed by
    # a's whole measurement and looks slower; in rounds both see the same drift
    one_after_the_other = Drifting(rate=0.005)
    monkeypatch.setattr(_measure, "clock", one_after_the_other.clock)
    a, b = (one_after_the_other.function(n, c) for n, c in (("a", 1.0), ("b", 0.95)))
    apart = {n: _measure.seconds_per_call(f, CPU, **MEASURE) for n, f in (("a", a), ("b", b))}
    assert apart["b"] > apart["a"]

    in_rounds = Drifting(rate=0.005)
    monkeypatch.setattr(_measure, "clock", in_rounds.clock)
    fns = {n: in_rounds.function(n, c) for n, c in (("a", 1.0), ("b", 0.95))}
    times, errors = _measure.seconds_per_call_each(fns, CPU, **MEASURE)
    assert errors == {} and times["b"] < times["a"]
    # one settling call each, then 5 rounds of one sample each (4 calls of a, 5 of b), the
    # order reversed from round to round: a b | b a | a b | b a | a b
    runs = [(name, len(list(group))) for name, group in itertools.groupby(in_rounds.calls[2:])]
    assert in_rounds.calls[:2] == ["a", "b"]
    assert runs == [("a", 4), ("b", 10), ("a", 8), ("b", 10), ("a", 8), ("b", 5)]


def test_a_hopeless_or_failing_candidate_is_not_sampled(monkeypatch):
    device = Drifting(rate=0.0)
    monkeypatch.setattr(_measure, "clock", device.clock)

    def broken() -> None:
        raise RuntimeError("no kernel")

    fns = {
        "quick": device.function("quick", 1.0),
        "broken": broken,
        "hopeless": device.function("hopeless", 20.0),
    }
    times, errors = _measure.seconds_per_call_each(fns, CPU, hopeless=10.0, **MEASURE)
    assert times == {"quick": pytest.approx(1.0), "hopeless": pytest.approx(20.0)}
    assert list(errors) == ["broken"] and "no kernel" in str(errors["broken"])
    assert device.calls.count("hopeless") == 1  # its settling call alone


ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize(
    ("exc", "fault"),
    [
        (RuntimeError(ILLEGAL_ACCESS), True),
        (RuntimeError("CUDA error: misaligned address"), True),
        (RuntimeError("CUDA error: unspecified launch failure"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
        (RuntimeError("Expected all tensors to be on the same device"), False),
        (ValueError(ILLEGAL_ACCESS), False),
    ],
    ids=["illegal access", "misaligned", "launch failure", "out of memory", "devices", "value"],
)
def test_a_device_fault_is_told_from_an_error_of_one_call(exc, fault):
    assert _measure.is_device_fault(exc) is fault


def test_a_device_fault_while_timed_stops_the_measurement_naming_the_candidate(monkeypatch):
    """Candidates that raise cost only themselves, but after a device fault nothing can run:
    the measurement stops there, naming the candidate whose call reported it."""
    fast, later = Counted(1e-3), Counted(1e-3)
    monkeypatch.setattr(_measure, "clock", fast.clock)

    def broken():
        raise RuntimeError("an error of this call alone")

    def faulting():
        raise RuntimeError(ILLEGAL_ACCESS)

    fns = {"fast": fast, "broken": broken, "faulting": faulting, "later": later}
    # users catch it by its public name
    with pytest.raises(ad.DeviceFault, match="while faulting ran: RuntimeError: CUDA"):
        _measure.seconds_per_call_each(
            fns, CPU, repeats=3, sample_seconds=5e-3, max_calls=100, settle=1
        )
    assert later.calls == 0


def test_device_fault_reads_nothing_off_cuda():
    assert _measure.device_fault(CPU) is None
