r"""Backward, query side: dQ for one block of query rows of one head.

.. math::

    dQ_i = \text{scale} \sum_{j \in V(i)} dS_{ij}\, k_j, \qquad
    dS_{ij} = P_{ij}\,(dO_i \cdot v_j - \delta_i), \qquad
    P_{ij} = 2^{\,s_{ij}\,\text{qk\_scale} - \mathrm{lse2}_i}.

This is the "split" design: the key-side kernel computes dK/dV and this kernel recomputes ``P``
and ``dP`` for dQ (two extra products per tile: 7 instead of 5), in exchange for writing dQ once,
in the input dtype, with no fp32 accumulator, no atomics and no conversion pass. Results are
therefore bitwise reproducible: the deterministic mode is the only mode.

With ``LOAD_TMA`` (Hopper) K and V tiles are read through tensor descriptors (see
``_bwd_dkdv``; rows past a varlen sequence's end are masked out of P).

Key blocks are walked like the forward (``_common.key_block_ranges``): the fully visible ones
without masks, those at the band's edges (causal diagonal, sliding window) and the partial last
block with masks; blocks wholly outside the band are skipped. With ``SOFTCAP``, P comes from the
capped scores and dS carries the cap's derivative ``1 - tanh^2``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import (
    backward_cap,
    band_offsets,
    band_where,
    key_block_ranges,
    load_head_rows,
    load_strided_tile,
    log2_scores,
    query_program,
    score_grad,
    seq_bounds,
    store_head_rows,
)


@triton.jit
def _attn_bwd_dq_inner(
    dq,
    q,
    do,
    lse2,
    delta,
    k_base,
    v_base,
    k_desc,
    v_desc,
    desc_at,
    stride_ks,
    stride_vs,
    lo,
    hi,
    offs_m,
    band,
    k_len,
    qk_scale,
    cap,
    D,
    DV,
    MASKED: tl.constexpr,
    LIMIT_LEFT: tl.constexpr,
    LIMIT_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    LOAD_TMA: tl.constexpr,
):
    """Accumulate key blocks [lo, hi) into dq (fp32); ``band``: ``(lo_off, hi_off)``;
    ``cap``: ``(cap_in, cap_out)`` of the soft cap."""
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + offs_n0
        if LOAD_TMA:
            at = [desc_at[0], desc_at[1] + n0, desc_at[2], 0]
            k = k_desc.load(at).reshape(BLOCK_N, BLOCK_D)
            v = v_desc.load(at).reshape(BLOCK_N, BLOCK_DV)
        else:
            k = load_strided_tile(k_base, stride_ks, offs_n, k_len, offs_d, D, MASKED, BLOCK_D)
            v = load_strided_tile(v_base, stride_vs, offs_n, k_len, offs_dv, DV, MASKED, BLOCK_DV)
        # -- P = exp2(Q K^T * qk_scale - lse2)  (capped: exp2(c log2(e) tanh(s / c) - lse2))
        x, t = log2_scores(tl.dot(q, tl.trans(k)), qk_scale, cap, SOFTCAP)
        p = tl.math.exp2(x - lse2[:, None])
        if MASKED:
            keep = offs_n[None, :] < k_len
            p = band_where(
                p, 0.0, keep, offs_m[:, None], offs_n[None, :], band, LIMIT_LEFT, LIMIT_RIGHT
            )
        # -- dS = P * (dO V^T - delta);  dQ += dS K
        dp = tl.dot(do, tl.trans(v))
        ds = score_grad(p, dp, delta[:, None], t, SOFTCAP)
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "heads", "group"])
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    KDESC,
    VDESC,
    DQ,
    Lse2,
    Delta,
    CU_Q,
    CU_K,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_dob,
    stride_dos,
    stride_doh,
    stride_dqb,
    stride_dqs,
    stride_dqh,
    stride_tb,
    stride_th,
    stride_ts,
    seqlen_q,
    seqlen_k,
    heads,
    group,
    qk_scale,
    scale,
    win_left,
    win_right,
    softcap,
    D: tl.constexpr,
    DV: tl.constexpr,
    LIMIT_LEFT: tl.constexpr,
    LIMIT_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HEAVY_FIRST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    LOAD_TMA: tl.constexpr,
):
    pid_m, b, h, hk = query_program(heads, group, HEAVY_FIRST)
    q_start, q_len, k_start, k_len = seq_bounds(CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN)
    desc_at = (b * 0 if IS_VARLEN else b, k_start, hk)  # [B, S, Hkv, D] / [1, T, Hkv, D]
    m0 = pid_m * BLOCK_M
    if m0 >= q_len:
        return
    b64 = b.to(tl.int64)
    qrow0 = q_start.to(tl.int64)
    krow0 = k_start.to(tl.int64)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_head_rows(
        Q, b64, qrow0, h, (stride_qb, stride_qs, stride_qh), offs_m, q_len, offs_d, D, BLOCK_D
    )
    do = load_head_rows(
        DO,
        b64,
        qrow0,
        h,
        (stride_dob, stride_dos, stride_doh),
        offs_m,
        q_len,
        offs_dv,
        DV,
        BLOCK_DV,
    )
    t_off = b64 * stride_tb + qrow0 * stride_ts + h * stride_th + offs_m * stride_ts
    lse2 = tl.load(Lse2 + t_off, mask=offs_m < q_len, other=float("inf"))
    delta = tl.load(Delta + t_off, mask=offs_m < q_len, other=0.0)
    k_base = K + b64 * stride_kb + krow0 * stride_ks + hk * stride_kh
    v_base = V + b64 * stride_vb + krow0 * stride_vs + hk * stride_vh

    band = band_offsets(q_len, k_len, win_left, win_right, BOTTOM_RIGHT)
    lo, full_lo, full_hi, hi = key_block_ranges(
        m0, q_len, k_len, band[0], band[1], LIMIT_LEFT, LIMIT_RIGHT, BLOCK_M, BLOCK_N
    )
    cap = backward_cap(qk_scale, scale, softcap, SOFTCAP)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    ranges = (lo, full_lo, full_hi, hi)
    for seg in tl.static_range(3):  # [lo, full_lo) masked, [full_lo, full_hi), [full_hi, hi) masked
        if seg > 0 or LIMIT_LEFT:  # without a left bound [lo, full_lo) is empty
            dq = _attn_bwd_dq_inner(
                dq,
                q,
                do,
                lse2,
                delta,
                k_base,
                v_base,
                KDESC,
                VDESC,
                desc_at,
                stride_ks,
                stride_vs,
                ranges[seg],
                ranges[seg + 1],
                offs_m,
                band,
                k_len,
                qk_scale,
                cap,
                D,
                DV,
                seg != 1,
                LIMIT_LEFT,
                LIMIT_RIGHT,
                SOFTCAP,
                BLOCK_N,
                BLOCK_D,
                BLOCK_DV,
                LOAD_TMA,
            )
    dq = dq * scale
    store_head_rows(
        DQ,
        dq,
        b64,
        qrow0,
        h,
        (stride_dqb, stride_dqs, stride_dqh),
        offs_m,
        q_len,
        offs_d,
        D,
        BLOCK_D,
    )
