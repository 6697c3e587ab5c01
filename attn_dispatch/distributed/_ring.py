"""Ring attention: K/V shards travel around the group, each block is one dispatched call.

Forward: at step ``t`` rank ``r`` holds the K/V shard of rank ``(r - t) mod W``. The transfer of
the next shard is issued *before* the current block is computed, so communication overlaps
compute (on a GPU the communication stream would otherwise wait for the block's kernels). Each
block is an ``ad.forward`` returning ``(out, lse)``; the blocks are merged by their lse.

Backward: the K/V shards go around the ring again, each accompanied by the running sum of its
dK/dV. Every block is an ``ad.backward`` against the *merged* ``out`` and ``lse``: with the
global lse and ``delta = rowsum(dout · out)`` of the merged output, a block's probabilities and
gradients are exactly its share of the full attention's, so nothing of the merge is recomputed.
After ``W`` hops each dK/dV sum is back at its owner.

Attention sinks: the blocks run without them, and the sink joins each row's merged ``(out,
lse)`` once, after the last step, as one more term of the merge (a block with no value). The
backward's blocks then read the merged lse, which includes the sink, so their probabilities are
right as they are; the sink's gradient is ``-Σ_rows exp(sink - lse) · delta`` over this rank's
rows. Per-rank memory stays O(S/W): the saved
activations are this rank's q, k, v, out and lse, and at most two K/V and two dK/dV shards are in
flight.

Causal scheduling (positions are global; chunk ``i`` precedes chunk ``j`` iff ``i < j``): a
(query chunk, key chunk) pair is skipped when the key chunk is later, computed causally (square,
top-left) when it is the same chunk, and in full when it is earlier. With the zigzag layout
(rank ``r`` holds chunks ``r`` and ``2W-1-r``) that collapses to one call per step:

* own shard (``s == r``): one causal call on the whole shard: with local positions the pair
  (early q, late k) is above the diagonal and (late q, early k) below it, as globally;
* ``s < r``: every query sees the source's early chunk ``s`` in full and none of its late chunk
  ``2W-1-s`` (it is after both of ours): all queries against the first half of K/V;
* ``s > r``: our early chunk ``r`` sees nothing of the source; our late chunk ``2W-1-r`` sees
  both of its chunks in full: the second half of the queries against all of K/V.

Every non-own step thus costs half a shard-by-shard block on every rank. With the contiguous
layout a rank skips the ``s > r`` steps and the work is unbalanced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch._autograd import in_scope, scope


@dataclass(frozen=True)
class Block:
    """One dispatched call: local query rows ``q_rows`` against K/V shard columns ``k_cols``."""

    q_rows: slice
    k_cols: slice
    causal: bool


def block_plan(
    load_balance: str, rank: int, src: int, shard_len: int, causal: bool
) -> tuple[Block, ...]:
    """The calls that attend rank ``rank``'s queries to rank ``src``'s keys (local indices)."""
    whole = slice(0, shard_len)
    if not causal:
        return (Block(whole, whole, False),)
    if src == rank:
        return (Block(whole, whole, True),)
    if load_balance == "contiguous":
        return (Block(whole, whole, False),) if src < rank else ()
    half = shard_len // 2
    if src < rank:
        return (Block(whole, slice(0, half), False),)
    return (Block(slice(half, shard_len), whole, False),)


@dataclass(frozen=True)
class Ring:
    """Where this rank sits in the ring and what every block call needs."""

    group: object
    rank: int
    world: int
    load_balance: str
    causal: bool
    scale: float | None
    backend: str | None
    softcap: float | None = None  # per score: each block's capped softmax merges exactly

    def peer(self, offset: int) -> int:
        """The global rank of the group member ``offset`` places after this one."""
        group = self.group if self.group is not None else dist.group.WORLD
        return dist.get_global_rank(group, (self.rank + offset) % self.world)

    def plan(self, step: int, shard_len: int) -> tuple[Block, ...]:
        src = (self.rank - step) % self.world
        return block_plan(self.load_balance, self.rank, src, shard_len, self.causal)


@dataclass
class Transfer:
    """Work in flight; holds the sent tensors so that their memory outlives the transfer."""

    work: list
    sent: tuple[Tensor, ...]

    def wait(self) -> None:
        for w in self.work:
            w.wait()


def pass_on(ring: Ring, tensors: tuple[Tensor, ...]) -> tuple[tuple[Tensor, ...], Transfer]:
    """Send ``tensors`` to the next rank and receive the previous rank's into fresh buffers."""
    received = tuple(torch.empty_like(t) for t in tensors)
    nxt, prev = ring.peer(1), ring.peer(-1)
    ops = [dist.P2POp(dist.isend, t, nxt, ring.group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, prev, ring.group) for t in received]
    return received, Transfer(dist.batch_isend_irecv(ops), tensors)


def _wait(transfer: Transfer | None) -> None:
    if transfer is not None:
        transfer.wait()


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge_into(out_acc: Tensor, lse_acc: Tensor, out: Tensor, lse: Tensor) -> None:
    """Fold a block's (out, lse) into the running (out_acc, lse_acc), in place.

    A row that has seen no key yet (lse ``-inf``) takes weight 0, never ``exp(-inf + inf)``.
    """
    new = torch.logaddexp(lse_acc, lse)
    shift = torch.where(torch.isneginf(new), torch.zeros_like(new), new)
    w_acc = torch.exp(lse_acc - shift).transpose(1, 2).unsqueeze(-1).to(out_acc.dtype)
    w_new = torch.exp(lse - shift).transpose(1, 2).unsqueeze(-1).to(out_acc.dtype)
    out_acc.mul_(w_acc).add_(out.to(out_acc.dtype) * w_new)
    lse_acc.copy_(new)


