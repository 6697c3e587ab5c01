"""Choosing an implementation: every candidate's verdict, then the winner.

Precedence of a forced name: ``backend=`` > ``use_backend()`` > ``ATTN_DISPATCH_BACKEND``.
Automatic choice: among enabled, unblocked implementations with a priority for the arch and no
rejection reasons, the highest priority wins (ties: alphabetical), except that those a recorded
cost table predicts (``_costs``) rank among themselves by predicted time, in the place of the
best priority among them; the others keep their places by priority. A pass of an eager
``attention`` call is ranked by the tables' attention rows of its layout (a forward and its
backward through such a call, autograd node included) where they cover every candidate that its
pass rows cover, else by its pass rows (:func:`_as_attention`). A forced choice never falls
back and needs no priority entry.

The decision is cached per input signature, so what ``supports`` and ``priority_for_inputs`` read
must be part of it. They see the call's tensors as :class:`Probe` views: metadata as is, and
``data_ptr()`` reduced to its residue modulo :data:`POINTER_RESIDUE` (all an alignment check
needs). Reading it is recorded, and the decision is then also keyed on those residues; nothing
else about a pointer can be read. ``cu_seqlens_q is cu_seqlens_k`` holds for the probes exactly
when it holds for the tensors (the signature keys it); every other tensor gets its own probe.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from . import _costs
from ._arch import Arch
from ._capabilities import input_reasons, where_reasons
from ._errors import NoBackendError, SettingError
from ._execution import EAGER
from ._implementation import Implementation
from ._inputs import BackwardInputs, ForwardInputs
from ._registry import describe_error
from ._report import BLOCKED, FAILED, OPT_IN, REJECTED, SELECTED, SUPPORTED, Candidate, Report
from ._settings import DISABLE_ENV, Settings, costs_directory

log = logging.getLogger("attn_dispatch")

# Decisions that read data pointers are keyed on each pointer modulo this (bytes).
POINTER_RESIDUE = 256
# A plugin hook running longer than this is reported (seconds); the watchdog looks this often.
SLOW_HOOK_S = 2.0
WATCH_INTERVAL_S = 1.0

NON_DETERMINISTIC = (
    "deterministic=True was requested (argument or "
    "torch.use_deterministic_algorithms); this implementation is not deterministic"
)


_reads = threading.local()


class Probe(torch.Tensor):
    """A call's tensor as the plugin hooks of selection see it (see the module docstring)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def data_ptr(self) -> int:
        _reads.pointers = True
        return super().data_ptr() % POINTER_RESIDUE


def _probe(t):
    return t.as_subclass(Probe) if isinstance(t, torch.Tensor) else t


def probed(inp: ForwardInputs) -> ForwardInputs:
    """``inp`` with every tensor replaced by its own :class:`Probe` (flags and facts shared)."""
    probe = copy.copy(inp)
    names = _BACKWARD_TENSORS if isinstance(inp, BackwardInputs) else _FORWARD_TENSORS
    for name in names:
        setattr(probe, name, _probe(getattr(inp, name)))
    if inp.cu_seqlens_k is inp.cu_seqlens_q:  # a supports() may test their identity
        probe.cu_seqlens_k = probe.cu_seqlens_q
    return probe


# The tensor attributes of each inputs class, probed by :func:`probed`.
_FORWARD_TENSORS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "sinks")
_BACKWARD_TENSORS = _FORWARD_TENSORS + ("out", "lse", "grad_out")


class _Watchdog:
    """Reports plugin hooks that run long, from a daemon thread, while they still run: a hook
    that never returns blocks the dispatch of every new signature, and this names it."""

    def __init__(self) -> None:
        self.running: dict[int, tuple[str, float]] = {}
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def call(self, what: str, fn: Callable, *args):
        """``fn(*args)``, watched; a slow one is also reported when it returns."""
        if self.thread is None:
            self._start()
        me = threading.get_ident()
        start = time.perf_counter()
        self.running[me] = (what, start)
        try:
            return fn(*args)
        finally:
            del self.running[me]
            took = time.perf_counter() - start
            if took > SLOW_HOOK_S:
                message = (
                    f"{what} took {took:.1f} s; it runs on the first call of every input "
                    "signature and must be cheap"
                )
                log.warning("attn_dispatch: %s", message)
                warnings.warn(message, stacklevel=2)

    def _start(self) -> None:
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._watch, name="attn_dispatch-watchdog", daemon=True
                )
                self.thread.start()

    def _watch(self) -> None:
        reported: set[tuple[int, float]] = set()
        while True:
            time.sleep(WATCH_INTERVAL_S)
            now = time.perf_counter()
            for ident, (what, start) in list(self.running.items()):
                if now - start > SLOW_HOOK_S and (ident, start) not in reported:
                    reported.add((ident, start))
                    log.warning(
                        "attn_dispatch: %s has been running for %.1f s; dispatch waits for it "
                        "(supports and priority_for_inputs must be cheap)",
                        what,
                        now - start,
                    )
            reported = {entry for entry in reported if entry[0] in self.running}


_watchdog = _Watchdog()


