"""The float64 oracle: plain attention differentiated by PyTorch autograd.

Nothing clever: scores, an optional soft cap (``c * tanh(s / c)``), a boolean mask (causal
and sliding window, straight from the contract's definition), a softmax, a matmul, then
``torch.autograd.grad`` (which differentiates the tanh too). K/V heads are expanded for GQA
(autograd sums the expanded gradients back). A row that sees no key gets ``lse = -inf``,
output 0 and zero gradients, as the input contract states.

Attention sinks (``sinks``, one logit per query head) are one more column of the scores, never
capped or masked, whose value is zero: a row that sees no key then gives all its mass to the
sink (``lse = sinks[h]``, output 0), and ``torch.autograd.grad`` yields ``dsinks`` too.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._inputs import Band


class _OracleTuple(NamedTuple):
    out: Tensor
    lse: Tensor
    dq: Tensor | None
    dk: Tensor | None
    dv: Tensor | None


class OracleResult(_OracleTuple):
    """Float64 results of :func:`oracle`; grads are None when no grad_out was given.

    ``dsinks`` (an attribute, so the result still unpacks into five) is the float64 gradient of
    the sinks, ``None`` without sinks or without grad_out.
    """

    dsinks: Tensor | None = None

    def __new__(cls, out, lse, dq, dk, dv, dsinks=None):
        self = super().__new__(cls, out, lse, dq, dk, dv)
        if dsinks is not None:
            self.dsinks = dsinks
        return self


Window = tuple[int | None, int | None]


class _Flags(NamedTuple):
    """The flags the oracle computes with (``scale`` resolved), as one value for its helpers."""

    causal: bool
    causal_align: str
    scale: float
    window: Window | None
    softcap: float | None


def visible_mask(
    sq: int,
    sk: int,
    causal: bool,
    causal_align: str,
    device=None,
    window: Window | None = None,
) -> Tensor:
    """Boolean [sq, sk]: True where query row i may see key j.

    Row i's diagonal is ``d_i = i`` (top_left) or ``i + sk - sq`` (bottom_right); with
    ``window=(left, right)`` key j is visible iff ``d_i - left <= j <= d_i + right`` (a side
    ``None`` is unbounded); ``causal`` caps ``right`` at 0.
    """
    # Sides clamped here to sq + sk (which already reaches every key), not by the dispatcher's
    # validation: the mask arithmetic is on int64 tensors, where a side near the int64 limit
    # would wrap around, and the oracle must stay right for a backend given raw sides.
    if window is not None:
        window = tuple(None if s is None else min(s, sq + sk) for s in window)
    mask = Band.of(window, causal, causal_align).mask(sq, sk, device)
    return torch.ones(sq, sk, dtype=torch.bool, device=device) if mask is None else mask


def _dense(
    q: Tensor, k: Tensor, v: Tensor, flags: _Flags, sinks: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """out [B, Sq, H, Dv] and lse [B, H, Sq] for float64 BSHD tensors (differentiable)."""
    mask = visible_mask(
        q.shape[1], k.shape[1], flags.causal, flags.causal_align, q.device, flags.window
    )
    group = q.shape[2] // k.shape[2]
    kx = k.repeat_interleave(group, dim=2)
    vx = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, kx) * flags.scale
    softcap = flags.softcap
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if sinks is not None:
        # the sink column: every row has it, so no row is empty and no row needs zeroing
        s = s.masked_fill(~mask, float("-inf"))
        sink = sinks[None, :, None, None].expand(*s.shape[:-1], 1)
        full = torch.cat([s, sink], dim=-1)
        p = torch.softmax(full, dim=-1)[..., :-1]
        lse = torch.logsumexp(full, dim=-1)
        return torch.einsum("bhij,bjhd->bihd", p, vx), lse
    sees_any = mask.any(dim=-1)  # [Sq]
    # Masked keys get -inf; rows that see nothing get all-zero scores (so no NaN) and are
    # zeroed after the softmax, which also zeroes their gradients.
    s = s.masked_fill(~mask, float("-inf")).masked_fill(~sees_any[:, None], 0.0)
    p = torch.softmax(s, dim=-1) * sees_any[:, None].to(s.dtype)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~sees_any, float("-inf"))
    out = torch.einsum("bhij,bjhd->bihd", p, vx)
    return out, lse


def oracle(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor | None = None,
    *,
    causal: bool = False,
    causal_align: str = "top_left",
    scale: float | None = None,
    cu_seqlens_q: Tensor | None = None,
    cu_seqlens_k: Tensor | None = None,
    window: Window | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    given_out_dtype: torch.dtype | None = None,
) -> OracleResult:
    """Exact attention in float64 on the inputs' device: (out, lse, dq, dk, dv), and
    ``dsinks`` with ``sinks``.

    ``given_out_dtype``: the gradients are those of a backward handed ``out`` rounded to this
    dtype, as every backward is (it computes ``rowsum(dO ∘ O)`` from the ``out`` it gets). Where
    that sum cancels (one key that takes nearly all of its row's weight beside a sink; dsinks
    summed over rows of mixed sign), the rounding of ``out`` alone moves the exact gradients by
    percents, an error no backward can avoid; with this the comparison leaves it out.

    ``window``, ``softcap`` and ``sinks`` as in :func:`attn_dispatch.backward` (per sequence
    when varlen).

    Layouts follow the library contract: dense q [B, Sq, H, D] (lse [B, H, Sq]) or, when
    cu_seqlens are given, varlen q [Tq, H, D] (lse [H, Tq]). Inputs of any float dtype are
    upcast exactly to float64; results stay float64.
    """
    flags = _Flags(
        causal, causal_align, q.shape[-1] ** -0.5 if scale is None else scale, window, softcap
    )
    given = (q, k, v) if sinks is None else (q, k, v, sinks)
    leaves = [t.detach().to(torch.float64).requires_grad_(True) for t in given]
    q64, k64, v64 = leaves[:3]
    sinks64 = None if sinks is None else leaves[3]
    with torch.enable_grad():
        if cu_seqlens_q is None:
            out, lse = _dense(q64, k64, v64, flags, sinks64)
        else:
            out, lse = _varlen(q64, k64, v64, cu_seqlens_q, cu_seqlens_k, flags, sinks64)
        if grad_out is None:
            return OracleResult(out.detach(), lse.detach(), None, None, None)
        dout = grad_out.detach().to(torch.float64)
        objective = (out * dout).sum()
        if given_out_dtype is not None:
            objective = objective + _given_out_shift(out, lse, dout, given_out_dtype)
        grads = torch.autograd.grad(objective, leaves, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)]
    return OracleResult(out.detach(), lse.detach(), *grads)


def _given_out_shift(out: Tensor, lse: Tensor, dout: Tensor, dtype: torch.dtype) -> Tensor:
    """A term whose gradient turns ``rowsum(dO ∘ O)`` into ``rowsum(dO ∘ O_given)`` in every
    gradient: ``∂lse_i/∂s_ij = P_ij`` (and ``p_sink`` for the sink), so adding ``c_i · lse_i``
    with ``c_i = rowsum(dO ∘ (O - O_given))`` held constant adds ``P_ij · c_i`` to each score's
    gradient, exactly the change of the backward's ``P ∘ (dP - rowsum(dO ∘ O))``."""
    exact = out.detach()
    shift = ((exact - exact.to(dtype).to(torch.float64)) * dout).sum(dim=-1)
    shift = shift.movedim(-1, -2) if lse.dim() == 3 else shift.t()  # as lse
    seen = torch.isfinite(lse.detach())  # rows that see nothing have out 0 and no gradient
    return (shift * torch.where(seen, lse, torch.zeros_like(lse))).sum()


