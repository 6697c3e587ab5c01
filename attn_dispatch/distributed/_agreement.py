"""Every rank of a group must call a context-parallel attention with the same shapes and flags.

If they do not, the ranks exchange shards of different sizes (a hang or an abort in the
communication library) or compute different masks and merge them (a silent wrong result). Each
rank therefore describes its call (shapes, dtypes, flags) and, the first time it sees a
description, the group compares them in one all-gather of an 8-byte digest; a mismatch raises
the same ``ValueError``, naming what differs on which rank, on every rank. Descriptions the group
has agreed on are remembered per group, so later steps with the same call communicate nothing
extra.

A rank that changes its call alone after the group agreed on the previous one starts the
comparison while its peers, their call already agreed on, do not; the group then waits in that
all-gather until its timeout. Calls that differ the first time they are made are always caught.

The comparison runs before any argument is validated, so that a bad argument passed on one rank
only is reported on all of them (as a disagreement) instead of raising on that rank alone and
leaving the others waiting in a collective.
"""

from __future__ import annotations

import hashlib
import numbers
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

# process group -> digests of the calls its ranks have agreed on; dies with the group
_AGREED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def describe(value: object) -> str:
    """A short, deterministic description of one argument (equal on ranks iff the values are)."""
    if isinstance(value, Tensor):
        return f"tensor {tuple(value.shape)} {value.dtype} on {value.device.type}"
    if value is None or isinstance(value, (bool, str, numbers.Number)):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}({', '.join(describe(v) for v in value)})"
    return type(value).__name__


def _digest(fields: dict[str, str]) -> int:
    text = "\n".join(f"{name}={value}" for name, value in fields.items())
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


def _agreed(group) -> set[int]:
    return _AGREED.setdefault(dist.group.WORLD if group is None else group, set())


def _differences(group, fields: dict[str, str]) -> str:
    everyone: list[dict[str, str] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, fields, group=group)
    lines = []
    for name in fields:
        values = [f"rank {r}: {f[name]}" for r, f in enumerate(everyone) if f is not None]
        if len({f[name] for f in everyone if f is not None}) > 1:
            lines.append(f"{name} ({'; '.join(values)})")
    return ", ".join(lines)


def check_same_on_every_rank(what: str, group, tensors: dict, flags: dict) -> Callable[[], None]:
    """Raise ``ValueError`` on every rank if the ranks' calls of ``what`` differ; one all-gather
    the first time this rank sees the call, none after the group has agreed on it.

    Returns ``accept``, to be called once the arguments passed validation: only then is the
    call remembered as agreed. A refused call is compared again each time it is made, so a
    rank repeating a refused call can never skip the comparison its peers make.

    Whether the call records a backward is part of it: a rank that skips the backward would
    leave its peers waiting in the backward's transfers.
    """
    fields = {name: describe(t) for name, t in tensors.items()}
    fields |= {name: describe(value) for name, value in flags.items()}
    fields["records a backward"] = str(
        torch.is_grad_enabled()
        and any(isinstance(t, Tensor) and t.requires_grad for t in tensors.values())
    )
    digest = _digest(fields)
    agreed = _agreed(group)
    if digest in agreed:
        return _nothing
    first = next(iter(tensors.values()))
    mine = torch.tensor([digest], dtype=torch.int64, device=_device(group, first))
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    if any(int(g.item()) != digest for g in gathered):
        raise ValueError(
            f"{what}: the ranks of the group were called with different arguments; every rank "
            "must pass the same shapes and flags. Differing: " + _differences(group, fields)
        )
    return lambda: agreed.add(digest)


def _nothing() -> None:
    return None


def _device(group, q: object) -> torch.device:
    """Where the digest must live for the group's backend (NCCL: the current CUDA device)."""
    backend = str(dist.get_backend(group)).lower()
    on_cuda = isinstance(q, Tensor) and q.device.type == "cuda"
    if backend == "nccl":  # q's GPU, as the transfers of the call itself use
        return q.device if on_cuda else torch.device("cuda", torch.cuda.current_device())
    if backend == "gloo" or not isinstance(q, Tensor):
        return torch.device("cpu")
    return q.device
