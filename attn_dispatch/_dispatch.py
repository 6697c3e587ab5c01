"""The one dispatch path of ``forward`` and ``backward``: signature, cached decision, run.

A call's decision depends only on tensor metadata and flags. The hot path looks it up (dense
calls through a C-level guard first, see ``_guards``; then a dictionary keyed on exactly that
metadata), rebuilds the light inputs object around the cached ``Facts`` and calls the chosen
implementation. Validation, selection, logging and the check of the implementation's outputs
happen on the first call of a signature only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import torch

from . import _guards, _settings
from ._arch import Arch, detect_arch
from ._implementation import Gradients, Implementation
from ._inputs import BackwardInputs, Facts, ForwardInputs, build_inputs, check_cu_seqlens, lse_dtype
from ._selection import evaluate, no_backend_error

log = logging.getLogger("attn_dispatch")
# More signatures than this (shape-varying workloads) restart the cache rather than grow it.
MAX_CACHED_DECISIONS = 4096


class Decision(NamedTuple):
    """A cached outcome of selection: the validated facts of a signature and who runs it."""

    facts: Facts
    impl: Implementation


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


def _checked_gradients(impl: Implementation, grads, tensors: Tensors, facts: Facts) -> Gradients:
    q, k, v = tensors[:3]
    _check_tuple(impl, tuple(grads), {"dq": _like(q), "dk": _like(k), "dv": _like(v)})
    if not isinstance(grads, Gradients):
        raise ValueError(
            f"{impl.full_name} returned {type(grads).__name__}; expected attn_dispatch.Gradients"
        )
    return grads


def _checked_forward(impl: Implementation, result, tensors: Tensors, facts: Facts) -> tuple:
    q = tensors[0]
    result = tuple(result) if isinstance(result, list) else result
    if facts.is_varlen:
        lse_shape = (q.shape[1], q.shape[0])
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    out_shape = tuple(q.shape[:-1]) + (facts.head_dim_v,)
    _check_tuple(
        impl,
        result,
        {"out": (out_shape, q.dtype, q.device), "lse": (lse_shape, lse_dtype(q.dtype), q.device)},
    )
    return result


class Mode(NamedTuple):
    """What differs between forward and backward dispatch."""

    name: str
    # built as inputs(*tensors, cu_q, cu_k, causal, causal_align, deterministic, facts)
    inputs: type[ForwardInputs]
    # (impl, result, tensors, facts) -> result; raises when the result breaks the contract
    checked: Callable


BACKWARD = Mode("backward", BackwardInputs, _checked_gradients)
FORWARD = Mode("forward", ForwardInputs, _checked_forward)


def arch_for(settings: _settings.Settings, device: torch.device) -> Arch:
    """The arch selection assumes for tensors on ``device``."""
    if settings.arch_override is not None:
        return settings.arch_override
    return detect_arch(None if device.type == "meta" else device)


def _cached(decisions: dict, flags: tuple, tensors: Tensors, cu_q, cu_k, max_q, max_k):
    """``(key, decision)`` from the dictionary; the key is ``None`` when the arguments cannot
    make one (not tensors, nested tensors, unhashable flags: validation explains them)."""
    try:
        key = flags + tuple([(t.shape, t.stride(), t.dtype, t.device) for t in tensors])
        if cu_q is not None or cu_k is not None or max_q is not None or max_k is not None:
            key += (_cu_key(cu_q), _cu_key(cu_k), max_q, max_k)
        return key, decisions.get(key)
    except (AttributeError, TypeError, RuntimeError):
        return None, None


def _cu_key(cu: torch.Tensor | None):
    return None if cu is None else (cu.shape, cu.dtype, cu.device)


def dispatch(
    mode: Mode,
    tensors: Tensors,
    cu_q,
    cu_k,
    max_q,
    max_k,
    causal,
    causal_align,
    scale,
    deterministic,
    backend,
):
    """Run ``tensors`` (q, k, v[, out, lse, grad_out]) by the cached or a new decision."""
    settings = _settings.current()
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    forced = _settings.forced_name(backend, settings)
    flags = (mode.name, causal, causal_align, scale, deterministic, forced)
    dense = cu_q is None and cu_k is None and max_q is None and max_k is None
    decision = None
    if dense and (entries := settings.guarded.get(flags)):
        decision = _guards.match(entries, tensors)
    if decision is None:
        key, decision = _cached(settings.decisions, flags, tensors, cu_q, cu_k, max_q, max_k)
        if decision is None:
            options = dict(
                causal=causal,
                causal_align=causal_align,
                scale=scale,
                deterministic=deterministic,
                cu_seqlens_q=cu_q,
                cu_seqlens_k=cu_k,
                max_seqlen_q=max_q,
                max_seqlen_k=max_k,
            )
            guard_flags = flags if dense else None
            return _first_call(mode, settings, tensors, options, backend, key, guard_flags)
        _revisit(settings, decision, tensors, cu_q, cu_k, flags if dense else None)
    facts, impl = decision
    inp = mode.inputs(*tensors, cu_q, cu_k, causal, causal_align, deterministic, facts)
    return impl.backward(inp) if mode is BACKWARD else impl.forward(inp)


def _revisit(
    settings: _settings.Settings,
    decision: Decision,
    tensors: Tensors,
    cu_q,
    cu_k,
    guard_flags: tuple | None,
) -> None:
    """A dictionary hit: check CPU cu_seqlens values (they may differ at the same metadata) and
    give a dense signature a guard, so the next call takes the faster path."""
    facts = decision.facts
    if facts.is_varlen and cu_q.device.type == "cpu":
        check_cu_seqlens(
            cu_q,
            cu_k,
            tensors[0].shape[0],
            tensors[1].shape[0],
            facts.max_seqlen_q,
            facts.max_seqlen_k,
        )
    if guard_flags is not None:
        _guards.remember(settings.guarded, guard_flags, tensors, decision)


def _first_call(
    mode: Mode,
    settings: _settings.Settings,
    tensors: Tensors,
    options: dict,
    backend,
    key: tuple | None,
    guard_flags: tuple | None,
):
    """Validate, select, run, check the outputs, then cache the decision."""
    inp = build_inputs(*tensors, **options)
    forced = _settings.resolve_forced(backend, settings)
    report, impl = evaluate(settings, inp, arch_for(settings, inp.device), mode.name, forced)
    if impl is None:
        raise no_backend_error(report)
    log.info(
        "attn_dispatch: %s %r -> %s on %s (%s)",
        mode.name,
        inp,
        impl.full_name,
        report.arch.full,
        f"forced {forced!r}" if forced else "automatic",
    )
    result = mode.checked(impl, getattr(impl, mode.name)(inp), tensors, inp.facts)
    if key is not None:
        decision = Decision(inp.facts, impl)
        if len(settings.decisions) >= MAX_CACHED_DECISIONS:
            settings.forget()
        settings.decisions[key] = decision
        if guard_flags is not None:
            _guards.remember(settings.guarded, guard_flags, tensors, decision)
    return result
