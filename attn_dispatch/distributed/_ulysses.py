"""Ulysses: all-to-all from sequence-sharded to head-sharded, local attention, all-to-all back.

Each rank sends head group ``j`` of its shard to rank ``j`` and receives its head group of every
shard, so it holds the whole sequence for ``H/W`` query heads and ``Hkv/W`` kv heads; attention
then runs locally as one dispatched ``ad.forward`` (and one ``ad.backward``), and the output goes
back the same way. Query head ``h`` of rank ``j``'s group is global head
``j·H/W + h``; its kv head ``(j·H/W + h) // (H/Hkv)`` is in rank ``j``'s kv group because
``H/W`` is a multiple of ``H/Hkv`` exactly when ``W`` divides ``Hkv``: GQA groups never straddle
ranks.

The gathered sequence comes in shard order (rank 0's shard first). A non-causal attention is
indifferent to the order of keys and keeps the order of queries, so it runs on that order
directly; a causal or windowed one (the band reads positions) is reordered to global positions
first (identity for ``contiguous``).

Attention sinks are per head: the local call takes this rank's head group's sinks, and every
row, whole on this rank, counts its sink once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

import attn_dispatch as ad
from attn_dispatch._autograd import in_scope, scope


def _all_to_all(x: Tensor, group) -> Tensor:
    """Block ``i`` of ``x`` (dim 0) goes to rank ``i``; block ``i`` of the result came from it."""
    x = x.contiguous()  # before empty_like, which would copy a permuted x's strides
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def seq_to_heads(x: Tensor, group, world: int, order: Tensor | None) -> Tensor:
    """[B, S/W, H, D] (this rank's shard) -> [B, S, H/W, D] (this rank's heads)."""
    b, s, h, d = x.shape
    parts = x.reshape(b, s, world, h // world, d).permute(2, 0, 1, 3, 4)
    full = _all_to_all(parts, group).permute(1, 0, 2, 3, 4).reshape(b, world * s, h // world, d)
    return full if order is None else full.index_select(1, order)


def heads_to_seq(x: Tensor, group, world: int, inverse: Tensor | None) -> Tensor:
    """[B, S, H/W, D] (this rank's heads) -> [B, S/W, H, D] (this rank's shard)."""
    if inverse is not None:
        x = x.index_select(1, inverse)
    b, n, hl, d = x.shape
    parts = x.reshape(b, world, n // world, hl, d).permute(1, 0, 2, 3, 4)
    shard = _all_to_all(parts, group).permute(1, 2, 0, 3, 4)
    return shard.reshape(b, n // world, world * hl, d)


def reshard(x: Tensor, group, world: int, order, inverse, to_heads: bool) -> Tensor:
    """:func:`seq_to_heads` (``to_heads``) or :func:`heads_to_seq`; each undoes the other."""
    if to_heads:
        return seq_to_heads(x, group, world, order)
    return heads_to_seq(x, group, world, inverse)


class Reshard(torch.autograd.Function):
    """:func:`reshard` one way; its gradient goes back the other way."""

    @staticmethod
    def forward(ctx, x: Tensor, group, world: int, order, inverse, to_heads: bool) -> Tensor:
        ctx.args = (group, world, order, inverse, not to_heads)
        return reshard(x, group, world, order, inverse, to_heads)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return reshard(grad, *ctx.args), None, None, None, None, None


class LocalAttention(torch.autograd.Function):
    """Attention of the head-sharded full sequence: ``ad.forward``, then ``ad.backward``."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, flags: dict, sinks=None) -> Tensor:
        out, lse = ad.forward(q, k, v, **flags, sinks=sinks)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.flags = flags
        ctx.scope = scope()  # the backward decides as ad.attention's backward does
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        with in_scope(ctx.scope):
            grads = ad.backward(q, k, v, out, lse, dout.contiguous(), **ctx.flags, sinks=sinks)
        return *grads, None, grads.dsinks
