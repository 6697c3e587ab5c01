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
    band_keep,
    band_offsets,
    key_block_ranges,
    load_tile,
    seq_bounds,
    soft_cap_tanh,
    store_tile,
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
    lo_off, hi_off = band
    cap_in, cap_out = cap
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
            k = load_tile(
                k_base + offs_n[:, None] * stride_ks + offs_d[None, :],
                offs_n,
                k_len,
                offs_d,
                D,
                MASKED,
                BLOCK_D != D,
            )
            v = load_tile(
                v_base + offs_n[:, None] * stride_vs + offs_dv[None, :],
                offs_n,
                k_len,
                offs_dv,
                DV,
                MASKED,
                BLOCK_DV != DV,
            )
        # -- P = exp2(Q K^T * qk_scale - lse2)
        if SOFTCAP:  # capped: exp2(c log2(e) tanh(s / c) - lse2)
            t = soft_cap_tanh(tl.dot(q, tl.trans(k)), cap_in)
            p = tl.math.exp2(t * cap_out - lse2[:, None])
        else:
            p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if MASKED:
            keep = band_keep(
                offs_n[None, :] < k_len,
                offs_m[:, None],
                offs_n[None, :],
                lo_off,
                hi_off,
                LIMIT_LEFT,
                LIMIT_RIGHT,
            )
            p = tl.where(keep, p, 0.0)
        # -- dS = P * (dO V^T - delta);  dQ += dS K
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        if SOFTCAP:  # d(c tanh(s / c)) / ds = 1 - tanh^2
            ds = ds * (1.0 - t * t)
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
    if HEAVY_FIRST:
        # grid (B*H, query blocks): the GPU starts programs in launch order, so with causal
        # masks the last query blocks (they see the most keys) of every head go first and the
        # light ones fill the tail.
        bh = tl.program_id(0)
        pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    hk = h // group
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
    q = load_tile(
        Q
        + b64 * stride_qb
        + qrow0 * stride_qs
        + h * stride_qh
        + offs_m[:, None] * stride_qs
        + offs_d[None, :],
        offs_m,
        q_len,
        offs_d,
        D,
        True,
        BLOCK_D != D,
    )
    do = load_tile(
        DO
        + b64 * stride_dob
        + qrow0 * stride_dos
        + h * stride_doh
        + offs_m[:, None] * stride_dos
        + offs_dv[None, :],
        offs_m,
        q_len,
        offs_dv,
        DV,
        True,
        BLOCK_DV != DV,
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
    if SOFTCAP:
        cap = (scale / softcap, softcap * 1.4426950408889634)
    else:
        cap = (qk_scale, qk_scale)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if LIMIT_LEFT:
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
            lo,
            full_lo,
            offs_m,
            band,
            k_len,
            qk_scale,
            cap,
            D,
            DV,
            True,
            LIMIT_LEFT,
            LIMIT_RIGHT,
            SOFTCAP,
            BLOCK_N,
            BLOCK_D,
            BLOCK_DV,
            LOAD_TMA,
        )
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
        full_lo,
        full_hi,
        offs_m,
        band,
        k_len,
        qk_scale,
        cap,
        D,
        DV,
        False,
        LIMIT_LEFT,
        LIMIT_RIGHT,
        SOFTCAP,
        BLOCK_N,
        BLOCK_D,
        BLOCK_DV,
        LOAD_TMA,
    )
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
        full_hi,
        hi,
        offs_m,
        band,
        k_len,
        qk_scale,
        cap,
        D,
        DV,
        True,
        LIMIT_LEFT,
        LIMIT_RIGHT,
        SOFTCAP,
        BLOCK_N,
        BLOCK_D,
        BLOCK_DV,
        LOAD_TMA,
    )
    dq = dq * scale
    store_tile(
        DQ
        + b64 * stride_dqb
        + qrow0 * stride_dqs
        + h * stride_dqh
        + offs_m[:, None] * stride_dqs
        + offs_d[None, :],
        dq.to(DQ.dtype.element_ty),
        offs_m,
        q_len,
        offs_d,
        D,
        BLOCK_D != D,
    )
