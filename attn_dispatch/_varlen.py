"""Going between padded batches and the varlen (THD) layout that ``attention`` takes.

A padded batch is ``[B, S, ...]`` plus a key-padding mask ``[B, S]`` (True/1 = a real token); the
varlen form is ``[T, ...]`` with the real tokens of every row back to back, ``cu_seqlens`` (int32
``[N+1]``) and ``max_seqlen`` as a Python int. Building the metadata reads the device once (one
host sync: the token count and the longest sequence in one transfer); moving tensors between the
two forms afterwards never reads the device, so a model builds the metadata once per batch and
reuses it in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ._validation import _require_tensor


@dataclass(frozen=True, eq=False)
class Varlen:
    """Where the real tokens of a ``[batch, seqlen]`` grid go in a varlen tensor.

    ``indices``: int64 ``[T]``, the flat positions (``row * seqlen + col``) of the real tokens in
    order; ``cu_seqlens``: int32 ``[N+1]``, the sequence boundaries in the varlen tensor;
    ``max_seqlen``: the longest sequence, a Python int. ``N`` is the batch size for a padding
    mask, or the number of documents for packed sequences.
    """

    indices: Tensor
    cu_seqlens: Tensor
    max_seqlen: int
    batch: int
    seqlen: int

    @property
    def num_sequences(self) -> int:
        """``N``, the number of sequences (known without reading the device)."""
        return self.cu_seqlens.numel() - 1

    @property
    def total(self) -> int:
        """``T``, the number of real tokens."""
        return self.indices.numel()

    def unpad(self, x: Tensor) -> Tensor:
        """``x`` ``[batch, seqlen, ...]`` as ``[T, ...]``: the real tokens, differentiable.

        Strided inputs (e.g. a BSHD view of a BHSD tensor) are gathered directly, without first
        copying the whole batch.
        """
        _require_tensor("x", x)
        if x.dim() < 2 or tuple(x.shape[:2]) != (self.batch, self.seqlen):
            raise ValueError(
                f"argument 'x': expected shape ({self.batch}, {self.seqlen}, ...) "
                f"[batch, seqlen, ...], got {tuple(x.shape)}"
            )
        if x.stride(0) == x.shape[1] * x.stride(1):  # rows and columns merge into a view
            return x.flatten(0, 1).index_select(0, self.indices)
        return x[self.indices // self.seqlen, self.indices % self.seqlen]

    def pad(self, x: Tensor) -> Tensor:
        """``x`` ``[T, ...]`` back to ``[batch, seqlen, ...]``, zeros at padding; differentiable."""
        _require_tensor("x", x)
        if x.dim() < 1 or x.shape[0] != self.total:
            raise ValueError(
                f"argument 'x': expected shape ({self.total}, ...) [T, ...], got {tuple(x.shape)}"
            )
        flat = x.new_zeros((self.batch * self.seqlen, *x.shape[1:]))
        return flat.index_copy(0, self.indices, x).view(self.batch, self.seqlen, *x.shape[1:])


def _readable(name: str, t: Tensor) -> None:
    """Lengths are read from ``t``'s values: a meta tensor has none."""
    if t.is_meta:
        raise ValueError(
            f"argument '{name}': a meta tensor has no values to read sequence lengths from "
            "(pass the mask on the device, or on the CPU)"
        )


def _check_mask(name: str, mask) -> Tensor:
    _require_tensor(name, mask)
    _readable(name, mask)
    if mask.dim() != 2 or mask.shape[0] == 0:
        raise ValueError(
            f"argument '{name}': expected a 2-D [batch, seqlen] mask with batch >= 1, "
            f"got shape {tuple(mask.shape)}"
        )
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point() or mask.is_complex():
        raise TypeError(
            f"argument '{name}': expected a bool or integer (0/1) key-padding mask, got "
            f"{mask.dtype} (an additive float mask cannot be turned into sequence lengths)"
        )
    return mask != 0


