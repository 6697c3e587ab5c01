"""Autotune: choose among the admitted implementations by measuring them, once per signature.

Off by default. On (``ATTN_DISPATCH_AUTOTUNE=1``, or :func:`autotune`), the first call of a
signature that more than one implementation could run automatically times each of them on
clones of the call's tensors, in the call's execution mode, cross-checks their results, runs the
fastest of those that agree and remembers the choice: in the process, and in one file per
measurement under the cache directory, so that another process on the same device with the same
versions reuses it without timing again.

What may be chosen is what a fresh decision admits: the implementations that automatic
selection could pick for the call (enabled, not blocked, no rejection reason, deterministic when
determinism is asked for, a priority on the arch). A forced call is never tuned. A remembered
choice is used only while a fresh decision still admits it; otherwise the fastest admitted one
that was measured and agreed runs, and a candidate that was never measured sends the call back
to measuring.

The measurement:

* Candidates run on clones of the tensors (same shapes, strides and data-pointer residues), with
  grad recording off, so that an implementation writing into its inputs cannot corrupt the
  caller's tensors and nothing is recorded for autograd.
* Each candidate runs once untimed (compilation and warm-up; its result is the one
  cross-checked), then ``SETTLE_CALLS`` single timed calls, the fastest of which chooses how
  many calls make a sample of at least ``SAMPLE_SECONDS``; then ``REPEATS`` rounds take one
  sample of every candidate each, the order reversed from round to round, so that a device
  whose speed drifts during the measurement moves every candidate alike
  (``_measure.seconds_per_call_each``); the time is the median per call. Several settling
  calls because an implementation may record its early calls to replay later ones (FA4's
  host-code replay records its second and third): samples sized by a recording call would hold
  one call each. A candidate whose fastest settling call takes ``HOPELESS`` times the best
  settling call so far keeps that time and is not sampled (candidates settle best priority
  first). Every candidate's clones live until all are timed. On CUDA the
  samples are timed with events (which also see the host's launch cost: eager time); a call in
  ``"graph"`` mode (warm-up under ``ad.execution_mode("graph")``) is captured into a CUDA graph
  and its replays are timed. On other devices, ``_measure.clock`` (``time.perf_counter``)
  around synchronous calls.
* The cross-check (``_measure.consensus``): each pair of results is compared with the dtype's
  tolerance (``_tolerances``, the conformance kit's; each implementation may be that far from
  exact, so two may differ by twice that). The candidate that agrees with the most others
  (ties: the higher priority) defines the consensus; every candidate that disagrees with it is
  excluded, named in a ``warnings.warn``. With two candidates that disagree, the
  higher-priority one is trusted. A candidate that raises, returns malformed results or cannot
  be captured is excluded too, unless the device faulted (an illegal memory access): then
  nothing more can run on it, and the call raises ``DeviceFault`` (a ``RuntimeError``) naming
  the candidate, or the measurement when the fault shows only at its end; nothing is kept.
* Only finite answers are judged. A call whose inputs hold NaN or an infinity (lse: NaN or
  +inf; -inf is a row that sees no key) is run by the priority decision, not measured, and
  neither cached nor persisted: the next call of its signature measures. A candidate whose
  results hold NaN or an infinity (lse: NaN or +inf) is excluded when another candidate's are
  finite; when none is, nothing is judged or persisted either. A persisted measurement records
  what it was measured on (``measured_on``: every input finite, and each one's largest
  magnitude); a file without that record, or with non-finite inputs, is measured again.

Calls that cannot be measured now (being captured into a CUDA graph, on ``meta`` or fake
tensors) use a remembered choice when there is one, else the priority decision. ``explain``
and ``decide`` never measure: they show the remembered measurement, or say that none exists
yet.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import platform
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import _measure
from ._errors import SettingError
from ._report import (
    BLOCKED,
    OPT_IN,
    SELECTED,
    SUPPORTED,
    Candidate,
    Measurement,
    Report,
    Timing,
)
from ._settings import CACHE_DIR_ENV
from ._settings import AutotuneConfig as Config

log = logging.getLogger("attn_dispatch")

# Timed samples per candidate (the median is kept) and the least time one sample spans.
REPEATS = 5
SAMPLE_SECONDS = 2e-3
MAX_CALLS_PER_SAMPLE = 100
# Single timed calls before the samples (see the module docstring): the fastest sizes them.
SETTLE_CALLS = 3
# A candidate whose fastest settling call takes this many times the best settling call so far is
# not sampled (the reference backend at long sequences would cost seconds per call).
HOPELESS = 10.0
# A candidate replaces the decision's own choice only when it was measured more than this much
# faster: samples this short rank two kernels within a few percent of each other either way
# (docs/benchmarks.md section 11), and within that the decision's choice (a cost table's,
# measured at length over a grid, or the declared priority) is the better guess.
MARGIN = 0.02
# The files' layout; a file of another format is ignored (measured again). Format 2 added
# ``measured_on``: format 1 files could hold a verdict taken from non-finite answers.
FORMAT = 2
# The statuses of the implementations that accept a call (whose versions key its measurement).
ACCEPTING = (SELECTED, SUPPORTED, BLOCKED, OPT_IN)


# --- keys: what a measurement is valid for --------------------------------------------------


def device_name(device: torch.device) -> str:
    """The device a measurement was taken on: the GPU's name, or the CPU's model with the
    number of threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_cpu_model()}, {torch.get_num_threads()} threads"


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def versions(settings: Any, names: list[str]) -> dict[str, str]:
    """The versions a measurement of the implementations ``names`` depends on: torch (and its
    CUDA, cuDNN), attn_dispatch, and each candidate backend's distribution with what it
    requires."""
    from . import __version__

    found = {"attn-dispatch": __version__, "torch": torch.__version__}
    if torch.version.cuda:
        found["cuda"] = torch.version.cuda
    if torch.version.hip:
        found["hip"] = torch.version.hip
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if cudnn:
        found["cudnn"] = str(cudnn)
    for backend in sorted({name.split(":", 1)[0] for name in names}):
        record = settings.registry.backends.get(backend)
        if record is None or record.distribution is None:
            continue
        found[f"{backend}:{record.distribution}"] = record.version or "?"
        requires = _measure.distribution_versions([record.distribution], requirements=True)
        for dist, version in requires.items():
            if version is not None:
                found.setdefault(dist, version)
    return found


