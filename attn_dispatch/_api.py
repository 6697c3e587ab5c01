"""The public calls: ``backward``, ``forward``, ``explain``, ``backends``.

The hot path builds a signature key from tensor metadata and flags, looks the decision up in a
dictionary, rebuilds the light inputs object and calls the chosen implementation. Validation,
selection, logging and the check of the implementation's outputs happen once per signature.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from . import _guards, _settings
from ._arch import Arch, detect_arch
from ._implementation import Gradients, Implementation, lookup_priority
from ._inputs import BackwardInputs, Facts, ForwardInputs, build_inputs, check_cu_seqlens
from ._report import Report
from ._selection import evaluate, no_backend_error

log = logging.getLogger("attn_dispatch")
_MAX_CACHED_DECISIONS = 4096


def _arch_for(settings: _settings.Settings, device: torch.device) -> Arch:
    if settings.arch_override is not None:
        return settings.arch_override
    return detect_arch(None if device.type == "meta" else device)


def _forced(backend: str | None, settings: _settings.Settings) -> str | None:
    if backend is not None:
        _settings.check_name(backend, "backend")
        return backend
    name = _settings._forced.get()
    if name is not None:
        return name
    if settings.forced_env is not None:
        _settings.check_name(settings.forced_env, _settings.BACKEND_ENV)
    return settings.forced_env


def _cu_key(cu: torch.Tensor | None):
    return None if cu is None else (cu.shape, cu.dtype, cu.device)


def _decide(
    settings: _settings.Settings, mode: str, inp: ForwardInputs, forced: str | None
) -> Implementation:
    report, impl = evaluate(settings, inp, _arch_for(settings, inp.device), mode, forced)
    if impl is None:
        raise no_backend_error(report)
    log.info(
        "attn_dispatch: %s %r -> %s on %s (%s)",
        mode,
        inp,
        impl.full_name,
        report.arch.full,
        f"forced {forced!r}" if forced else "automatic",
    )
    return impl


def _check_outputs(impl: Implementation, outputs, expected: dict[str, tuple]) -> None:
    """Check, once per signature, that an implementation returned what the contract says."""
    if not isinstance(outputs, tuple) or len(outputs) != len(expected):
        raise ValueError(
            f"{impl.full_name} returned {type(outputs).__name__}; expected a tuple "
            f"({', '.join(expected)})"
        )
    for (name, want), got in zip(expected.items(), outputs):
        have = (
            (tuple(got.shape), got.dtype, got.device)
            if isinstance(got, torch.Tensor)
            else type(got).__name__
        )
        if have != want:
            raise ValueError(f"{impl.full_name} returned {name} as {have}; expected {want}")


def _like(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype, t.device


def _signature_tail(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> tuple:
    return (_cu_key(cu_seqlens_q), _cu_key(cu_seqlens_k), max_seqlen_q, max_seqlen_k)


def backward(q, k, v, out, lse, grad_out, *, causal=False, causal_align="top_left", scale=None,
             cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
             deterministic=None, backend=None) -> Gradients:  # fmt: skip
    """Gradients ``(dq, dk, dv)`` of attention, by the best (or the forced) implementation.

    Tensors are BSHD (dense) or THD with ``cu_seqlens`` (varlen); see the README for shapes.
    Raises ``TypeError``/``ValueError`` for malformed input and ``NoBackendError`` when no
    implementation (or not the forced one) accepts the inputs.
    """
    settings = _settings._settings or _settings.current()
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    forced = backend or _settings._forced.get() or settings.forced_env
    dense = (cu_seqlens_q is None and cu_seqlens_k is None and max_seqlen_q is None
             and max_seqlen_k is None)  # fmt: skip
    if dense:
        flags = ("backward", causal, causal_align, scale, deterministic, forced)
        # Fastest: a C-level guard per signature seen (falls through on any mismatch). A nested
        # tensor must never reach it: reading its strides in C++ aborts the process.
        hit = None
        try:
            entries = settings.guarded.get(flags)
            if entries and not (q.is_nested or k.is_nested or v.is_nested or out.is_nested
                                or lse.is_nested or grad_out.is_nested):  # fmt: skip
                for entry in entries:
                    if entry[0].check(q, k, v, out, lse, grad_out):
                        hit = entry
                        break
        except (AttributeError, TypeError):  # not tensors, unhashable flags: validation explains
            pass
        if hit is not None:  # (outside the try: the implementation's own errors propagate)
            return hit[2].backward(BackwardInputs(q, k, v, out, lse, grad_out, None, None, causal,
                                                  causal_align, deterministic, hit[1]))  # fmt: skip
    # The decision depends only on metadata and flags: key on exactly those.
    try:
        # fmt: off
        key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
               v.shape, v.stride(), v.dtype, v.device, out.shape, out.stride(), out.dtype,
               out.device, lse.shape, lse.stride(), lse.dtype, lse.device, grad_out.shape,
               grad_out.stride(), grad_out.dtype, grad_out.device, causal, causal_align, scale,
               deterministic, forced)
        # fmt: on
        if not dense:
            key += _signature_tail(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        decision = settings.decisions.get(key)
    except (AttributeError, TypeError, RuntimeError):  # not tensors (or nested ones), unhashable
        key, decision = None, None  # flags: validation explains
    if decision is not None:
        facts, impl = decision
        if facts.is_varlen and cu_seqlens_q.device.type == "cpu":
            check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                             facts.max_seqlen_q, facts.max_seqlen_k)  # fmt: skip
        if dense:
            _guards.remember(settings.guarded, flags, (q, k, v, out, lse, grad_out), decision)
        inp = BackwardInputs(q, k, v, out, lse, grad_out, cu_seqlens_q, cu_seqlens_k, causal,
                             causal_align, deterministic, facts)  # fmt: skip
        return impl.backward(inp)
    inp = build_inputs(q, k, v, out, lse, grad_out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, causal, causal_align, scale, deterministic)  # fmt: skip
    facts = inp.facts
    impl = _decide(settings, "backward", inp, _forced(backend, settings))
    grads = impl.backward(inp)
    _check_outputs(impl, tuple(grads), {"dq": _like(q), "dk": _like(k), "dv": _like(v)})
    if not isinstance(grads, Gradients):
        raise ValueError(f"{impl.full_name} returned {type(grads).__name__}; expected "
                         "attn_dispatch.Gradients")  # fmt: skip
    _remember(settings, key, facts, impl)
    if key is not None and dense:
        _guards.remember(settings.guarded, flags, (q, k, v, out, lse, grad_out), (facts, impl))
    return grads


def forward(q, k, v, *, causal=False, causal_align="top_left", scale=None, cu_seqlens_q=None,
            cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, deterministic=None,
            backend=None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(out, lse)`` of attention by the best (or forced) implementation that has a forward."""
    settings = _settings._settings or _settings.current()
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    forced = backend or _settings._forced.get() or settings.forced_env
    dense = (cu_seqlens_q is None and cu_seqlens_k is None and max_seqlen_q is None
             and max_seqlen_k is None)  # fmt: skip
    if dense:
        flags = ("forward", causal, causal_align, scale, deterministic, forced)
        hit = None
        try:
            entries = settings.guarded.get(flags)
            if entries and not (q.is_nested or k.is_nested or v.is_nested):
                for entry in entries:
                    if entry[0].check(q, k, v):
                        hit = entry
                        break
        except (AttributeError, TypeError):
            pass
        if hit is not None:
            return hit[2].forward(ForwardInputs(q, k, v, None, None, causal, causal_align,
                                                deterministic, hit[1]))  # fmt: skip
    try:
        # fmt: off
        key = ("forward", q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype,
               k.device, v.shape, v.stride(), v.dtype, v.device, causal, causal_align, scale,
               deterministic, forced)
        # fmt: on
        if not dense:
            key += _signature_tail(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        decision = settings.decisions.get(key)
    except (AttributeError, TypeError, RuntimeError):
        key, decision = None, None
    if decision is not None:
        facts, impl = decision
        if facts.is_varlen and cu_seqlens_q.device.type == "cpu":
            check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0],
                             facts.max_seqlen_q, facts.max_seqlen_k)  # fmt: skip
        if dense:
            _guards.remember(settings.guarded, flags, (q, k, v), decision)
        return impl.forward(ForwardInputs(q, k, v, cu_seqlens_q, cu_seqlens_k, causal,
                                          causal_align, deterministic, facts))  # fmt: skip
    inp = build_inputs(q, k, v, None, None, None, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, causal, causal_align, scale, deterministic)  # fmt: skip
    facts = inp.facts
    impl = _decide(settings, "forward", inp, _forced(backend, settings))
    result = impl.forward(inp)
    result = tuple(result) if isinstance(result, list) else result
    varlen = facts.is_varlen
    lse_shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    out_shape = tuple(q.shape[:-1]) + (facts.head_dim_v,)
    _check_outputs(impl, result, {"out": (out_shape, q.dtype, q.device),
                                  "lse": (lse_shape, lse_dtype, q.device)})  # fmt: skip
    _remember(settings, key, facts, impl)
    if key is not None and dense:
        _guards.remember(settings.guarded, flags, (q, k, v), (facts, impl))
    return result