def _reasons(
    impl: Implementation, inp: ForwardInputs, probe: ForwardInputs, arch: Arch, mode: str
) -> list[str]:
    """The core's reasons (mode, determinism, declared capabilities), then ``supports``'s."""
    reasons = []
    if mode == "forward" and not impl.has_forward:
        reasons.append("provides no forward")
    if inp.deterministic and not impl.deterministic:
        reasons.append(NON_DETERMINISTIC)
    where = where_reasons(impl, inp, arch)
    if where:
        return reasons + where
    reasons += input_reasons(impl, inp)
    if impl.alignment is not None:
        _reads.pointers = True
    answer = _watchdog.call(f"{impl.full_name} supports()", impl.supports, probe, arch)
    if not isinstance(answer, (list, tuple)) or not all(isinstance(r, str) for r in answer):
        raise TypeError(f"supports() must return a list of str, got {answer!r}")
    return reasons + list(answer)


def _checked_priority(what: str, priority: object) -> int | None:
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise TypeError(f"{what} must return an int or None, got {priority!r}")
    return priority


def _verdict(
    impl: Implementation,
    inp: ForwardInputs,
    probe: ForwardInputs,
    arch: Arch,
    mode: str,
    settings: Settings,
    forced: str | None,
    execution: str,
) -> Candidate:
    name = impl.full_name
    try:
        # ``priority`` may have been changed since the plugin loaded, or priority_for overridden
        priority = _checked_priority("priority_for()", impl.priority_for(arch))
    except SettingError:  # the user's setting is wrong, not the plugin: never another kernel
        raise
    except Exception as exc:  # a broken plugin costs only itself
        reason = f"its priority for {arch.name}: {describe_error(exc)}"
        return Candidate(name, None, False, FAILED, (reason,))
    try:
        reasons = _reasons(impl, inp, probe, arch, mode)
    except SettingError:
        raise
    except Exception as exc:
        return Candidate(
            name, priority, impl.opt_in, FAILED, (f"supports() raised {describe_error(exc)}",)
        )
    try:
        what = f"{name} priority_for_execution()"
        priority_in = _watchdog.call(what, impl.priority_for_execution, probe, arch, execution)
        priority = _checked_priority("priority_for_execution()", priority_in)
    except SettingError:
        raise
    except Exception as exc:
        return Candidate(
            name,
            priority,
            impl.opt_in,
            FAILED,
            (f"priority_for_execution() raised {describe_error(exc)}",),
        )
    if settings.matches(settings.disabled, name):
        return Candidate(
            name, priority, impl.opt_in, BLOCKED, (f"blocked by {DISABLE_ENV}",) + tuple(reasons)
        )
    if reasons:
        return Candidate(name, priority, impl.opt_in, REJECTED, tuple(reasons))
    is_forced = forced is not None and (forced == name or forced == impl.backend)
    if impl.opt_in and not is_forced and not settings.matches(settings.enabled, name):
        hint = (
            f"opt-in: enable with ATTN_DISPATCH_ENABLE={impl.backend} or "
            f"attn_dispatch.enable({impl.backend!r}), or force it"
        )
        why = (f"opt-in because {impl.opt_in_reason}",) if impl.opt_in_reason else ()
        return Candidate(name, priority, True, OPT_IN, why + (hint,))
    note = (
        ()
        if priority is not None
        else (f"no priority entry for {arch.name}: runs only when forced",)
    )
    return Candidate(name, priority, impl.opt_in, SUPPORTED, note)


def cost_tables_of(impl: Implementation) -> tuple[str | None, tuple[Path, str]]:
    """Where ``impl``'s cost tables are looked up (``_costs.predict``'s ``package`` and
    ``user``): the package that ships them, and the user's table directory with the package
    its table there is named after."""
    return _costs.tables_of(impl), (costs_directory(), _costs.owner(impl))


def _with_prediction(
    candidate: Candidate,
    impl: Implementation,
    inp: ForwardInputs,
    arch: Arch,
    mode: str,
    execution: str,
) -> Candidate:
    """``candidate`` with its cost table's prediction (and where it came from) when one covers
    ``inp``; a table that cannot be read fails this implementation alone."""
    try:
        package, user = cost_tables_of(impl)
        p = _costs.predict(package, candidate.name, mode, execution, arch, inp, user)
    except _costs.CostTableError as exc:
        return replace(candidate, status=FAILED, reasons=(str(exc),))
    if p is None:
        return candidate
    return replace(candidate, predicted_us=p.us, prediction=p.source)


