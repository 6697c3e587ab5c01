"""The one dispatch path of ``forward`` and ``backward``: signature, cached decision, run.

A call's decision depends only on tensor metadata and flags. The hot path looks it up (dense
calls through a C-level guard first, see ``_guards``; then a dictionary keyed on exactly that
metadata), rebuilds the light inputs object around the cached ``Facts`` and the
implementation's plan (``Implementation.prepare``, made once per decision) and calls the chosen
implementation. Validation, selection, prepare, logging and the check of the implementation's
outputs happen on the first call of a signature only. The execution mode (``_execution``: eager, or
captured into a CUDA graph or declared ``execution_mode("graph")``) is one of the flags both
lookups key on, so a captured call and an eager call of the same signature never share a decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import torch

from . import _autotune, _guards, _settings
from ._arch import Arch, resolve_arch
from ._call import Call, Kind
from ._implementation import Gradients, Implementation
from ._inputs import BackwardInputs, Facts, ForwardInputs, lse_dtype, lse_shape
from ._report import Report
from ._selection import POINTER_RESIDUE, evaluate, no_backend_error
from ._validation import build_inputs, check_cu_seqlens, check_sinks_values

log = logging.getLogger("attn_dispatch")
# More signatures than this (shape-varying workloads) restart the cache rather than grow it.
MAX_CACHED_DECISIONS = 4096


class Decision(NamedTuple):
    """A cached outcome of selection: the validated facts of a signature and who runs it."""

    facts: Facts
    impl: Implementation
    # impl.backward or impl.forward; for meta tensors the shape logic alone (nothing to compute)
    run: Callable
    # residues of the data pointers (see _selection.Probe) when the verdicts read them, else None
    pointers: tuple | None
    # set on guard entries only: some input requires grad (the guard checks requires_grad)
    grad: bool = False
    # impl.prepare's result for this signature, handed to every call as inp.plan (None on meta)
    plan: object = None


Tensors = tuple[torch.Tensor, ...]


def _like(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype, t.device


def _check_tuple(impl: Implementation, outputs, expected: dict[str, tuple]) -> None:
    """That ``outputs`` has the shapes, dtypes and devices of ``expected``, in order."""
    if not isinstance(outputs, tuple) or len(outputs) != len(expected):
        raise ValueError(
            f"{impl.full_name} returned {type(outputs).__name__}; expected a tuple "
            f"({', '.join(expected)})"
        )
    for (name, want), got in zip(expected.items(), outputs):
        have = _like(got) if isinstance(got, torch.Tensor) else type(got).__name__
        if have != want:
            raise ValueError(f"{impl.full_name} returned {name} as {have}; expected {want}")


def _checked_gradients(
    impl: Implementation, grads, tensors: Tensors, facts: Facts, sinks=None
) -> Gradients:
    q, k, v = tensors[:3]
    if not isinstance(grads, tuple):
        raise ValueError(
            f"{impl.full_name} returned {type(grads).__name__}; expected attn_dispatch.Gradients"
        )
    _check_tuple(impl, tuple(grads), {"dq": _like(q), "dk": _like(k), "dv": _like(v)})
    if not isinstance(grads, Gradients):
        raise ValueError(
            f"{impl.full_name} returned {type(grads).__name__}; expected attn_dispatch.Gradients"
        )
    if sinks is not None:
        have = _like(grads.dsinks) if isinstance(grads.dsinks, torch.Tensor) else grads.dsinks
        if have != _like(sinks):
            raise ValueError(
                f"{impl.full_name} returned dsinks as {have}; expected {_like(sinks)} (the call "
                "has sinks)"
            )
    return grads


def _checked_forward(
    impl: Implementation, result, tensors: Tensors, facts: Facts, sinks=None
) -> tuple:
    q = tensors[0]
    result = tuple(result) if isinstance(result, list) else result
    out_shape = tuple(q.shape[:-1]) + (facts.head_dim_v,)
    lse = (lse_shape(q.shape, facts.is_varlen), lse_dtype(q.dtype), q.device)
    _check_tuple(impl, result, {"out": (out_shape, q.dtype, q.device), "lse": lse})
    return result


def _meta_backward(inp: BackwardInputs) -> Gradients:
    dsinks = None if inp.sinks is None else inp.sinks.new_empty(inp.sinks.shape)
    return Gradients(*(t.new_empty(t.shape) for t in (inp.q, inp.k, inp.v)), dsinks)


def _meta_forward(inp: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
    q = inp.q
    out = q.new_empty((*q.shape[:-1], inp.head_dim_v))
    return out, q.new_empty(lse_shape(q.shape, inp.is_varlen), dtype=lse_dtype(q.dtype))


class Mode(NamedTuple):
    """What differs between forward and backward dispatch."""

    kind: Kind
    # built as inputs(*tensors, cu_q, cu_k, call, facts, sinks, plan)
    inputs: type[ForwardInputs]
    # (impl, result, tensors, facts, sinks) -> result; raises when it breaks the contract
    checked: Callable
    # the result's shapes, for meta tensors
    meta: Callable


BACKWARD = Mode(Kind.BACKWARD, BackwardInputs, _checked_gradients, _meta_backward)
FORWARD = Mode(Kind.FORWARD, ForwardInputs, _checked_forward, _meta_forward)


def arch_for(settings: _settings.Settings, device: torch.device) -> Arch:
    """The arch selection assumes for tensors on ``device`` (``ATTN_DISPATCH_ARCH`` as read
    with the settings, else detected)."""
    return resolve_arch(device, settings.arch_override)


def select(
    settings: _settings.Settings,
    inp: ForwardInputs,
    call: Call,
    arch: Arch | None = None,
) -> tuple[Report, Implementation | None, bool]:
    """The decision on ``call``'s validated inputs, as the first call of a signature makes it
    (``decide`` and ``explain`` make it here too): the forced name checked, the arch resolved
    (``arch``: a hypothetical target), every verdict. See ``_selection.evaluate`` for what it
    returns."""
    if call.kind is Kind.BACKWARD and not isinstance(inp, BackwardInputs):
        # validation took the call for a forward: out, lse and grad_out are all None
        raise TypeError("argument 'out': expected a torch.Tensor, got NoneType")
    forced = _settings.resolve_forced(call.backend, call.forced_by)
    target = arch or arch_for(settings, inp.device)
    return evaluate(settings, inp, target, call.kind.value, forced, call.execution, call.attention)


def pointer_residues(tensors: Tensors, cu_q, cu_k, sinks=None) -> tuple:
    """What a decision that read data pointers depends on (see ``_selection.Probe``)."""
    residues = tuple([t.data_ptr() % POINTER_RESIDUE for t in tensors])
    if cu_q is not None:
        residues += (cu_q.data_ptr() % POINTER_RESIDUE, cu_k.data_ptr() % POINTER_RESIDUE)
    if sinks is not None:
        residues += (sinks.data_ptr() % POINTER_RESIDUE,)
    return residues


def _key(call: Call, tensors: Tensors, cu_q, cu_k, max_q, max_k, sinks=None):
    """The dictionary key of a call, or ``None`` when the arguments cannot make one (not
    tensors, nested tensors, unhashable flags: validation explains them).

    Every tensor argument contributes its shape, strides, dtype and device: a ``supports`` may
    refuse a strided view (of sinks or cu_seqlens too) that a contiguous call accepted."""
    try:
        key = call + tuple([(t.shape, t.stride(), t.dtype, t.device) for t in tensors])
        if cu_q is not None or cu_k is not None or max_q is not None or max_k is not None:
            # types too: 8.0 == 8 but only 8 is valid; identity: a supports() may read it
            key += (
                _cu_key(cu_q),
                _cu_key(cu_k),
                cu_q is cu_k,
                max_q,
                max_k,
                max_q.__class__,
                max_k.__class__,
            )
        if sinks is not None:
            key += ("sinks", sinks.shape, sinks.stride(), sinks.dtype, sinks.device)
        hash(key)
        return key
    except (AttributeError, TypeError, RuntimeError):
        return None


def signature_key(call: Call, tensors: Tensors):
    """The dictionary key of a dense call without sinks (see :func:`_key`)."""
    return _key(call, tensors, None, None, None, None)


def _cu_key(cu: torch.Tensor | None):
    return None if cu is None else (cu.shape, cu.stride(), cu.dtype, cu.device)


def dispatch(
    mode: Mode,
    tensors: Tensors,
    cu_q,
    cu_k,
    max_q,
    max_k,
    call: Call,
    settings: _settings.Settings,
    sinks=None,
):
    """Run ``tensors`` (q, k, v[, out, lse, grad_out]) by the cached or a new decision.

    ``call`` holds the flags (``_call.parse`` / ``of_schema``), the forced name among them (a
    first call checks it and says where it came from). ``sinks``: the call's sink logits or
    ``None``; calls with sinks take the dictionary path (the guards cover the six tensors of a
    call without them)."""
    if cu_q is None and cu_k is None and max_q is None and max_k is None and sinks is None:
        entries = settings.guarded.get(call)
        if entries and (decision := _guards.match(entries, tensors)) is not None:
            if decision.pointers is None and not decision.grad:
                # the hottest path, inlined: a guarded signature, no pointer or grad concerns
                inp = mode.inputs(*tensors, None, None, call, decision.facts, None, decision.plan)
                try:
                    return decision.run(inp)
                except Exception as exc:
                    _name(exc, decision.impl, mode)
                    raise
            if decision.pointers is None or decision.pointers == pointer_residues(
                tensors, None, None
            ):
                return _run(mode, decision, decision.grad, tensors, None, None, call)
        guard_call = call
    else:
        guard_call = None
    return _looked_up(mode, settings, tensors, cu_q, cu_k, max_q, max_k, call, guard_call, sinks)


def _run(
    mode: Mode,
    decision: Decision,
    grad: bool,
    tensors: Tensors,
    cu_q,
    cu_k,
    call: Call,
    sinks=None,
):
    """Call the decision's implementation, with grad recording off (a backend's own ops must
    not build a graph), naming it in any exception it raises."""
    inp = mode.inputs(*tensors, cu_q, cu_k, call, decision.facts, sinks, decision.plan)
    if grad and torch.is_grad_enabled():
        torch._C._set_grad_enabled(False)
        try:
            return decision.run(inp)
        except Exception as exc:
            _name(exc, decision.impl, mode)
            raise
        finally:
            torch._C._set_grad_enabled(True)
    try:
        return decision.run(inp)
    except Exception as exc:
        _name(exc, decision.impl, mode)
        raise


def prepared(impl: Implementation, inp: ForwardInputs, mode: Mode):
    """``impl.prepare(inp)``, naming the implementation in any exception it raises (the call
    fails as if its ``forward`` / ``backward`` had raised; nothing is cached)."""
    try:
        return impl.prepare(inp)
    except Exception as exc:
        exc.add_note(f"(raised by {impl.full_name}.prepare in attn_dispatch.{mode.kind})")
        raise


def _name(exc: Exception, impl: Implementation, mode: Mode) -> None:
    exc.add_note(f"(raised by {impl.full_name} in attn_dispatch.{mode.kind})")


def _requires_grad(tensors: Tensors, sinks=None) -> bool:
    return any([t.requires_grad for t in tensors]) or (sinks is not None and sinks.requires_grad)


def _looked_up(
    mode: Mode,
    settings: _settings.Settings,
    tensors: Tensors,
    cu_q,
    cu_k,
    max_q,
    max_k,
    call: Call,
    guard_call: Call | None,
    sinks=None,
):
    """The dictionary path: a known signature (re-checking what it must), else a first call."""
    key = _key(call, tensors, cu_q, cu_k, max_q, max_k, sinks)
    decision = None if key is None else settings.decisions.get(key)
    if decision is not None and decision.pointers is not None:
        residues = pointer_residues(tensors, cu_q, cu_k, sinks)
        if residues != decision.pointers:
            # another alignment than the first call's: its own entry, never a guard
            key, guard_call = key + (residues,), None
            decision = settings.decisions.get(key)
    if decision is None:
        return _first_call(
            mode,
            settings,
            tensors,
            cu_q,
            cu_k,
            max_q,
            max_k,
            call,
            key,
            guard_call,
            sinks,
        )
    _revisit(settings, decision, tensors, cu_q, cu_k, guard_call, sinks)
    grad = _requires_grad(tensors, sinks)
    return _run(mode, decision, grad, tensors, cu_q, cu_k, call, sinks)


def _revisit(
    settings: _settings.Settings,
    decision: Decision,
    tensors: Tensors,
    cu_q,
    cu_k,
    guard_call: Call | None,
    sinks=None,
) -> None:
    """A dictionary hit: check CPU cu_seqlens and sinks values (they may differ at the same
    metadata) and give a dense signature a guard, so the next call takes the faster path."""
    facts = decision.facts
    if sinks is not None:
        check_sinks_values(sinks, settings.debug)
    if facts.is_varlen and cu_q.device.type == "cpu":
        check_cu_seqlens(
            cu_q,
            cu_k,
            tensors[0].shape[0],
            tensors[1].shape[0],
            facts.max_seqlen_q,
            facts.max_seqlen_k,
            settings.debug,
        )
    if guard_call is not None:
        _remember_guard(settings, guard_call, tensors, decision)


def _remember_guard(settings, call: Call, tensors: Tensors, decision: Decision) -> None:
    _guards.remember(
        settings.guarded, call, tensors, decision._replace(grad=_requires_grad(tensors))
    )


def _first_call(
    mode: Mode,
    settings: _settings.Settings,
    tensors: Tensors,
    cu_q,
    cu_k,
    max_q,
    max_k,
    call: Call,
    key: tuple | None,
    guard_call: Call | None,
    sinks=None,
):
    """Validate, select, run, check the outputs, then cache the decision."""
    inp = build_inputs(call, tensors, cu_q, cu_k, max_q, max_k, settings.debug, sinks)
    report, impl, read_pointers = select(settings, inp, call)
    if impl is None:
        raise no_backend_error(report)
    if settings.autotune is not None and report.forced is None and inp.device.type != "meta":
        seqlens = (cu_q, cu_k, max_q, max_k)
        report, impl = _autotune.choose(
            settings, mode, inp, call, tensors, seqlens, report, measure=True
        )
        # The priority decision knows which verdicts read pointers only up to its own winner;
        # a measured choice may be any admitted candidate, so it holds for these pointers alone.
        read_pointers = True
        if report.autotune is not None and report.autotune.status == "pending":
            # not measured now (non-finite values, a capture): the next call measures, so this
            # call's priority decision is not kept
            key = guard_call = None
    log.info(
        "attn_dispatch: %s %r -> %s on %s, %s (%s)",
        mode.kind,
        inp,
        impl.full_name,
        report.arch.full,
        call.execution,
        f"forced {report.forced!r}"
        if report.forced
        else ("measured" if report.autotune and report.autotune.measured else "automatic"),
    )
    meta = inp.device.type == "meta"
    run = mode.meta if meta else getattr(impl, mode.kind)
    pointers = pointer_residues(tensors, cu_q, cu_k, sinks) if read_pointers else None
    plan = None if meta else prepared(impl, inp, mode)
    decision = Decision(inp.facts, impl, run, pointers, plan=plan)
    grad = _requires_grad(tensors, sinks)
    result = _run(mode, decision, grad, tensors, cu_q, cu_k, call, sinks)
    result = mode.checked(impl, result, tensors, inp.facts, sinks)
    if key is not None:
        if len(settings.decisions) >= MAX_CACHED_DECISIONS:
            # the guards stay: their decisions still hold, and they serve the hottest calls
            settings.decisions.clear()
        settings.decisions[key] = decision
        if guard_call is not None:
            _remember_guard(settings, guard_call, tensors, decision)
    return result