def _remember(settings: _settings.Settings, key, facts: Facts, impl: Implementation) -> None:
    if key is None:
        return
    if len(settings.decisions) >= _MAX_CACHED_DECISIONS:
        settings.forget()
    settings.decisions[key] = (facts, impl)


def explain(
    q,
    k,
    v,
    out=None,
    lse=None,
    grad_out=None,
    *,
    causal=False,
    causal_align="top_left",
    scale=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    deterministic=None,
    backend=None,
    arch=None,
) -> Report:
    """Why each implementation would or would not run these inputs; ``str()`` is a table.

    ``arch`` (``"gfx950"``, ``"sm_90"`` or an ``Arch``) evaluates a hypothetical target; the
    tensors may then live on the ``meta`` device. Without ``out``/``lse``/``grad_out`` the
    forward is explained. Never raises for a rejection; malformed input still raises.
    """
    settings = _settings.current()
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if arch is not None and not isinstance(arch, Arch):
        arch = Arch.parse(arch)
    inp = build_inputs(q, k, v, out, lse, grad_out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                       max_seqlen_k, causal, causal_align, scale, deterministic)  # fmt: skip
    mode = "backward" if isinstance(inp, BackwardInputs) else "forward"
    facts = inp.facts
    report, _ = evaluate(
        settings, inp, arch or _arch_for(settings, facts.device), mode, _forced(backend, settings)
    )
    return report


