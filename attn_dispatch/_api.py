"""The public calls: ``backward``, ``forward``, ``explain``, ``backends``.

``backward`` and ``forward`` share one dispatch path (``_dispatch``): a cached decision per
input signature, validation and selection on its first call only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _settings
from ._arch import Arch
from ._dispatch import BACKWARD, FORWARD, arch_for, dispatch
from ._execution import check_execution, current_execution
from ._implementation import Gradients, lookup_priority
from ._inputs import BackwardInputs
from ._registry import BackendRecord, _declaration_problems
from ._report import Report
from ._selection import evaluate
from ._validation import build_inputs


def backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
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
    window=None,
    softcap=None,
) -> Gradients:
    """Gradients ``(dq, dk, dv)`` of attention, by the best (or the forced) implementation.

    Tensors are BSHD (dense) or THD with ``cu_seqlens`` (varlen); see the README for shapes.
    ``window=(left, right)``: row ``i`` sees keys ``d_i - left .. d_i + right`` around its
    diagonal ``d_i`` (``i``, or ``i + Sk - Sq`` with ``causal_align="bottom_right"``); a side
    ``None`` is unbounded; ``causal=True`` caps ``right`` at 0. ``softcap=c``: scores ``s``
    become ``c * tanh(s / c)`` before the softmax. Only implementations declaring these run them.
    Raises ``TypeError``/``ValueError`` for malformed input and ``NoBackendError`` when no
    implementation (or not the forced one) accepts the inputs.
    """
    return dispatch(
        BACKWARD,
        (q, k, v, out, lse, grad_out),
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        causal,
        causal_align,
        scale,
        deterministic,
        backend,
        window,
        softcap,
    )


def forward(
    q,
    k,
    v,
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
    window=None,
    softcap=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of attention by the best (or forced) implementation that has a forward."""
    return dispatch(
        FORWARD,
        (q, k, v),
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        causal,
        causal_align,
        scale,
        deterministic,
        backend,
        window,
        softcap,
    )


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
    window=None,
    softcap=None,
    arch=None,
    execution=None,
) -> Report:
    """Why each implementation would or would not run these inputs; ``str()`` is a table.

    ``arch`` (``"gfx950"``, ``"sm_90"`` or an ``Arch``) evaluates a hypothetical target; the
    tensors may then live on the ``meta`` device. Without ``out``/``lse``/``grad_out`` the
    forward is explained. ``execution`` (``"eager"`` or ``"graph"``: captured into a CUDA
    graph or traced by ``torch.compile``) asks for the decision of that execution mode, whose
    priorities may differ; default: the mode of the calling context. Never raises for a
    rejection; malformed input still raises.
    """
    settings = _settings.current()
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if arch is not None and not isinstance(arch, Arch):
        arch = Arch.parse(arch)
    inp = build_inputs(
        q,
        k,
        v,
        out,
        lse,
        grad_out,
        causal=causal,
        causal_align=causal_align,
        scale=scale,
        deterministic=deterministic,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        window=window,
        softcap=softcap,
    )
    mode = "backward" if isinstance(inp, BackwardInputs) else "forward"
    forced = _settings.resolve_forced(backend, settings)
    if execution is None:
        execution = current_execution()
    else:
        execution = check_execution(execution)
    target = arch or arch_for(settings, inp.device)
    report, _, _ = evaluate(settings, inp, target, mode, forced, execution)
    return report


@dataclass(frozen=True)
class ImplementationInfo:
    """An implementation's declared capabilities (``window`` / ``softcap``: whether it runs
    sliding windows and logit soft-capping)."""

    name: str
    opt_in: bool
    deterministic: bool
    priority: dict
    has_forward: bool
    window: bool = False
    softcap: bool = False
    opt_in_reason: str | None = None

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
            "window": self.window,
            "softcap": self.softcap,
            "opt_in_reason": self.opt_in_reason,
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


def _info(record: BackendRecord) -> BackendInfo:
    """``record`` as data; declarations that broke since the plugin loaded make it failed."""
    problems = [p for i in record.implementations for p in _declaration_problems(i)]
    if record.error is not None or problems:
        error = record.error or "; ".join(problems)
        return BackendInfo(record.name, record.distribution, record.version, (), error)
    impls = tuple(
        ImplementationInfo(
            i.full_name,
            i.opt_in,
            i.deterministic,
            dict(i.priority),
            i.has_forward,
            i.window,
            i.softcap,
            i.opt_in_reason,
        )
        for i in record.implementations
    )
    return BackendInfo(record.name, record.distribution, record.version, impls, None)


def backends() -> list[BackendInfo]:
    """Every discovered backend plugin, loaded or failed, with versions."""
    return [_info(b) for b in _settings.current().registry.backends.values()]