def _layout(mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row lengths, ``cu_seqlens`` and the flattened mask, all on the device."""
    lens = mask.sum(1, dtype=torch.int32)
    cu = F.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
    return lens, cu, mask.flatten()


def _indices(flat: Tensor, total: int) -> Tensor:
    # The size is known, so the kernel need not read the device to size its output.
    return torch.nonzero_static(flat, size=total).flatten()


def varlen_from_mask(mask: Tensor) -> Varlen:
    """Varlen metadata for a ``[B, S]`` key-padding mask (True/1 = real token); one host sync.

    Padding may sit anywhere in a row (left, right or both); the real tokens keep their order.
    """
    mask = _check_mask("mask", mask)
    lens, cu, flat = _layout(mask)
    total, longest = torch.stack([cu[-1], lens.max()]).tolist()
    return Varlen(_indices(flat, total), cu, longest, mask.shape[0], mask.shape[1])


def varlen_from_key_mask(key_mask: Tensor, seqlen_q: int) -> tuple[Varlen, Varlen]:
    """``(queries, keys)`` metadata when the queries are the last ``seqlen_q`` positions.

    This is the KV-cache case: ``key_mask`` ``[B, Sk]`` marks the real keys and the queries are
    the tail of each row, so a query is real where the tail of its mask row is. Pass the result
    to ``attention`` with ``causal_align="bottom_right"``. One host sync for both.
    """
    key_mask = _check_mask("key_mask", key_mask)
    sk = key_mask.shape[1]
    if isinstance(seqlen_q, bool) or not isinstance(seqlen_q, int) or not 1 <= seqlen_q <= sk:
        raise ValueError(f"argument 'seqlen_q': expected an int in [1, {sk}], got {seqlen_q!r}")
    query_mask = key_mask[:, sk - seqlen_q :]
    lens_q, cu_q, flat_q = _layout(query_mask)
    lens_k, cu_k, flat_k = _layout(key_mask)
    total_q, max_q, total_k, max_k = torch.stack(
        [cu_q[-1], lens_q.max(), cu_k[-1], lens_k.max()]
    ).tolist()
    batch = key_mask.shape[0]
    return (
        Varlen(_indices(flat_q, total_q), cu_q, max_q, batch, seqlen_q),
        Varlen(_indices(flat_k, total_k), cu_k, max_k, batch, sk),
    )


def varlen_from_position_ids(position_ids: Tensor) -> Varlen:
    """Varlen metadata for documents packed into the rows of a ``[B, S]`` batch; one host sync.

    A new document starts at every row start and wherever a position is not its predecessor
    plus one (``position_ids`` restarting), the rule Hugging Face transformers uses. Every token
    is kept, so ``unpad`` is a reshape; ``num_sequences > B`` tells whether anything is packed.
    """
    _require_tensor("position_ids", position_ids)
    _readable("position_ids", position_ids)
    if position_ids.dim() != 2 or position_ids.numel() == 0:
        raise ValueError(
            "argument 'position_ids': expected a non-empty 2-D [batch, seqlen] tensor, got "
            f"shape {tuple(position_ids.shape)}"
        )
    if (
        position_ids.is_floating_point()
        or position_ids.is_complex()
        or position_ids.dtype == torch.bool
    ):
        raise TypeError(f"argument 'position_ids': expected integers, got {position_ids.dtype}")
    batch, seqlen = position_ids.shape
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    starts = starts.flatten()
    # Lengths land in a buffer with room for every possible document, so nothing has to be sized
    # from the data before the one transfer below.
    doc = starts.cumsum(0) - 1
    lens = torch.zeros(starts.numel(), dtype=torch.int32, device=starts.device)
    lens.scatter_add_(0, doc, torch.ones_like(doc, dtype=torch.int32))
    count, longest = torch.stack([starts.sum(), lens.max().long()]).tolist()
    cu = F.pad(lens[:count].cumsum(0, dtype=torch.int32), (1, 0))
    indices = torch.arange(starts.numel(), device=starts.device)
    return Varlen(indices, cu, longest, batch, seqlen)