def _meta(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return None if t is None else repr(t)
    return [list(t.shape), list(t.stride()), str(t.dtype).removeprefix("torch.")]


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it, exactly (floats by repr)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return repr(value)


# Call fields a measurement does not depend on: the kind is the key's "mode", the forced name
# (and its source) skips measuring, the sinks' presence is their metadata's field, and autotune
# times each pass alone, whether or not it is one of an eager attention call's.
_NOT_MEASURED = ("backend", "kind", "sinks", "forced_by", "attention")


def signature_key(
    settings: Any,
    mode: str,
    call: tuple,
    tensors: tuple,
    seqlens: tuple,
    inp: Any,
    names: list[str],
) -> dict:
    """What a measurement holds for: the device, the versions of every candidate, the call's
    flags (execution mode included), its tensors' shapes, strides and dtypes, the varlen
    metadata and the attention sinks' (a call with sinks holds a field more, so the keys of
    calls without them are as they were). ``call`` is the dispatcher's ``Call`` (a NamedTuple
    of every flag)."""
    flags = {k: _plain(v) for k, v in call._asdict().items() if k not in _NOT_MEASURED}
    cu_q, cu_k, *_ = seqlens
    sinks = {} if inp.sinks is None else {"sinks": _meta(inp.sinks)}
    return sinks | {
        "device": device_name(inp.device),
        "mode": str(mode),
        "flags": flags,
        "resolved": [_plain(inp.scale), _plain(inp.max_seqlen_q), _plain(inp.max_seqlen_k)],
        "tensors": [_meta(t) for t in tensors],
        "varlen": [_meta(cu_q), _meta(cu_k), cu_q is not None and cu_q is cu_k],
        "versions": versions(settings, names),
    }


# --- the store: in memory, and one file per measurement --------------------------------------

_memory: dict[tuple[str, str], dict] = {}
_lock = threading.Lock()
_unwritable: set[str] = set()


def _file_name(key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return f"{key['mode']}-{digest[:32]}.json"


def lookup(config: Config, key: dict) -> dict | None:
    """The remembered measurement of ``key`` (this process's, else its file), or ``None``."""
    name = _file_name(key)
    memo = (str(config.directory), name)
    entry = _memory.get(memo)
    if entry is not None:
        return entry
    path = config.directory / name
    try:
        if not path.is_file():  # absent; or a directory, or a FIFO whose read would block
            if path.exists():
                log.warning("attn_dispatch: autotune: ignoring %s (not a regular file)", path)
            return None
        entry = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        # ValueError covers bad JSON and bytes that are not UTF-8 (UnicodeDecodeError);
        # the decoder raises RecursionError on deeply nested brackets
        log.warning("attn_dispatch: autotune: ignoring unreadable %s (%s)", path, exc)
        return None
    if not _well_formed(entry, key):
        log.warning("attn_dispatch: autotune: ignoring %s (another format or key)", path)
        return None
    with _lock:
        _memory[memo] = entry
    return entry


def _well_formed(entry: object, key: dict) -> bool:
    """Whether ``entry`` is a measurement of ``key`` in this format."""
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        return False
    timings, excluded = entry.get("timings"), entry.get("excluded")
    measured_on = entry.get("measured_on")
    return (
        isinstance(timings, dict)
        and isinstance(excluded, dict)
        and all(_seconds(t) for t in timings.values())
        and all(isinstance(r, str) for r in excluded.values())
        and isinstance(measured_on, dict)
        and measured_on.get("finite") is True
    )


def _seconds(value: object) -> bool:
    """Whether ``value`` is a time a measurement writes (JSON's ``true`` is not one, nor an
    integer beyond float's range, nor a time of more than an hour per call)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 3600


def store(config: Config, key: dict, entry: dict) -> None:
    """Remember ``entry`` in this process and write its file atomically (a temporary file in
    the same directory, then ``os.replace``): a concurrent reader sees the old file or the new
    one, never a part; concurrent writers of one key leave one complete measurement."""
    name = _file_name(key)
    with _lock:
        _memory[(str(config.directory), name)] = entry
    directory = config.directory
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(entry, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, directory / name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        if str(directory) not in _unwritable:
            _unwritable.add(str(directory))
            message = (
                f"autotune cannot write its measurements to {directory} ({exc}); they are kept "
                f"for this process only (set {CACHE_DIR_ENV} to a writable directory)"
            )
            log.warning("attn_dispatch: %s", message)
            warnings.warn(message, stacklevel=_caller_level())


def forget() -> None:
    """Drop the measurements this process remembers (the files stay)."""
    with _lock:
        _memory.clear()


# --- measuring --------------------------------------------------------------------------------


def _clone(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its shape, strides and data-pointer residue modulo 256 (so that an
    alignment the decision relied on still holds), owning its own memory."""
    if t.numel() == 0:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    span = t.detach().as_strided((extent,), (1,), t.storage_offset())
    item = t.element_size()
    buffer = torch.empty(extent + 256 // item, dtype=t.dtype, device=t.device)
    pad = ((t.data_ptr() - buffer.data_ptr()) % 256) // item
    buffer[pad : pad + extent].copy_(span)
    return buffer.as_strided(t.shape, t.stride(), pad)


def _cloned(inp: Any) -> tuple[Any, dict[int, torch.Tensor]]:
    """A copy of the inputs object whose every tensor is a clone (one clone per distinct
    tensor, so ``cu_seqlens_q is cu_seqlens_k`` still holds), and the clones by original id."""
    clones: dict[int, torch.Tensor] = {}
    copied = copy.copy(inp)
    for cls in type(inp).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            value = getattr(inp, slot, None)
            if isinstance(value, torch.Tensor):
                if id(value) not in clones:
                    clones[id(value)] = _clone(value)
                setattr(copied, slot, clones[id(value)])
    return copied, clones


INPUT_NAMES = ("q", "k", "v", "out", "lse", "grad_out", "sinks")
RESULT_NAMES = {"forward": ("out", "lse"), "backward": ("dq", "dk", "dv", "dsinks")}


def _non_finite(named: dict[str, Any]) -> list[str]:
    """The names of the floating-point tensors of ``named`` that hold NaN or an infinity; an
    ``lse`` only NaN or +inf (-inf is a row that sees no key). Reads the values (on a GPU it
    waits for the device): called only where a measurement is about to be taken or judged."""
    found = []
    for name, t in named.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            continue
        t = t.detach()
        bad = torch.isnan(t) | (t == math.inf) if name == "lse" else ~torch.isfinite(t)
        if bool(bad.any()):
            found.append(name)
    return found


def _inputs_of(inp: Any) -> dict[str, Any]:
    return {name: getattr(inp, name, None) for name in INPUT_NAMES}


def _measured_on(inp: Any) -> dict:
    """What a persisted measurement records about its inputs: that they were finite (the only
    inputs measured), and each tensor's largest magnitude (lse: of its finite values)."""
    largest = {}
    for name, t in _inputs_of(inp).items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            values = t.detach()
            values = values[torch.isfinite(values)] if name == "lse" else values
            largest[name] = values.abs().max().item() if values.numel() else 0.0
    return {"finite": True, "largest": largest}


def _measure_pool(mode: Any, inp: Any, tensors: tuple, pool: list, execution: str) -> dict:
    """Run and time every implementation of ``pool`` (best priority first) on clones of
    ``inp``; cross-check their finite results. Returns ``{"timings": {name: seconds},
    "excluded": {name: reason}, "judged": bool}``; ``judged`` is False when candidates ran but
    none returned finite results (nothing to compare: the measurement must not be kept). A
    candidate that fails is excluded alone, but a device fault raises
    :class:`~._measure.DeviceFault` (naming the candidate, or the measurement when the fault
    shows only at its end) and nothing is kept: the device can run nothing more."""
    device = inp.device
    forward = mode.kind == "forward"
    graph = execution == "graph" and device.type == "cuda"
    results: dict[str, tuple] = {}
    excluded: dict[str, str] = {}
    # each candidate's call on its own clones, kept until every candidate is timed
    fns: dict[str, Callable[[], Any]] = {}
    with torch.no_grad(), torch.cuda.device(device) if device.type == "cuda" else _nothing():
        for impl in pool:
            name = impl.full_name
            run = getattr(impl, mode.kind)
            try:  # a broken candidate costs only itself; a bad setting is the caller's error
                # its own clones (one that cannot be allocated excludes it alone)
                cand, clones = _cloned(inp)
                cloned_tensors = tuple(clones.get(id(t), t) for t in tensors)
                # timed as the dispatcher runs it: with its plan, made outside the timing
                cand.plan = impl.prepare(cand)
                result = mode.checked(impl, run(cand), cloned_tensors, inp.facts, cand.sinks)
                _measure.synchronize(device)
            except SettingError:
                raise
            except Exception as exc:
                why = _measure.failure(f"autotune's {mode.kind} of {name}", exc)
                excluded[name] = f"raised {why}"
                log.warning("attn_dispatch: autotune excluded %s: %s", name, excluded[name])
                continue
            fn = functools.partial(run, cand)
            try:
                fns[name] = _measure.graph_replays([fn], device)[0] if graph else fn
            except SettingError:
                raise
            except Exception as exc:
                what = f"autotune's CUDA graph capture of {name}'s {mode.kind}"
                why = _measure.failure(what, exc)
                excluded[name] = f"cannot be captured into a CUDA graph: {why}"
                log.warning("attn_dispatch: autotune excluded %s: %s", name, excluded[name])
                continue
            results[name] = _measure.answer(result)  # dsinks cross-checked as the gradients
        timings, errors = _measure.seconds_per_call_each(
            fns,
            device,
            repeats=REPEATS,
            sample_seconds=SAMPLE_SECONDS,
            max_calls=MAX_CALLS_PER_SAMPLE,
            settle=SETTLE_CALLS,
            hopeless=HOPELESS,
        )
    measured = list(fns)
    del fns  # the candidates' graphs and clones, released before the device is asked
    fault = _measure.device_fault(device)
    if fault is not None:
        raise _measure.DeviceFault(
            f"the device faulted during autotune's {execution} measurement of "
            f"{', '.join(measured)} ({mode.kind}): {fault}"
        )
    for name, exc in errors.items():
        if isinstance(exc, SettingError):
            raise exc
        excluded[name] = f"raised while timed: {_measure.describe_error(exc)}"
        log.warning("attn_dispatch: autotune excluded %s: %s", name, excluded[name])
        results.pop(name)
    non_finite = {
        name: bad
        for name, result in results.items()
        if (bad := _non_finite(dict(zip(RESULT_NAMES[mode.kind], result))))
    }
    finite = {name: r for name, r in results.items() if name not in non_finite}
    if non_finite and not finite:
        return {"timings": timings, "excluded": excluded, "judged": False}
    for name, bad in non_finite.items():
        reason = (
            f"returned non-finite {', '.join(bad)} where {', '.join(finite)} returned finite values"
        )
        _exclude(name, reason, excluded, timings)
    for name, reason in _measure.consensus(finite, forward, inp.dtype).items():
        _exclude(name, reason, excluded, timings)
    return {"timings": timings, "excluded": excluded, "judged": True}


def _exclude(name: str, reason: str, excluded: dict[str, str], timings: dict) -> None:
    """Record ``name``'s exclusion and say so (log and ``warnings.warn``)."""
    excluded[name] = reason
    timings.pop(name, None)
    message = f"autotune excluded {name}: {reason}"
    log.warning("attn_dispatch: %s", message)
    warnings.warn(message, stacklevel=_caller_level())


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside this package (the
    user's call, however deep the dispatch path)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def _can_measure_now(inp: Any) -> str | None:
    """Why the call cannot be measured now, or ``None``."""
    from torch._subclasses.fake_tensor import FakeTensor

    if inp.device.type == "meta" or isinstance(inp.q, FakeTensor):
        return "meta or fake tensors"
    if torch.compiler.is_compiling():
        return "traced by torch.compile"
    if inp.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return "called while a CUDA graph is captured (warm up under ad.execution_mode('graph'))"
    return None


# --- the decision -------------------------------------------------------------------------------


def _pool(report: Report) -> list[str]:
    """The names automatic selection could pick, best priority first."""
    return [
        c.name
        for c in report.candidates
        if c.status in (SELECTED, SUPPORTED) and c.priority is not None
    ]


def _fastest(entry: dict, admitted: list[str], preferred: str) -> str | None:
    """The fastest measured of ``admitted``, unless ``preferred`` (the decision's own choice)
    was measured within :data:`MARGIN` of it."""
    times = entry["timings"]
    measured = [name for name in admitted if name in times]
    best = min(measured, key=lambda name: (times[name], admitted.index(name)), default=None)
    if best is not None and preferred in times and times[preferred] <= times[best] * (1 + MARGIN):
        return preferred
    return best


def _single(report: Report) -> Report:
    """``report`` of a decision with one admitted candidate: nothing to measure."""
    note = "one implementation can run these inputs: nothing to measure"
    return dataclasses.replace(report, autotune=Measurement("single", (), note))


def without_device(report: Report) -> Report:
    """The report of an automatic decision under autotune for a device that is not here (meta
    tensors, another arch): nothing can be timed or looked up; it says what a first call on
    such a device will time."""
    admitted = _pool(report)
    if len(admitted) < 2:
        return _single(report)
    note = (
        "not measured (no device to time: meta tensors or another arch); a first call on the "
        f"device will time {', '.join(admitted)}"
    )
    return dataclasses.replace(report, autotune=Measurement("pending", (), note))


def choose(
    settings: Any,
    mode: Any,
    inp: Any,
    call: tuple,
    tensors: tuple,
    seqlens: tuple,
    report: Report,
    *,
    measure: bool,
) -> tuple[Report, Any]:
    """The report and implementation of an automatic decision under autotune: the measured
    choice among the report's admitted candidates (measuring them first when ``measure`` and
    nothing remembered covers them), else the priority decision with a note saying why."""
    registry = settings.registry
    admitted = _pool(report)
    winner = registry.implementations[report.selected]
    if len(admitted) < 2:
        return _single(report), winner
    real = [t for t in tensors if t is not None]
    # versions of every implementation that accepts the inputs, blocked or opt-in ones too:
    # blocking or enabling one later changes what may run, not what was measured
    accepting = [c.name for c in report.candidates if c.status in ACCEPTING]
    key = signature_key(settings, mode.kind, call, tuple(real), seqlens, inp, accepting)
    entry = lookup(settings.autotune, key)
    covered = entry is not None and all(
        n in entry["timings"] or n in entry["excluded"] for n in admitted
    )
    status = "reused"
    if not covered:
        why_not = None if measure else "explain and decide never measure"
        why_not = why_not or _can_measure_now(inp)
        if why_not is not None:
            note = f"not measured ({why_not}); the first call will time {', '.join(admitted)}"
            return dataclasses.replace(report, autotune=Measurement("pending", (), note)), winner
        bad = _non_finite(_inputs_of(inp))
        if bad:
            note = (
                f"not measured (non-finite {', '.join(bad)}): the priority decision runs; the "
                f"next call of this signature will time {', '.join(admitted)}"
            )
            return dataclasses.replace(report, autotune=Measurement("pending", (), note)), winner
        pool = [registry.implementations[name] for name in admitted]
        start = time.perf_counter()
        found = _measure_pool(mode, inp, real, pool, call.execution)
        if not found["judged"]:
            note = (
                "not measured (no candidate returned finite results): the priority decision "
                f"runs; the next call of this signature will time {', '.join(admitted)}"
            )
            return dataclasses.replace(report, autotune=Measurement("pending", (), note)), winner
        entry = {
            "format": FORMAT,
            "key": key,
            "timings": found["timings"],
            "excluded": found["excluded"],
            "repeats": REPEATS,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "measured_on": _measured_on(inp),
        }
        store(settings.autotune, key, entry)
        status = "measured"
        log.info(
            "attn_dispatch: autotune measured %s %r in %.2f s: %s",
            mode.kind,
            inp,
            time.perf_counter() - start,
            ", ".join(f"{n} {t * 1e6:.1f} us" for n, t in found["timings"].items()),
        )
    chosen = _fastest(entry, admitted, report.selected)
    timings = tuple(
        Timing(name, entry["timings"].get(name), entry["excluded"].get(name)) for name in admitted
    )
    if chosen is None:
        note = "no admitted implementation passed the measurement: the priority decision runs"
        measurement = Measurement("failed", timings, note)
        return dataclasses.replace(report, autotune=measurement), winner
    source = "measured now" if status == "measured" else "measured earlier"
    note = f"{source}, {call.execution} execution, median of {entry.get('repeats', REPEATS)}"
    measurement = Measurement(status, timings, f"{note}; file {_file_name(key)}")
    return _reselected(report, chosen, measurement), registry.implementations[chosen]


def _reselected(report: Report, chosen: str, measurement: Measurement) -> Report:
    candidates = []
    for c in report.candidates:
        if c.name == chosen:
            candidates.append(Candidate(c.name, c.priority, c.opt_in, SELECTED, ()))
        elif c.status == SELECTED:
            candidates.append(Candidate(c.name, c.priority, c.opt_in, SUPPORTED, ()))
        else:
            candidates.append(c)
    candidates.sort(key=lambda c: c.status != SELECTED)
    return dataclasses.replace(
        report, selected=chosen, candidates=tuple(candidates), autotune=measurement
    )
