"""The public calls: ``backward``, ``forward``, ``decide``, ``explain``, ``backends``.

``backward`` and ``forward`` share one dispatch path (``_dispatch``): a cached decision per
input signature, validation and selection on its first call only. ``decide`` and ``explain``
validate and select as that first call does (``_dispatch.select``) and run nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import _autotune, _costs, _settings
from ._arch import Arch
from ._call import Call, Kind, parse
from ._dispatch import BACKWARD, FORWARD, Mode, dispatch, select
from ._execution import check_execution
from ._implementation import Gradients, Implementation, lookup_priority
from ._inputs import LAYOUTS, ForwardInputs
from ._registry import BackendRecord, _declaration_problems
from ._report import Report
from ._selection import no_backend_error
from ._validation import build_inputs, kind_of

# The kinds as globals: the shells read them on every call.
_FWD, _BWD = Kind.FORWARD, Kind.BACKWARD


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
    sinks=None,
) -> Gradients:
    """Gradients ``(dq, dk, dv)`` of attention, by the best (or the forced) implementation.

    Tensors are BSHD (dense) or THD with ``cu_seqlens`` (varlen); see the README for shapes.
    ``window=(left, right)``: row ``i`` sees keys ``d_i - left .. d_i + right`` around its
    diagonal ``d_i`` (``i``, or ``i + Sk - Sq`` with ``causal_align="bottom_right"``); a side
    ``None`` is unbounded; ``causal=True`` caps ``right`` at 0. ``softcap=c``: scores ``s``
    become ``c * tanh(s / c)`` before the softmax. ``sinks``: a ``[H]`` tensor (float32 or q's
    dtype) of attention-sink logits, one per query head, that join every row's softmax without
    a value (``lse`` must include them, as ``forward`` returns it); the result's ``dsinks`` is
    their gradient. Only implementations declaring these run them.
    Raises ``TypeError``/``ValueError`` for malformed input and ``NoBackendError`` when no
    implementation (or not the forced one) accepts the inputs.
    """
    settings = _settings.installed or _settings.current()
    call = parse(
        _BWD, causal, causal_align, scale, deterministic, backend, window, softcap, sinks, settings
    )
    return dispatch(
        BACKWARD,
        (q, k, v, out, lse, grad_out),
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        call,
        settings,
        sinks,
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
    sinks=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of attention by the best (or forced) implementation that has a forward
    (``lse`` includes ``sinks`` when given)."""
    settings = _settings.installed or _settings.current()
    call = parse(
        _FWD, causal, causal_align, scale, deterministic, backend, window, softcap, sinks, settings
    )
    return dispatch(
        FORWARD,
        (q, k, v),
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        call,
        settings,
        sinks,
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
    sinks=None,
    arch=None,
    execution=None,
    attention=None,
) -> Report:
    """Why each implementation would or would not run these inputs; ``str()`` is a table.

    ``arch`` (``"gfx950"``, ``"sm_90"`` or an ``Arch``) evaluates a hypothetical target; the
    tensors may then live on the ``meta`` device. Without ``out``/``lse``/``grad_out`` the
    forward is explained. ``execution`` (``"eager"``, also what a ``torch.compile``d program
    runs, or ``"graph"``: captured into a CUDA graph) asks for the decision of that execution
    mode, whose priorities may differ; default: the mode of the calling context. ``attention``
    (``"bshd"`` or ``"bhsd"``) explains the pass as one of an eager ``attention(...,
    layout=attention)`` call, which the cost tables' attention rows rank (q, k, v as that call
    hands them on: [B, S, H, D], views of a ``"bhsd"`` call's). Never raises for a rejection;
    malformed input still raises. The report is ``decide(...).report`` where an implementation
    is chosen.
    """
    tensors = (q, k, v, out, lse, grad_out)
    seqlens = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    settings = _settings.current()
    kind = kind_of(tensors)
    call = parse(
        kind, causal, causal_align, scale, deterministic, backend, window, softcap, sinks, settings
    )
    if attention is not None:
        if attention not in LAYOUTS:
            raise ValueError(
                f"argument 'attention': expected None or one of {LAYOUTS}, got {attention!r}"
            )
        call = call._replace(attention=attention)
    return _decision(call, tensors, seqlens, sinks, arch, execution, debug=False)[0]


@dataclass(frozen=True)
class Choice:
    """What ``backward`` or ``forward`` would run for a call: decided, not run (``decide``).

    ``implementation`` is the object whose ``backward`` (or ``forward``) the dispatcher calls
    with ``inputs`` (the validated ``BackwardInputs`` or ``ForwardInputs``), ``name`` its
    ``backend:impl`` name, ``report`` what ``explain`` says about the call. Two choices are
    equal when they name the same implementation with the same report; the tensors in
    ``inputs`` are not compared.
    """

    name: str
    implementation: Implementation
    inputs: ForwardInputs = field(compare=False)
    report: Report


