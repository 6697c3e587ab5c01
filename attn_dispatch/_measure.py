"""Measuring implementations: timing, CUDA-graph replays, agreement of answers, versions.

The one place where autotune (``_autotune``), the ``bench`` command (``tools/bench.py``) and the
cost-table writer (``benchmarks/cost_grid.py``) time calls, capture them into CUDA graphs,
judge whether two implementations' answers agree and record the versions they measured.

* Timing: on CUDA, events around the calls (the device's time, which also sees the host's
  launch cost when the calls are eager); elsewhere :data:`clock` around synchronous calls.
* Agreement: two answers agree within twice the dtype's tolerance of :mod:`._tolerances` (each
  may be that far from exact); the consensus of several is :func:`consensus`.
* Device faults: a candidate that fails costs only itself, unless the device faulted (an
  illegal memory access, a kernel that trapped). Every later operation on that device fails,
  so measuring stops there with :class:`DeviceFault`, naming what ran last.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from ._execution import execution_mode
from ._tolerances import error_metrics, tolerance_for

# Seconds of the CPU timings (CUDA ones are the device's events). Replaceable so that tests
# measure counted work instead of a wall-clock ratio, which a loaded machine skews.
clock: Callable[[], float] = time.perf_counter


# --- device faults ------------------------------------------------------------------------

# How CUDA words the errors after which the device (its context) can no longer run anything.
_FAULT_WORDS = (
    "illegal memory access",
    "misaligned address",
    "illegal instruction",
    "unspecified launch failure",
    "device-side assert triggered",
    "hardware stack error",
    "invalid program counter",
)


class DeviceFault(RuntimeError):
    """The device faulted while something was measured: nothing more can run on it (the
    process must end), and the message names what ran last."""


def is_device_fault(exc: BaseException) -> bool:
    """Whether ``exc`` reports a device fault (an ``AcceleratorError`` or ``RuntimeError``,
    depending on the torch release), as opposed to an error of one call (a refused argument,
    an allocation that did not fit)."""
    if isinstance(exc, DeviceFault):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(word in text for word in _FAULT_WORDS)


def raise_fault(what: str, exc: BaseException) -> None:
    """Raise :class:`DeviceFault` when ``exc``, raised while ``what`` ran, is a device fault
    (naming ``what``); return otherwise: an error of one call is the caller's to record."""
    if not is_device_fault(exc):
        return
    if isinstance(exc, DeviceFault):
        raise exc
    notes = "".join(f" {note}" for note in getattr(exc, "__notes__", ()))  # the dispatcher's
    raise DeviceFault(f"the device faulted while {what} ran: {describe_error(exc)}{notes}") from exc


def failure(what: str, exc: BaseException) -> str:
    """``exc``, raised while ``what`` ran, as a one-line note of that candidate's failure; a
    device fault raises instead (:func:`raise_fault`): recorded as one candidate's error, it
    would be charged to every one after it."""
    raise_fault(what, exc)
    return describe_error(exc)


def device_fault(device: torch.device) -> str | None:
    """The asynchronous fault ``device`` reports, if any: waits for its queued work, so a
    kernel that faulted is named by the check that launched it, not by a later one that
    happens to synchronize first."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
    except Exception as exc:  # an AcceleratorError or RuntimeError, depending on the release
        return f"{type(exc).__name__}: {exc}"
    return None


# --- timing -------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work (nothing to wait for off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclasses.dataclass
class Span:
    """One timed stretch of calls: the host's seconds, and on CUDA the events around it."""

    host: float
    events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def seconds(self) -> float:
        """The stretch's seconds: between its events on CUDA (waits for the end one), else the
        host's."""
        if self.events is None:
            return self.host
        start, end = self.events
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def timed(fn: Callable[[], Any], device: torch.device, calls: int = 1) -> Span:
    """``calls`` back-to-back calls of ``fn``, timed (nothing waits: read the span later)."""
    events = None
    if device.type == "cuda":
        events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        events[0].record()
    begin = clock()
    for _ in range(calls):
        fn()
    host = clock() - begin
    if events is not None:
        events[1].record()
    return Span(host, events)


def sample(fn: Callable[[], Any], device: torch.device, calls: int) -> float:
    """Seconds per call over ``calls`` back-to-back calls, started on an idle device."""
    synchronize(device)
    return timed(fn, device, calls).seconds() / calls


