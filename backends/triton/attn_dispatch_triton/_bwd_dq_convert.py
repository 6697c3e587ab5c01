r"""Backward, fused-atomic variant: the fp32 dQ scratch to the input dtype, scale applied.

``triton:fused_atomic`` accumulates the unscaled :math:`\sum_j dS_{ij} k_j` of every query row
into an fp32 buffer (zero-filled, contiguous ``[B,S,H,D]`` or ``[T,H,D]``) from the key-side
programs with atomics; this pass writes ``dQ = scale * acc`` in the caller's layout. With
``WIDE_STORE`` the Gluon kernel stored each row's columns in another order
(:func:`logical_columns`), which this pass puts back.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import head_rows, load_head_rows, query_block, store_tile


@triton.jit
def logical_columns(acc, BLOCK_M: tl.constexpr, D: tl.constexpr):
    """The inverse of the Gluon dK/dV kernel's ``WIDE_STORE`` order
    (``_bwd_dkdv_sm90._wide_store_order``): within each half of D, scratch column
    ``32b + 8q + 4k + 2e + t`` holds dQ column ``32b + 16k + 8e + 2q + t``."""
    x = tl.reshape(acc, [BLOCK_M, 2, D // 64, 4, 2, 2, 2])  # (row, half, b, q, k, e, t)
    x = tl.permute(x, [0, 1, 2, 4, 5, 3, 6])  # (row, half, b, k, e, q, t)
    return tl.reshape(x, [BLOCK_M, D])


@triton.jit(do_not_specialize=["seqlen_q", "heads"])
def _attn_bwd_dq_convert(
    ACC,
    DQ,
    CU_Q,
    stride_ab,
    stride_as,
    stride_ah,
    stride_dqb,
    stride_dqs,
    stride_dqh,
    seqlen_q,
    heads,
    scale,
    D: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WIDE_STORE: tl.constexpr = False,
):
    b64, row0, h, q_len, offs_m = query_block(CU_Q, seqlen_q, heads, IS_VARLEN, BLOCK_M)
    if tl.program_id(0) * BLOCK_M >= q_len:
        return
    offs_d = tl.arange(0, BLOCK_D)
    acc = load_head_rows(
        ACC, b64, row0, h, (stride_ab, stride_as, stride_ah), offs_m, q_len, offs_d, D, BLOCK_D
    )
    if WIDE_STORE:
        acc = logical_columns(acc, BLOCK_M, BLOCK_D)
    store_tile(
        head_rows(DQ, b64, row0, h, stride_dqb, stride_dqs, stride_dqh, offs_m, offs_d),
        (acc * scale).to(DQ.dtype.element_ty),
        offs_m,
        q_len,
        offs_d,
        D,
        BLOCK_D != D,
    )
