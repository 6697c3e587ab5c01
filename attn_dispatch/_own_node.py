"""Eager ``attention`` calls through their implementation's own autograd node.

The library's eager node is a Python ``torch.autograd.Function``: its passes dispatch as
``forward`` and ``backward`` do, and Python's own cost of such a node is several times that of
the compiled node PyTorch's attention operators record (docs/benchmarks.md, section 8). Where
an implementation records such a node itself (``Implementation.autograd_forward``), ``attention``
calls it instead, on the caller's tensors in the caller's layout: the forward runs the cached
decision's implementation (with its plan), and the backward is that node's, with nothing of the
library in it.

That is the call the library's node would make only where that node would run the
implementation's backward too. So the first eager call of a signature runs the library's node,
and then :func:`verdict` makes the backward decision for the signature, under the call's scope,
for a gradient laid out like the output (a fresh allocation, as autograd's are): only where the
decision in the call's execution mode picks the forward's implementation, and the one in the
other mode (a backward may run captured where its forward did not) accepts it, does the
signature get the implementation's node (a pass of an eager call is ranked by the whole call's
measured cost, node included: ``_selection``), and a call of it takes that node only with q, k
and v aligned as that first call's were, where a decision read their alignment.
Autotune measures each pass's candidates apart, so under autotune the library's node stays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from . import _dispatch, _settings
from ._call import Call, Kind
from ._implementation import Implementation
from ._inputs import ForwardInputs, lse_dtype, lse_shape
from ._report import SELECTED, SUPPORTED
from ._validation import build_inputs


class OwnNode(NamedTuple):
    """What an eager ``attention`` signature runs: ``run`` (``None``: the library's node), the
    ``impl``'s function of the caller's q, k and v, where they have the pointer residues the
    decisions read (``pointers``; ``None``: none read)."""

    run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None
    impl: Implementation | None = None
    pointers: tuple | None = None


LIBRARY_NODE = OwnNode(None)
_EXECUTIONS = ("eager", "graph")


def verdict(settings: _settings.Settings, call: Call, tensors: tuple, heads_first: bool) -> OwnNode:
    """The node for forward ``call`` of ``tensors`` (q, k, v as the forward runs them, after a
    call of the signature cached its decision; ``heads_first``: the caller's layout is
    [B, H, S, D]): the implementation's, or :data:`LIBRARY_NODE`."""
    q, k = tensors[:2]
    if settings.autotune is not None or q.device.type == "meta" or 0 in (q.numel(), k.numel()):
        return LIBRARY_NODE
    key = _dispatch.signature_key(call, tensors)
    decision = None if key is None else settings.decisions.get(key)
    if decision is None or type(decision.impl).autograd_forward is Implementation.autograd_forward:
        return LIBRARY_NODE
    residues = _dispatch.pointer_residues(tensors, None, None)
    if decision.pointers is not None and decision.pointers != residues:
        return LIBRARY_NODE  # the decision of another alignment than these tensors'
    impl, pointers = decision.impl, decision.pointers
    backward = _backward_tensors(tensors, decision.facts.head_dim_v, heads_first)
    for execution in _EXECUTIONS:
        backward_call = call._replace(kind=Kind.BACKWARD, execution=execution)
        inp = build_inputs(backward_call, backward, None, None, None, None, settings.debug)
        report, chosen, read_pointers = _dispatch.select(settings, inp, backward_call)
        # the forward's execution must choose it; the other (a backward captured where its
        # forward was not, or the reverse) must accept it
        if not (chosen is impl if execution == call.execution else _serves(report, impl)):
            return LIBRARY_NODE
        if read_pointers:
            # q, k and v's alignment could change the backward's choice: calls of other
            # residues keep the library's node
            pointers = residues
    forward = ForwardInputs(*tensors, None, None, call, decision.facts, None, decision.plan)
    try:
        run = impl.autograd_forward(forward, "bhsd" if heads_first else "bshd")
    except Exception as exc:
        exc.add_note(f"(raised by {impl.full_name}.autograd_forward in attn_dispatch.attention)")
        raise
    if run is None:
        return LIBRARY_NODE
    return OwnNode(run, impl, pointers)


def _serves(report, impl: Implementation) -> bool:
    """Whether ``report``'s decision would run ``impl`` or could: it supports the call and has
    a priority there (without one it is never chosen automatically)."""
    return any(
        c.name == impl.full_name
        and (c.status == SELECTED or (c.status == SUPPORTED and c.priority is not None))
        for c in report.candidates
    )


def _backward_tensors(tensors: tuple, head_dim_v: int, heads_first: bool) -> tuple:
    """q, k, v with fresh stand-ins of what the library's node hands its backward: the output
    (contiguous) and its lse, and the gradient as the node passes a freshly allocated one on
    (``_autograd._plain_gradient``: [B, H, S, D]-contiguous, through a transposed view, where the
    caller's q is [B, H, S, D]-contiguous; else contiguous)."""
    q = tensors[0]
    out = q.new_empty((*q.shape[:-1], head_dim_v))
    lse = q.new_empty(lse_shape(q.shape, False), dtype=lse_dtype(q.dtype))
    if heads_first and q.transpose(1, 2).is_contiguous():
        grad = out.new_empty(out.transpose(1, 2).shape).transpose(1, 2)
    else:
        grad = torch.empty_like(out)
    return (*tensors, out, lse, grad)
