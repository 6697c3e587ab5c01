r"""Backward preprocess: per query row, ``delta_i = rowsum(dO_i * O_i)`` and ``lse2_i``.

``delta_i = \sum_d dO_{id} O_{id}`` equals :math:`\sum_j P_{ij} dP_{ij}`, the term the softmax
backward subtracts (``dS = P * (dP - delta)``); computing it once per row saves a reduction in
every backward tile.

``lse2_i = lse_i * log2(e)`` moves the lse to the base-2 domain the backward kernels use
(``P = exp2(s * qk_scale - lse2)``). A row that sees no key has ``lse = -inf``; it gets
``lse2 = +inf`` so its ``P`` is exactly 0 and its gradients vanish, without a test in the loops.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import query_block, row_delta_lse


@triton.jit(do_not_specialize=["seqlen_q", "heads"])
def _attn_bwd_preprocess(
    Out,
    DO,
    Lse,
    Delta,
    Lse2,
    CU_Q,
    stride_ob,
    stride_os,
    stride_oh,
    stride_dob,
    stride_dos,
    stride_doh,
    stride_lb,
    stride_lh,
    stride_ls,
    stride_tb,
    stride_th,
    stride_ts,
    seqlen_q,
    heads,
    DV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    b64, row0, h, q_len, offs_m = query_block(CU_Q, seqlen_q, heads, IS_VARLEN, BLOCK_M)
    if tl.program_id(0) * BLOCK_M >= q_len:
        return
    delta, lse = row_delta_lse(
        Out,
        DO,
        Lse,
        b64,
        row0,
        h,
        (stride_ob, stride_os, stride_oh),
        (stride_dob, stride_dos, stride_doh),
        (stride_lb, stride_lh, stride_ls),
        offs_m,
        q_len,
        0.0,
        DV,
        BLOCK_DV,
    )
    row_ok = offs_m < q_len
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    t_off = b64 * stride_tb + row0 * stride_ts + h * stride_th + offs_m * stride_ts
    tl.store(Delta + t_off, delta, mask=row_ok)
    tl.store(Lse2 + t_off, lse2, mask=row_ok)