@dataclass(frozen=True)
class ImplementationInfo:
    """An implementation's declared capabilities."""

    name: str
    opt_in: bool
    deterministic: bool
    priority: dict
    has_forward: bool

    def priority_for(self, arch: Arch | str) -> int | None:
        """The priority on ``arch`` (``None``: not chosen automatically there)."""
        return lookup_priority(self.priority, arch if isinstance(arch, Arch) else Arch.parse(arch))

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "opt_in": self.opt_in,
            "deterministic": self.deterministic,
            "priority": dict(self.priority),
            "has_forward": self.has_forward,
        }


@dataclass(frozen=True)
class BackendInfo:
    """An installed backend plugin: distribution, version, implementations, or its error."""

    name: str
    distribution: str | None
    version: str | None
    implementations: tuple[ImplementationInfo, ...]
    error: str | None

    def to_dict(self) -> dict:
        data = {"name": self.name, "distribution": self.distribution, "version": self.version}
        if self.error is not None:
            return data | {"error": self.error}
        return data | {"implementations": [i.to_dict() for i in self.implementations]}


def backends() -> list[BackendInfo]:
    """Every discovered backend plugin, loaded or failed, with versions."""
    registry = _settings.current().registry
    return [
        BackendInfo(
            b.name,
            b.distribution,
            b.version,
            tuple(
                ImplementationInfo(
                    i.full_name, i.opt_in, i.deterministic, dict(i.priority), i.has_forward
                )
                for i in b.implementations
            ),
            b.error,
        )
        for b in registry.backends.values()
    ]