def merge_sinks(out_acc: Tensor, lse_acc: Tensor, sinks: Tensor) -> None:
    """Fold the sinks (a logit per head, no value) into the merged (out_acc, lse_acc), in place:
    each row's normaliser gains ``exp(sinks[h])``, so its output shrinks by
    ``exp(lse_acc - lse)`` (0 for a row that saw no key: it keeps output 0)."""
    new = torch.logaddexp(lse_acc, sinks.to(lse_acc.dtype)[None, :, None])
    out_acc.mul_(torch.exp(lse_acc - new).transpose(1, 2).unsqueeze(-1).to(out_acc.dtype))
    lse_acc.copy_(new)


def sinks_gradient(out: Tensor, lse: Tensor, dout: Tensor, sinks: Tensor) -> Tensor:
    """``-Σ exp(sinks[h] - lse) · rowsum(dout · out)`` over the batch and this rank's rows."""
    dt = acc_dtype(out.dtype)
    delta = (dout.to(dt) * out.to(dt)).sum(-1).transpose(1, 2)  # [B, H, S] as lse
    p_sink = torch.exp(sinks.to(dt)[None, :, None] - lse.to(dt))
    return (-(p_sink * delta).sum((0, 2))).to(sinks.dtype)


def ring_forward(
    ring: Ring, q: Tensor, k: Tensor, v: Tensor, sinks: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """This rank's (out, lse) of attention over the whole ring's K/V (and ``sinks``)."""
    b, s, h, _ = q.shape
    out_acc = q.new_zeros((b, s, h, v.shape[-1]), dtype=acc_dtype(q.dtype))
    lse_acc = torch.full((b, h, s), float("-inf"), dtype=adb.lse_dtype(q.dtype), device=q.device)
    kv = (k, v)
    for step in range(ring.world):
        nxt, work = pass_on(ring, kv) if step + 1 < ring.world else (None, None)
        try:
            for blk in ring.plan(step, s):
                out, lse = ad.forward(
                    q[:, blk.q_rows],
                    kv[0][:, blk.k_cols],
                    kv[1][:, blk.k_cols],
                    causal=blk.causal,
                    scale=ring.scale,
                    backend=ring.backend,
                    softcap=ring.softcap,
                )
                merge_into(out_acc[:, blk.q_rows], lse_acc[:, :, blk.q_rows], out, lse)
        finally:
            # The peers issued the matching transfers before their own blocks: completing ours
            # keeps the group usable when a block raises on every rank (e.g. a forced backend).
            _wait(work)
        kv = nxt
    if sinks is not None:
        merge_sinks(out_acc, lse_acc, sinks)
    return out_acc.to(q.dtype), lse_acc


def ring_backward(
    ring: Ring, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of this rank's shards; dK/dV partial sums travel with the K/V they belong to."""
    s = q.shape[1]
    dt = acc_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=dt, device=q.device)
    kv = (k, v)
    dkv: tuple[Tensor, Tensor] | None = None  # the running dK/dV sum of the K/V in hand
    dkv_work = None
    for step in range(ring.world):
        nxt, kv_work = pass_on(ring, kv) if step + 1 < ring.world else (None, None)
        try:
            dk_blk = torch.zeros(kv[0].shape, dtype=dt, device=q.device)
            dv_blk = torch.zeros(kv[1].shape, dtype=dt, device=q.device)
            for blk in ring.plan(step, s):
                r, c = blk.q_rows, blk.k_cols
                g = ad.backward(
                    q[:, r],
                    kv[0][:, c],
                    kv[1][:, c],
                    out[:, r],
                    lse[:, :, r],
                    dout[:, r],
                    causal=blk.causal,
                    scale=ring.scale,
                    backend=ring.backend,
                    softcap=ring.softcap,
                )
                dq[:, r] += g[0]
                dk_blk[:, c] += g[1]
                dv_blk[:, c] += g[2]
        finally:
            _wait(kv_work)
            _wait(dkv_work)
        if dkv is not None:  # the sum arrived from the previous rank while the block ran
            dk_blk += dkv[0]
            dv_blk += dkv[1]
        dkv = (dk_blk, dv_blk)
        if ring.world > 1:
            # The last hop takes each sum home: after W hops rank r holds the sum for its own K/V.
            dkv, dkv_work = pass_on(ring, dkv)
        kv = nxt
    _wait(dkv_work)
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, ring: Ring, sinks=None) -> Tensor:
        # point-to-point transfers need plain memory (k, v may be views of a packed projection)
        k, v = k.contiguous(), v.contiguous()
        out, lse = ring_forward(ring, q, k, v, sinks)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.ring = ring
        ctx.scope = scope()  # the backward's blocks decide as ad.attention's backward does
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        dout = dout.contiguous()
        with in_scope(ctx.scope):
            dq, dk, dv = ring_backward(ctx.ring, q, k, v, out, lse, dout)
        dsinks = None if sinks is None else sinks_gradient(out, lse, dout, sinks)
        return dq, dk, dv, None, dsinks