MODES = (Kind.BACKWARD.value, Kind.FORWARD.value)
# the dispatcher's strategy for each kind (what ``_autotune`` measures with)
_MODES: dict[Kind, Mode] = {BACKWARD.kind: BACKWARD, FORWARD.kind: FORWARD}


def decide(
    q,
    k,
    v,
    out=None,
    lse=None,
    grad_out=None,
    *,
    mode="backward",
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
    sinks=None,
    arch=None,
    execution=None,
) -> Choice:
    """The implementation ``backward`` (``mode="backward"``, the default) or ``forward``
    (``mode="forward"``: ``q, k, v`` only) would run for these arguments, and the inputs it
    would receive; nothing runs. Selection is the dispatcher's own, with its errors: an
    unknown forced ``backend`` raises ``UnknownBackendError``, malformed input
    ``TypeError``/``ValueError``, and ``NoBackendError`` when no implementation (or not the
    forced one) accepts the inputs. ``arch`` and ``execution`` are as in ``explain``.
    (On ``meta`` tensors the dispatcher computes only the result's shapes, whatever is chosen.)
    """
    if mode not in MODES:
        raise ValueError(f"argument 'mode': expected 'backward' or 'forward', got {mode!r}")
    if mode == "forward" and (out is not None or lse is not None or grad_out is not None):
        raise TypeError("decide(mode='forward') takes q, k and v only, not out, lse or grad_out")
    kind = Kind(mode)
    tensors = (q, k, v, out, lse, grad_out) if kind is Kind.BACKWARD else (q, k, v)
    seqlens = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    settings = _settings.current()
    call = parse(
        kind, causal, causal_align, scale, deterministic, backend, window, softcap, sinks, settings
    )
    report, impl, inp = _decision(call, tensors, seqlens, sinks, arch, execution, settings.debug)
    if impl is None:
        raise no_backend_error(report)
    return Choice(impl.full_name, impl, inp, report)


def _decision(
    call: Call,
    tensors: tuple,
    seqlens: tuple,
    sinks,
    arch,
    execution,
    debug: bool,
) -> tuple[Report, Implementation | None, ForwardInputs]:
    """Validate ``call`` with its tensors and decide it as the dispatcher does
    (``_dispatch.select``).

    ``seqlens``: cu_seqlens_q/_k, max_seqlen_q/_k; ``sinks``: the call's sink logits or
    ``None``; ``arch`` and ``execution``: as ``explain`` takes them; ``debug``: also check
    cu_seqlens values on a GPU, as the dispatcher does in debug mode."""
    settings = _settings.current()
    if execution is not None:
        call = call._replace(execution=check_execution(execution))
    if arch is not None and not isinstance(arch, Arch):
        arch = Arch.parse(arch)
    inp = build_inputs(call, tensors, *seqlens, debug, sinks)
    report, impl, _ = select(settings, inp, call, arch)
    if settings.autotune is not None and report.forced is None and impl is not None:
        if arch is None and inp.device.type != "meta":  # a measurement is of a real device
            report, impl = _autotune.choose(
                settings, _MODES[call.kind], inp, call, tensors, seqlens, report, measure=False
            )
        else:
            report = _autotune.without_device(report)
    return report, impl, inp


@dataclass(frozen=True)
class ImplementationInfo:
    """An implementation's declared capabilities (``window`` / ``softcap`` / ``sinks``: whether
    it runs sliding windows, logit soft-capping and attention sinks)."""

    name: str
    opt_in: bool
    deterministic: bool
    priority: dict
    has_forward: bool
    window: bool = False
    softcap: bool = False
    opt_in_reason: str | None = None
    sinks: bool = False
    # the package shipping its measured cost tables (attn_dispatch._costs), if any, and the
    # distributions whose versions those tables record
    cost_tables: str | None = None
    cost_requires: tuple[str, ...] = ()

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
            "sinks": self.sinks,
            "opt_in_reason": self.opt_in_reason,
            "cost_tables": self.cost_tables,
            "cost_requires": list(self.cost_requires),
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
            i.sinks,
            _costs.tables_of(i),
            tuple(i.cost_requires),
        )
        for i in record.implementations
    )
    return BackendInfo(record.name, record.distribution, record.version, impls, None)


def backends() -> list[BackendInfo]:
    """Every discovered backend plugin, loaded or failed, with versions."""
    return [_info(b) for b in _settings.current().registry.backends.values()]
