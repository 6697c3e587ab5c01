"""Pieces shared by the forward and backward kernels.

Device side: where a sequence starts and how long it is (dense or varlen), the causal offset, and
tile loads/stores that check bounds only where a tile may cross them.

Host side: the strides of our layouts (BSHD dense, THD varlen) flattened to one scheme, so every
kernel addresses element ``(b, i, h, d)`` as ``base + b*stride_b + (start_b + i)*stride_s +
h*stride_h + d`` with ``stride_b = 0`` and ``start_b = cu_seqlens[b]`` for varlen inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def seq_bounds(CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    """Start row and length of sequence ``b`` for queries and keys."""
    if IS_VARLEN:
        q_start = tl.load(CU_Q + b)
        q_len = tl.load(CU_Q + b + 1) - q_start
        k_start = tl.load(CU_K + b)
        k_len = tl.load(CU_K + b + 1) - k_start
    else:
        q_start = 0
        q_len = seqlen_q
        k_start = 0
        k_len = seqlen_k
    return q_start, q_len, k_start, k_len


@triton.jit
def head_rows(X, b64, row0, h, stride_b, stride_s, stride_h, offs_m, offs_d):
    """Pointers to rows ``row0 + offs_m``, columns ``offs_d`` of head ``h`` of sequence ``b``."""
    return (
        X
        + b64 * stride_b
        + row0 * stride_s
        + h * stride_h
        + offs_m[:, None] * stride_s
        + offs_d[None, :]
    )


@triton.jit
def causal_offset(q_len, k_len, BOTTOM_RIGHT: tl.constexpr):
    """Row ``i`` sees key ``j`` iff ``j <= i + offset``."""
    if BOTTOM_RIGHT:
        off = k_len - q_len
    else:
        off = q_len * 0
    return off


@triton.jit
def load_tile(ptrs, rows, n_rows, cols, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Load a 2-D tile, zero-filling out-of-range rows/cols; checks only what may be out."""
    if CHECK_ROWS:
        if CHECK_COLS:
            x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
        else:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    else:
        if CHECK_COLS:
            x = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def store_tile(ptrs, x, rows, n_rows, cols, n_cols, CHECK_COLS: tl.constexpr):
    """Store a 2-D tile, rows always checked (the last tile of a sequence is partial)."""
    if CHECK_COLS:
        tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))
    else:
        tl.store(ptrs, x, mask=rows[:, None] < n_rows)


# ----------------------------------------------------------------------------------- host side


def token_strides(x: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, seq, head) strides of a [B,S,H,D] or [T,H,D] tensor; batch stride 0 for varlen."""
    if x.stride(-1) != 1:
        raise ValueError(f"last dimension must be contiguous, got strides {tuple(x.stride())}")
    if varlen:
        return 0, x.stride(0), x.stride(1)
    return x.stride(0), x.stride(1), x.stride(2)


def lse_strides(lse: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, head, seq) strides of lse [B,H,S] or [H,T]."""
    if varlen:
        return 0, lse.stride(0), lse.stride(1)
    return lse.stride(0), lse.stride(1), lse.stride(2)


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """The tensor itself when its last dim is contiguous, else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def padded_dim(d: int) -> int:
    """Head dim rounded up to a power of two (at least 16, the smallest MMA K)."""
    return max(16, triton.next_power_of_2(d))
