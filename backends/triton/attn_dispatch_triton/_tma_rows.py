"""Which tensors the Gluon sm_90 kernels can read, decided from torch metadata alone, and the
triton versions those kernels were checked against (no triton import)."""

from __future__ import annotations

import torch

# The Gluon API is experimental and changes between releases: the kernels were written and
# checked against these triton versions only.
GLUON_TRITON = ((3, 6),)


def rows_view(t: torch.Tensor, varlen: bool) -> tuple[int, int] | None:
    """``(rows, row stride)`` of ``t`` read as ``[rows, heads * D]`` by TMA, or ``None`` when it
    cannot be: empty, pointer or row stride not a multiple of 16 bytes, a broadcast (stride 0)
    row, heads not adjacent (``stride_h != D``) or, dense, sequences not evenly spaced
    (``stride_b != S * stride_s``)."""
    if varlen:
        (tokens, _, d), (stride_s, stride_h, stride_d) = t.shape, t.stride()
    else:
        (batch, seqlen, _, d), (stride_b, stride_s, stride_h, stride_d) = t.shape, t.stride()
        tokens = batch * seqlen
        if batch > 1 and stride_b != seqlen * stride_s:
            return None
    if (
        t.numel() == 0
        or stride_d != 1
        or stride_h != d
        or stride_s <= 0
        or t.data_ptr() % 16
        or stride_s * t.element_size() % 16
    ):
        return None
    return tokens, stride_s
