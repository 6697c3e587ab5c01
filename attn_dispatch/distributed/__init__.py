"""Context parallelism: attention over a sequence sharded across the ranks of a process group.

``import attn_dispatch.distributed`` (the core does not import it). Every attention computation
below is an ``attn_dispatch.forward`` / ``attn_dispatch.backward`` call, so backend selection,
forcing (``backend=``, ``use_backend``) and ``explain`` work as for a single device.

* :func:`context_parallel_attention`: this rank's output shard, differentiable.
* :func:`shard_sequence` / :func:`unshard_sequence`: full tensor -> this rank's shard -> full.
* :func:`explain`: the dispatcher's report for every distinct per-block call of this rank.

See ``docs/context_parallel.md`` for the layouts, the strategies and how to choose.
"""

from __future__ import annotations

import torch
from torch import Tensor

import attn_dispatch as ad
from attn_dispatch import backend as adb
from attn_dispatch._validation import (
    _require_tensor,
    check_sinks,
    check_softcap,
    check_window,
    resolve_scale,
)

from . import _agreement, _layout, _ulysses
from ._layout import group_info, shard_sequence, unshard_sequence
from ._ring import Ring, RingAttention

STRATEGIES = ("ring", "ulysses")

__all__ = ["context_parallel_attention", "explain", "shard_sequence", "unshard_sequence"]


def _variants(strategy: str, window, softcap) -> tuple:
    """``(window, softcap)`` validated as ``attn_dispatch.forward`` does; a window only with
    Ulysses."""
    window, softcap = check_window(window), check_softcap(softcap)
    if window is not None and strategy != "ulysses":
        raise ValueError(
            f"argument 'window': window={window} needs strategy='ulysses' (each rank then holds "
            f"the whole sequence for its heads); a ring step's block is a shard against another "
            f"shard, whose band a single call's window cannot express"
        )
    return window, softcap


def _scale(scale) -> float | None:
    """``scale`` validated as ``attn_dispatch.attention`` does; ``None`` stays the default."""
    return None if scale is None else resolve_scale(scale, 1)


def _check(q, k, v, causal, strategy, load_balance, backend, world, sinks=None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _require_tensor(name, t)
        if t.dim() != 4:
            raise ValueError(
                f"argument '{name}': expected a dense [B, S/W, heads, D] shard (4 dims), "
                f"got shape {tuple(t.shape)}"
            )
    if sinks is not None:
        check_sinks(sinks, q, q.shape[2], debug=False)
    if strategy not in STRATEGIES:
        raise ValueError(f"argument 'strategy': expected one of {STRATEGIES}, got {strategy!r}")
    _layout.check_load_balance(load_balance)
    if not isinstance(causal, bool):
        raise TypeError(f"argument 'causal': expected a bool, got {type(causal).__name__}")
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"argument 'backend': expected a str or None, got {type(backend).__name__}")
    for name, t in (("k", k), ("v", v)):
        if t.shape[:2] != q.shape[:2]:
            raise ValueError(
                f"argument '{name}': expected the batch and shard length of q "
                f"{tuple(q.shape[:2])} [B, S/W], got {tuple(t.shape[:2])}"
            )
    _layout.check_shard_length(q.shape[1], world, load_balance)
    if strategy == "ulysses":
        heads, kv_heads = q.shape[2], k.shape[2]
        if heads % world or kv_heads % world:
            raise ValueError(
                f"strategy='ulysses' shards heads: it needs H={heads} and Hkv={kv_heads} both "
                f"divisible by W={world}. With fewer kv heads, use strategy='ring', or repeat "
                f"k and v to a multiple of W heads first (k.repeat_interleave(n, dim=2); the "
                f"gradient of the repeat sums the copies back)"
            )


def _rank_sinks(sinks: Tensor | None, rank: int, world: int) -> Tensor | None:
    """The sinks of the heads that Ulysses gives ``rank`` of ``world`` (the rank's contiguous
    ``H / W`` of them): those its local call takes. ``None`` without sinks."""
    if sinks is None:
        return None
    per_rank = sinks.shape[0] // world
    return sinks[rank * per_rank : (rank + 1) * per_rank]


def _ulysses_attention(
    q, k, v, group, rank, world, load_balance, flags: dict, sinks=None
) -> Tensor:
    """``flags``: the keyword arguments of the local ``ad.forward`` / ``ad.backward``;
    ``sinks``: all heads' sinks, of which this rank's head group joins the local call."""
    order = inverse = None
    banded = flags["causal"] or flags["window"] is not None
    if banded and load_balance == "zigzag":
        chunk = q.shape[1] // 2
        positions = _layout.shard_order(load_balance, world, chunk).to(q.device)
        order = torch.argsort(positions)  # order[p]: where global position p sits in shard order
        inverse = positions  # positions[i]: the global position of shard-order index i
    heads = [_ulysses.Reshard.apply(t, group, world, order, inverse, True) for t in (q, k, v)]
    out = _ulysses.LocalAttention.apply(*heads, flags, _rank_sinks(sinks, rank, world))
    return _ulysses.Reshard.apply(out, group, world, order, inverse, False)


