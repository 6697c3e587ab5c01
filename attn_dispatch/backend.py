"""The plugin author's API: everything a backend package needs, and nothing a user calls.

A backend imports this module (``from attn_dispatch import backend as adb``), subclasses
:class:`Implementation`, declares its capabilities as class attributes, and registers its
implementations with a :data:`hookimpl` of ``attn_dispatch_implementations`` under the entry-point
group ``attn_dispatch.backends``. It receives :class:`ForwardInputs` / :class:`BackwardInputs`
(validated, read-only; ``inp.band`` is the call's :class:`Band`) and returns ``(out, lse)``
(lse of :func:`lse_shape` and :func:`lse_dtype`) or :class:`Gradients`. :func:`make_inputs`
builds validated inputs, e.g. on the ``meta`` device, for testing ``supports()`` without running
anything. A backend reads its boolean ``ATTN_DISPATCH_*`` variables with :func:`env_flag`, the
core's own parser (a bad value raises :class:`SettingError`, which selection never takes for a
broken plugin); ``attn_dispatch.testing`` has the conformance kit and an isolated-plugins fixture.
"""

from __future__ import annotations

import torch

from ._arch import Arch
from ._call import parse
from ._errors import SettingError
from ._hookspecs import ENTRY_POINT_GROUP, hookimpl
from ._implementation import FastPath, Gradients, Implementation
from ._inputs import (
    CAUSAL_ALIGNS,
    BackwardInputs,
    Band,
    ForwardInputs,
    Window,
    lse_dtype,
    lse_shape,
    packed_unit_strides,
)
from ._priorities import PriorityRule
from ._requirements import missing_requirement
from ._settings import env_flag
from ._validation import build_inputs, kind_of

__all__ = [
    "CAUSAL_ALIGNS",
    "ENTRY_POINT_GROUP",
    "Arch",
    "Band",
    "BackwardInputs",
    "FastPath",
    "ForwardInputs",
    "Gradients",
    "Implementation",
    "PriorityRule",
    "SettingError",
    "Window",
    "hookimpl",
    "lse_dtype",
    "lse_shape",
    "env_flag",
    "make_inputs",
    "missing_requirement",
    "packed_unit_strides",
]


def make_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    grad_out: torch.Tensor | None = None,
    *,
    causal: bool = False,
    causal_align: str = "top_left",
    scale: float | None = None,
    deterministic: bool | None = False,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    window: Window | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> ForwardInputs:
    """The validated inputs an implementation would receive for this call: ``BackwardInputs``
    when any of ``out``/``lse``/``grad_out`` is given, else ``ForwardInputs``.

    Validation is the dispatcher's own (the same ``TypeError``/``ValueError`` as
    ``attn_dispatch.backward``), so a backend's tests can ask ``supports(make_inputs(...), arch)``
    exactly what dispatch would ask. Tensors may live on the ``meta`` device.
    ``deterministic=None`` follows ``torch.are_deterministic_algorithms_enabled()``, as in
    dispatch.
    """
    tensors = (q, k, v, out, lse, grad_out)
    # parsed as the public calls parse their flags, outside any settings: what the Call says
    # of forcing and the execution mode does not reach the inputs
    kind = kind_of(tensors)
    call = parse(
        kind, causal, causal_align, scale, deterministic, None, window, softcap, sinks, None
    )
    seqlens = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    return build_inputs(call, tensors, *seqlens, sinks=sinks)