def oracle_of(inputs, grad_out: Tensor | None = None) -> OracleResult:
    """:func:`oracle` on the call an inputs object describes: anything with ``q``, ``k``, ``v``,
    ``causal``, ``causal_align``, ``scale``, ``cu_seqlens_q`` / ``_k``, ``window`` and
    ``softcap``, and optionally ``sinks`` (a case's ``CaseInputs``, an implementation's
    ``ForwardInputs``). The gradients are those of a backward handed the oracle's ``out``
    rounded to q's dtype, as the conformance checks hand it (``given_out_dtype``)."""
    flags = {name: getattr(inputs, name) for name in _INPUTS_FLAGS}
    return oracle(
        inputs.q,
        inputs.k,
        inputs.v,
        grad_out,
        **flags,
        sinks=getattr(inputs, "sinks", None),
        given_out_dtype=None if grad_out is None else inputs.q.dtype,
    )


# The keyword arguments of :func:`oracle` that :func:`oracle_of` reads off an inputs object.
_INPUTS_FLAGS = "causal causal_align scale cu_seqlens_q cu_seqlens_k window softcap".split()


def _varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_q: Tensor,
    cu_k: Tensor | None,
    flags: _Flags,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    if cu_k is None:
        raise ValueError("cu_seqlens_k: expected a tensor when cu_seqlens_q is given, got None")
    oq, ok = cu_q.tolist(), cu_k.tolist()  # a host read: fine for an oracle
    outs, lses = [], []
    for i in range(len(oq) - 1):
        q0, q1, k0, k1 = oq[i], oq[i + 1], ok[i], ok[i + 1]
        o, lse = _dense(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], flags, sinks)
        outs.append(o[0])
        lses.append(lse[0])
    out = torch.cat(outs, dim=0) if outs else q.new_zeros(0, q.shape[1], v.shape[-1])
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros(q.shape[1], 0)
    return out, lse