def _as_attention(
    verdicts: list[Candidate], registry, inp: ForwardInputs, arch: Arch, layout: str
) -> list[Candidate]:
    """``verdicts`` predicted by the attention rows of ``layout`` where those cover every
    candidate that the pass's rows predict (one kind of time ranks them all), else as they are.
    An eager ``attention`` call pays its autograd node's host work beside the two passes', less
    with an implementation's own node (``Implementation.autograd_forward``), whose form depends
    on the layout; the attention rows time the whole call, so they rank that too."""
    ranked = [c for c in verdicts if c.predicted_us is not None and c.priority is not None]
    if not ranked:
        return verdicts
    whole, kind = {}, _costs.attention_kind(layout)
    for c in ranked:
        try:
            package, user = cost_tables_of(registry.implementations[c.name])
            p = _costs.predict(package, c.name, kind, EAGER, arch, inp, user)
        except _costs.CostTableError:
            p = None  # the pass's prediction read the same tables: it would have failed too
        if p is None:
            return verdicts
        whole[c.name] = p
    return [
        replace(c, predicted_us=whole[c.name].us, prediction=whole[c.name].source)
        if c.name in whole
        else c
        for c in verdicts
    ]


def _ranking(candidates: list[Candidate]) -> Callable[[Candidate], tuple]:
    """The sort key of automatic selection (lowest first; see the module docstring)."""
    predicted = [c for c in candidates if c.predicted_us is not None and c.priority is not None]
    slot = max((c.priority for c in predicted), default=0)

    def rank(c: Candidate) -> tuple:
        if c.predicted_us is not None and c.priority is not None:
            return (-slot, 0, c.predicted_us, c.name)
        return (-(c.priority if c.priority is not None else -(1 << 60)), 1, 0.0, c.name)

    return rank


def evaluate(
    settings: Settings,
    inp: ForwardInputs,
    arch: Arch,
    mode: str,
    forced: str | None,
    execution: str = EAGER,
    attention: str | None = None,
) -> tuple[Report, Implementation | None, bool]:
    """Every implementation's verdict, the winner (``None`` when nothing can run), and whether
    a verdict read data pointers (then the decision holds only for the same residues).
    ``execution`` (``"eager"`` or ``"graph"``, see ``_execution``) is passed to the
    implementations' ``priority_for_execution``; ``attention``: the layout of the eager
    ``attention`` call this is a pass of (``Call.attention``), ``None`` for any other call."""
    registry = settings.registry
    probe = probed(inp)
    verdicts, readers = [], set()
    for impl in registry.implementations.values():
        _reads.pointers = False
        verdicts.append(_verdict(impl, inp, probe, arch, mode, settings, forced, execution))
        if _reads.pointers:
            readers.add(impl.full_name)
    if forced is None:
        verdicts = [
            _with_prediction(c, registry.implementations[c.name], inp, arch, mode, execution)
            if c.status == SUPPORTED and c.priority is not None
            else c
            for c in verdicts
        ]
        if attention is not None and execution == EAGER:
            verdicts = _as_attention(verdicts, registry, inp, arch, attention)
        pool = [c for c in verdicts if c.status == SUPPORTED and c.priority is not None]
    else:
        pool = [
            c
            for c in verdicts
            if c.status == SUPPORTED and (c.name == forced or c.name.split(":", 1)[0] == forced)
        ]
    rank = _ranking(pool)
    winner = min(pool, key=rank) if pool else None
    read_pointers = _pointers_decide(verdicts, readers, winner, forced, rank)
    candidates = [replace(c, status=SELECTED) if c is winner else c for c in verdicts]
    candidates += [
        Candidate(b.name, None, False, FAILED, (b.error or "",)) for b in registry.failed
    ]
    candidates.sort(key=lambda c: (c.status != SELECTED, rank(c)))
    report = Report(
        arch=arch,
        selected=winner.name if winner else None,
        candidates=tuple(candidates),
        inputs=inp.describe(),
        forced=forced,
        mode=mode,
        execution=execution,
    )
    return report, registry.implementations[winner.name] if winner else None, read_pointers


def _pointers_decide(
    verdicts: list[Candidate],
    readers: set[str],
    winner: Candidate | None,
    forced: str | None,
    rank: Callable[[Candidate], tuple],
) -> bool:
    """Whether other data pointers could change the decision: a verdict that read them belongs
    to the winner or to an implementation that would outrank it if it were accepted. A reader
    ranked below the winner cannot: the decision then holds for any alignment."""
    for c in verdicts:
        if c.name not in readers:
            continue
        if c is winner:
            return True
        if forced is not None:
            if c.name == forced or c.name.split(":", 1)[0] == forced:
                return True
        elif c.priority is not None and (winner is None or rank(c) < rank(winner)):
            return True
    return False


def no_backend_error(report: Report) -> NoBackendError:
    """The error raised when nothing (or not the forced implementation) can run the inputs."""
    if report.forced:
        head = (
            f"the forced backend {report.forced!r} cannot run these {report.mode} inputs "
            "(a forced choice never falls back):"
        )
        shown = tuple(
            c
            for c in report.candidates
            if c.name == report.forced or c.name.split(":", 1)[0] == report.forced
        )
    else:
        head = f"no installed implementation can run these {report.mode} inputs:"
        shown = report.candidates
    if not report.candidates:
        head += (
            "\nno backend plugin is installed (from a clone of attn_dispatch: "
            "pip install -e backends/reference; or check ATTN_DISPATCH_PLUGINS)"
        )
    body = str(
        Report(
            report.arch, None, shown, report.inputs, report.forced, report.mode, report.execution
        )
    )
    return NoBackendError(f"{head}\n{body}")
