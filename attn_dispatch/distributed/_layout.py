"""How a global sequence is laid out over the ranks of a group, and moving between the two.

``"zigzag"``: the sequence is cut into ``2W`` equal chunks and rank ``r`` holds chunks ``r`` and
``2W-1-r``, in that order. Under a causal mask the early chunk sees few keys and the late chunk
many, so every rank does the same amount of work. ``"contiguous"``: rank ``r`` holds chunk ``r``
of ``W``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from . import _agreement

LOAD_BALANCES = ("zigzag", "contiguous")


def check_load_balance(load_balance: object) -> str:
    if load_balance not in LOAD_BALANCES:
        raise ValueError(
            f"argument 'load_balance': expected one of {LOAD_BALANCES}, got {load_balance!r}"
        )
    return load_balance


def chunks_per_rank(load_balance: str) -> int:
    return 2 if load_balance == "zigzag" else 1


def rank_chunks(load_balance: str, rank: int, world: int) -> tuple[int, ...]:
    """The global chunk indices rank ``rank`` holds, in shard order."""
    if load_balance == "zigzag":
        return (rank, 2 * world - 1 - rank)
    return (rank,)


def check_global_length(seqlen: int, world: int, load_balance: str) -> int:
    """Chunk length for a global sequence of ``seqlen``; ``ValueError`` if it does not divide."""
    parts = chunks_per_rank(load_balance) * world
    if seqlen % parts:
        rule = (
            f"zigzag cuts it into 2W = {parts} equal chunks"
            if load_balance == "zigzag"
            else f"contiguous cuts it into W = {parts} equal chunks"
        )
        raise ValueError(
            f"sequence length S={seqlen} does not divide over W={world} ranks: "
            f"load_balance={load_balance!r} needs S divisible by {parts} ({rule})"
        )
    return seqlen // parts


def check_shard_length(shard_len: int, world: int, load_balance: str) -> int:
    """The chunk length for a rank's shard of ``shard_len``; the error names the global S."""
    return check_global_length(shard_len * world, world, load_balance)


def global_positions(load_balance: str, rank: int, world: int, chunk: int) -> Tensor:
    """The global sequence positions of rank ``rank``'s shard, in shard order."""
    return torch.cat(
        [torch.arange(c * chunk, (c + 1) * chunk) for c in rank_chunks(load_balance, rank, world)]
    )


def shard_order(load_balance: str, world: int, chunk: int) -> Tensor:
    """Global positions of the concatenation of all shards in rank order (rank 0's shard first)."""
    return torch.cat([global_positions(load_balance, r, world, chunk) for r in range(world)])


def group_info(group) -> tuple[int, int]:
    """(rank in ``group``, size of ``group``); ``group=None`` is the default group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised: call torch.distributed.init_process_group "
            "first (e.g. under torchrun)"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            raise ValueError(
                "argument 'group': this process is not a member of the group (new_group returns "
                "a placeholder on the ranks it leaves out); call only on the group's ranks"
            )
        raise TypeError(
            f"argument 'group': expected None or a torch.distributed ProcessGroup, got "
            f"{type(group).__name__}"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def _check_dim(x: Tensor, dim: int) -> int:
    if not isinstance(x, Tensor):
        raise TypeError(f"argument 'x': expected a torch.Tensor, got {type(x).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"argument 'dim': expected an int in [-{x.dim()}, {x.dim()}), got {dim!r}")
    return dim % x.dim()


def shard_sequence(x: Tensor, *, group=None, load_balance: str = "zigzag", dim: int = 1) -> Tensor:
    """This rank's shard of ``x``, a full sequence along ``dim`` (the same ``x`` on every rank).

    Differentiable: the gradient flows back into the shard's positions of ``x``.
    """
    check_load_balance(load_balance)
    dim = _check_dim(x, dim)
    rank, world = group_info(group)
    chunk = check_global_length(x.shape[dim], world, load_balance)
    parts = [x.narrow(dim, c * chunk, chunk) for c in rank_chunks(load_balance, rank, world)]
    return torch.cat(parts, dim=dim)


class _Unshard(torch.autograd.Function):
    """All-gather of the shards; the gradient of a shard is the sum over ranks of its slice."""

    @staticmethod
    def forward(ctx, x: Tensor, group, load_balance: str, dim: int) -> Tensor:
        rank, world = group_info(group)
        chunk = check_shard_length(x.shape[dim], world, load_balance)
        ctx.group, ctx.load_balance, ctx.dim = group, load_balance, dim
        x = x.contiguous()
        gathered = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(gathered, x, group=group)
        pieces: list[Tensor | None] = [None] * (chunks_per_rank(load_balance) * world)
        for r, shard in enumerate(gathered):
            for i, c in enumerate(rank_chunks(load_balance, r, world)):
                pieces[c] = shard.narrow(dim, i * chunk, chunk)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        shard = shard_sequence(grad, group=ctx.group, load_balance=ctx.load_balance, dim=ctx.dim)
        return shard, None, None, None


def unshard_sequence(
    x: Tensor, *, group=None, load_balance: str = "zigzag", dim: int = 1
) -> Tensor:
    """The full sequence, all-gathered from every rank's shard ``x`` (the inverse of ``shard``).

    Collective: every rank of ``group`` must call it. Differentiable: a shard's gradient is the
    sum over ranks of the gradient of its positions (an all-reduce of the full gradient).
    """
    group_info(group)
    flags = dict(load_balance=load_balance, dim=dim)
    accept = _agreement.check_same_on_every_rank("unshard_sequence", group, dict(x=x), flags)
    check_load_balance(load_balance)
    dim = _check_dim(x, dim)
    accept()
    return _Unshard.apply(x, group, load_balance, dim)