def seconds_per_call(fn: Callable[[], Any], device: torch.device, **sampling: Any) -> float:
    """The median seconds per call of ``fn`` (warmed up by the caller), measured as
    :func:`seconds_per_call_each` measures one candidate; its exception, if it raises."""
    times, errors = seconds_per_call_each({"fn": fn}, device, **sampling)
    if errors:
        raise errors["fn"]
    return times["fn"]


def seconds_per_call_each(
    fns: Mapping[str, Callable[[], Any]],
    device: torch.device,
    *,
    repeats: int,
    sample_seconds: float,
    max_calls: int,
    min_calls: int = 1,
    settle: int = 1,
    bound: float = math.inf,
    hopeless: float = math.inf,
) -> tuple[dict[str, float], dict[str, Exception]]:
    """Each of ``fns``'s median seconds per call, its samples taken in rounds, and the
    exceptions of those that raised (left out of the times).

    First, in ``fns``'s order, each one's ``settle`` single calls (at least one): the fastest
    sizes its samples, each enough back-to-back calls to last ``sample_seconds`` (``min_calls``
    to ``max_calls``). More than one because an implementation may spend its first calls
    learning what later ones replay: sized by such a call, samples would be a call or two
    each, every one timed from an idle device, and one slow call would make it look hopeless.
    One whose fastest settling call is slower than ``bound``, or than ``hopeless`` times the
    best so far, keeps that as its time and is not sampled (it cannot win). Then ``repeats``
    rounds, each taking one sample of every sampled one in turn, the order reversed from one
    round to the next: a device whose speed drifts while it is measured (its clocks, its
    temperature, other work) moves every candidate's samples alike, where candidates timed one
    after another would each see another part of the drift. A device fault raises
    :class:`DeviceFault` naming the candidate whose call reported it."""
    times: dict[str, float] = {}
    errors: dict[str, Exception] = {}
    settled: dict[str, float] = {}
    calls: dict[str, int] = {}
    for name, fn in fns.items():
        try:
            first = min(sample(fn, device, 1) for _ in range(max(settle, 1)))
        except Exception as exc:  # a broken candidate costs only itself
            raise_fault(name, exc)
            errors[name] = exc
            continue
        if first > min(bound, hopeless * min(settled.values(), default=math.inf)):
            times[name] = first
            continue
        settled[name] = first
        calls[name] = max(min_calls, min(max_calls, math.ceil(sample_seconds / max(first, 1e-9))))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for _ in range(repeats):
        for name in order:
            if name in errors:
                continue
            try:
                samples[name].append(sample(fns[name], device, calls[name]))
            except Exception as exc:
                raise_fault(name, exc)
                errors[name] = exc
        order.reverse()
    for name, taken in samples.items():
        if name not in errors:
            times[name] = sorted(taken)[len(taken) // 2]
    return times, errors


class GraphReplay:
    """Replays one captured CUDA graph, holding the call it captured: a graph records the
    addresses of the tensors its kernels read, not the tensors, so the call (and through it
    those tensors) must live as long as the replay. Released earlier, their memory returns to
    PyTorch's cache, and the next capture's ``empty_cache`` can hand it back to the driver: a
    later replay then reads unmapped memory (``an illegal memory access``)."""

    __slots__ = ("graph", "call")

    def __init__(self, graph: torch.cuda.CUDAGraph, call: Callable[[], Any]) -> None:
        self.graph = graph
        self.call = call

    def __call__(self) -> None:
        self.graph.replay()


def graph_replays(
    calls: Sequence[Callable[[], Any]], device: torch.device
) -> list[Callable[[], Any]]:
    """One CUDA graph per call of ``calls``; returns their replays (:class:`GraphReplay`).

    The calls run once more on a side stream first, as ``torch.cuda.graph`` asks (lazy
    initialisation must not happen during a capture), declared as graph execution so that a
    dispatched call warms up the decision its capture reuses; each replay keeps its graph's
    memory and its call (with the tensors the call reads) alive."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), execution_mode("graph"):
        for call in calls:
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    replays = []
    for call in calls:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        replays.append(GraphReplay(graph, call))
    return replays


def describe_error(exc: BaseException) -> str:
    """``exc`` in one short line, for a report or a row."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


# --- agreement ----------------------------------------------------------------------------


def answer(result: Any) -> tuple:
    """The tensors of a forward's or backward's result that are cross-checked: ``(out, lse)``,
    or ``(dq, dk, dv)`` with ``dsinks`` when the call had sinks."""
    dsinks = getattr(result, "dsinks", None)
    return tuple(result) + (() if dsinks is None else (dsinks,))


def agreement(a: tuple, b: tuple, forward: bool, dtype: torch.dtype) -> str | None:
    """``None`` when answers ``a`` and ``b`` (see :func:`answer`) agree within twice the dtype's
    tolerance, else what differs."""
    tol = tolerance_for(dtype)
    tensors = [(x, y) for x, y in zip(a, b) if isinstance(x, torch.Tensor)]
    floor = 0.0
    if not forward:  # dq, dk, dv: the kit's floor, a tenth of the largest of them (dsinks, a
        # sum over every row, would make it too loose for them; it is compared without one)
        floor = 0.1 * max(
            (y.detach().abs().max().item() for _, y in tensors[:3] if y.numel()), default=0.0
        )
    names = ("out", "lse") if forward else ("dq", "dk", "dv", "dsinks")
    for index, (x, y) in enumerate(tensors):
        name = names[index] if index < len(names) else f"result {index}"
        if forward and index == 1:
            xd, yd = x.detach().double(), y.detach().double()
            if not torch.equal(torch.isneginf(xd), torch.isneginf(yd)):
                return f"{name}: -inf at other rows"
            finite = torch.isfinite(yd)
            diff = (xd - yd).abs()[finite]
            bound = 2 * (tol.lse_atol + tol.lse_rtol * yd.abs()[finite])
            if torch.isnan(xd).any() or bool((diff > bound).any()):
                worst = diff.max().item() if diff.numel() else float("nan")
                return f"{name}: |difference| up to {worst:.3g}"
            continue
        max_err, rel_l2 = error_metrics(x, y, 0.0 if index >= 3 else floor)
        if not (max_err <= 2 * tol.max_err and rel_l2 <= 2 * tol.rel_l2):
            return f"{name}: max_err={max_err:.3g}, rel_l2={rel_l2:.3g}"
    return None


def consensus(answers: dict[str, tuple], forward: bool, dtype: torch.dtype) -> dict[str, str]:
    """The candidates of ``answers`` (ordered best priority first) that disagree with the
    consensus, with why: the candidate that agrees with the most others (ties: the higher
    priority) defines it, so of two that disagree the higher-priority one is trusted."""
    names = list(answers)
    if len(names) < 2:
        return {}
    differs = {
        (a, b): agreement(answers[a], answers[b], forward, dtype)
        for a in names
        for b in names
        if a != b
    }
    agreeing = {a: [b for b in names if b != a and differs[(a, b)] is None] for a in names}
    pivot = max(names, key=lambda a: (len(agreeing[a]), -names.index(a)))
    agreed = [pivot, *agreeing[pivot]]
    return {
        name: (
            f"its results disagree with {', '.join(agreed)} beyond the "
            f"{str(dtype).removeprefix('torch.')} tolerance ({differs[(name, pivot)]})"
        )
        for name in names
        if name not in agreed
    }


# --- versions -----------------------------------------------------------------------------


def distribution_versions(
    distributions: Iterable[str], *, requirements: bool = False
) -> dict[str, str | None]:
    """Each distribution's installed version (``None`` when it is not installed); with
    ``requirements``, also those of the installed distributions each one requires (a kernel
    library a backend wraps, such as flash-attn-4 or triton, changes its speed)."""
    found: dict[str, str | None] = {}
    for distribution in distributions:
        for name, version in _versions(distribution, requirements):
            found.setdefault(name, version)
    return found


@functools.cache
def _versions(distribution: str, requirements: bool) -> tuple[tuple[str, str | None], ...]:
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    try:
        found = {distribution: metadata.version(distribution)}
        requires = (metadata.requires(distribution) or []) if requirements else []
    except metadata.PackageNotFoundError:
        return ((distribution, None),)
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            found.setdefault(req.name, metadata.version(req.name))
        except metadata.PackageNotFoundError:
            continue
    return tuple(sorted(found.items()))