def context_parallel_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group=None,
    causal: bool = False,
    scale: float | None = None,
    strategy: str = "ring",
    load_balance: str = "zigzag",
    backend: str | None = None,
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """This rank's shard of the attention output over the whole (sharded) sequence.

    ``q`` [B, S/W, H, D], ``k``/``v`` [B, S/W, Hkv, D]: this rank's shards of the global sequence
    in the ``load_balance`` layout (see :func:`shard_sequence`), W the size of ``group`` (default:
    the default group). Returns [B, S/W, H, D] in the same layout; gradients flow to this rank's
    q, k and v. Collective: every rank of ``group`` calls it with the same shapes and flags; the
    first time a rank makes a call, the group compares the calls (one all-gather of a digest)
    and a mismatch raises the same ``ValueError`` on every rank. Arguments are validated as
    ``attn_dispatch.attention`` validates them, with the same messages.

    ``strategy="ring"`` passes K/V shards around the ring (any H, Hkv); ``"ulysses"`` re-shards by
    heads with two all-to-alls (needs H and Hkv divisible by W). ``backend`` forces the backend
    of every per-block call, as ``backend=`` of ``attn_dispatch.forward``. ``softcap`` as for
    ``attn_dispatch.forward``, both strategies; ``window`` (global positions, ``Sq == Sk``)
    with ``strategy="ulysses"`` only.

    ``sinks``: ``[H]`` attention-sink logits (as for ``attn_dispatch.attention``, the same on
    every rank), both strategies; each row's softmax counts its sink once (the ring merges it
    into the combined ``lse`` after the last step; Ulysses gives each rank's local call its
    heads' sinks). Its gradient on each rank is that rank's share (its query rows for the ring,
    its heads for Ulysses): summed over the group, as for any parameter replicated on the
    group's ranks (a data-parallel gradient reduction over the group does it), it is the
    gradient of the whole sequence's attention.
    """
    rank, world = group_info(group)
    flags = dict(causal=causal, scale=scale, strategy=strategy, load_balance=load_balance)
    # backend too: a forced backend that refuses the blocks on one rank only would leave the
    # others waiting in the ring's next transfer
    flags |= dict(window=window, softcap=softcap, backend=backend)
    tensors = dict(q=q, k=k, v=v) | ({} if sinks is None else dict(sinks=sinks))
    accept = _agreement.check_same_on_every_rank(
        "context_parallel_attention", group, tensors, flags
    )
    _check(q, k, v, causal, strategy, load_balance, backend, world, sinks)
    window, softcap = _variants(strategy, window, softcap)
    scale = _scale(scale)
    accept()
    if strategy == "ulysses":
        flags = dict(causal=causal, scale=scale, backend=backend, window=window, softcap=softcap)
        return _ulysses_attention(q, k, v, group, rank, world, load_balance, flags, sinks)
    ring = Ring(group, rank, world, load_balance, causal, scale, backend, softcap)
    return RingAttention.apply(q, k, v, ring, sinks)


def explain(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group=None,
    causal: bool = False,
    scale: float | None = None,
    strategy: str = "ring",
    load_balance: str = "zigzag",
    backend: str | None = None,
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> list[tuple[str, ad.Report]]:
    """``(label, report)`` of ``attn_dispatch.explain`` for each distinct call this rank would make.

    Arguments as :func:`context_parallel_attention`; nothing is computed or communicated (only the
    group's rank and size are read). Each distinct block shape gets a forward and a backward
    report; the label says which ring steps (or the Ulysses call) it stands for.
    """
    rank, world = group_info(group)
    _check(q, k, v, causal, strategy, load_balance, backend, world, sinks)
    window, softcap = _variants(strategy, window, softcap)
    scale = _scale(scale)
    # Ulysses' local call has this rank's heads' sinks; the ring's block calls have none (the
    # ring merges the sink into the combined lse itself)
    local_sinks = _rank_sinks(sinks, rank, world) if strategy == "ulysses" else None
    # (label, q, k, v, causal) of each distinct call
    calls: dict[tuple, tuple[str, Tensor, Tensor, Tensor, bool]] = {}
    if strategy == "ulysses":
        b, s = q.shape[:2]
        heads = [t.new_empty((b, s * world, t.shape[2] // world, t.shape[3])) for t in (q, k, v)]
        calls[()] = ("ulysses", *heads, causal)
    else:
        ring = Ring(group, rank, world, load_balance, causal, scale, backend)
        steps: dict[tuple, list[int]] = {}
        for step in range(world):
            for blk in ring.plan(step, q.shape[1]):
                key = (blk.q_rows.stop - blk.q_rows.start, blk.k_cols.stop - blk.k_cols.start)
                key += (blk.causal,)
                cols = blk.k_cols
                calls.setdefault(key, ("", q[:, blk.q_rows], k[:, cols], v[:, cols], blk.causal))
                steps.setdefault(key, []).append(step)
        calls = {key: (f"ring steps {steps[key]}", *call[1:]) for key, call in calls.items()}
    reports = []
    for where, bq, bk, bv, blk_causal in calls.values():
        label = f"{where}: Sq={bq.shape[1]} Sk={bk.shape[1]} causal={blk_causal}"
        out = bq.new_empty((*bq.shape[:3], bv.shape[3]))
        lse = bq.new_empty((bq.shape[0], bq.shape[2], bq.shape[1]), dtype=adb.lse_dtype(bq.dtype))
        flags = dict(
            causal=blk_causal, scale=scale, backend=backend, window=window, softcap=softcap
        )
        flags["sinks"] = local_sinks
        reports.append((f"{label} forward", ad.explain(bq, bk, bv, **flags)))
        reports.append((f"{label} backward", ad.explain(bq, bk, bv, out, lse, out, **flags)))
    return reports
