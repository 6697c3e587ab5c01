r"""Backward, key side: dK and dV for one block of keys, summed over the whole GQA group.

With :math:`P_{ij} = e^{s_{ij} - \mathrm{lse}_i}`, :math:`dP_{ij} = dO_i \cdot v_j` and
:math:`dS_{ij} = P_{ij}(dP_{ij} - \delta_i)`:

.. math::

    dV_j = \sum_{h \in G(j)} \sum_i P^h_{ij}\, dO^h_i, \qquad
    dK_j = \text{scale} \sum_{h \in G(j)} \sum_i dS^h_{ij}\, q^h_i ,

where :math:`G(j)` is the set of query heads that read kv head ``h // group``. One program owns
BLOCK_N keys of one (sequence, kv head): it loads K and V once, keeps them in registers, and walks
every query head of its group and every query block that sees those keys, accumulating dK/dV in
fp32 registers. So GQA needs no expanded K/V and no separate reduction over heads, and nothing is
written twice: no atomics.

When a launch has too few key blocks to fill the GPU (short sequences, or causal masks whose
programs differ in work), the group is split across ``grid[2]`` programs; each writes an fp32
partial dK/dV slice that the launcher sums afterwards in a fixed order (still no atomics, still
bitwise reproducible).

With ``ATOMIC_DQ`` the same program also produces dQ (the "fused atomic" variant, used by
``triton:fused_atomic``): each visited tile adds :math:`dS\,K` (``BLOCK_M x D``) into an fp32
scratch with ``tl.atomic_add``, and a convert pass (``_bwd_dq_convert``) applies the scale and
casts to the input dtype. That is 5 tile products per tile pair instead of the split design's 7,
at the price of fp32 atomics: the summation order of dQ, hence its last bits, varies from run to
run. Without ``ATOMIC_DQ`` the branch is compiled out and the kernel is the deterministic one.
With ``DQ_TMA`` (Hopper) the scratch is a tensor descriptor over ``[rows, BLOCK_D]`` fp32 (rows
of one (sequence, head) contiguous) and each tile is added by one bulk TMA reduction instead of
per-thread ``red`` instructions; rows past a sequence's end carry exactly zero (P is masked to 0
there), so a tile may overlap the next sequence's rows harmlessly.

With ``LOAD_TMA`` (Hopper) the query-side tiles (Q, dO) of the loop are read through tensor
descriptors ``[B, S, H, D]`` (``[1, T, H, D]`` varlen), i.e. by TMA copies instead of per-thread
address arithmetic and ``cp.async``. Rows past the tensor's end arrive as zeros; rows past a
varlen sequence's end are the next sequence's (finite) rows, which the row mask zeroes in P.

The tile is computed transposed (``s^T = K Q^T``, ``BLOCK_N x BLOCK_M``) so ``P^T`` and ``dS^T``
feed the two accumulating products without a transpose. Only the query blocks that meet these
keys' band (causal mask, sliding window: ``_common.query_block_ranges``) are walked; those at the
band's edges (and a partial last query block) take the masked path, the rest none. With
``SOFTCAP`` the scores are ``c tanh(s / c)``: P is recomputed from the capped scores and dS
carries the cap's derivative ``1 - tanh^2``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import (
    backward_cap,
    band_offsets,
    band_where,
    load_head_rows,
    load_strided_tile,
    log2_scores,
    query_block_ranges,
    score_grad,
    seq_bounds,
    store_tile,
)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk,
    dv,
    k,
    v,
    head,
    strides,
    lo,
    hi,
    offs_n,
    band,
    q_len,
    qk_scale,
    cap,
    D,
    DV,
    MASKED: tl.constexpr,
    LIMIT_LEFT: tl.constexpr,
    LIMIT_RIGHT: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
    DQ_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    LOAD_TMA: tl.constexpr,
    DP_FIRST: tl.constexpr,
):
    """Accumulate query blocks [lo, hi) of one head into dk, dv (fp32) and, with
    ``ATOMIC_DQ``, add each block's unscaled dQ contribution into the fp32 scratch.

    ``head``: where this query head's rows start (q, dO pointers; their descriptors and the
    descriptor coordinates; lse2, delta; the dQ scratch and its row); ``strides``: the row
    strides of q, dO, the dQ scratch and lse2/delta; ``band``: ``(lo_off, hi_off)``; ``cap``:
    ``(cap_in, cap_out)`` of the soft cap.

    ``DP_FIRST`` (unmasked blocks only) loads dO and delta up front and issues
    ``dP^T = V dO^T`` right after ``S^T = K Q^T``, so the exponentials run while it computes.
    Tuned per shape class: faster without a causal mask and at MHA 1K causal, slower with the
    64x128 causal tiles (figures in docs/experiments.md)."""
    q_base, do_base, q_desc, do_desc, desc_at, lse2_base, delta_base, dqa_base, dqa_row = head
    stride_qs, stride_dos, stride_dqas, stride_ts = strides
    dp_first: tl.constexpr = DP_FIRST and not MASKED
    do_src = (do_base, do_desc, desc_at, stride_dos)  # dO is read early or late (DP_FIRST)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    for m0 in range(lo, hi, BLOCK_M):
        offs_m = m0 + offs_m0
        if LOAD_TMA:
            q = q_desc.load([desc_at[0], desc_at[1] + m0, desc_at[2], 0]).reshape(BLOCK_M, BLOCK_D)
        else:
            q = load_strided_tile(q_base, stride_qs, offs_m, q_len, offs_d, D, MASKED, BLOCK_D)
        if dp_first:
            do = _load_do(do_src, m0, offs_m, q_len, DV, MASKED, BLOCK_M, BLOCK_DV, LOAD_TMA)
        lse2 = _load_rows(lse2_base, offs_m, stride_ts, q_len, float("inf"), MASKED)
        if dp_first:
            delta = _load_rows(delta_base, offs_m, stride_ts, q_len, 0.0, MASKED)
        qkT = tl.dot(k, tl.trans(q))
        if dp_first:
            dpT = tl.dot(v, tl.trans(do))
        # -- P^T = exp2(K Q^T * qk_scale - lse2)  (capped: exp2(c log2(e) tanh(s / c) - lse2))
        xT, tT = log2_scores(qkT, qk_scale, cap, SOFTCAP)
        pT = tl.math.exp2(xT - lse2[None, :])
        if MASKED:
            keep = offs_m[None, :] < q_len
            pT = band_where(
                pT, 0.0, keep, offs_m[None, :], offs_n[:, None], band, LIMIT_LEFT, LIMIT_RIGHT
            )
        # -- dV += P^T dO
        if not dp_first:
            do = _load_do(do_src, m0, offs_m, q_len, DV, MASKED, BLOCK_M, BLOCK_DV, LOAD_TMA)
        dv += tl.dot(pT.to(do.dtype), do)
        # -- dS^T = P^T * (V dO^T - delta);  dK += dS^T Q
        if not dp_first:
            delta = _load_rows(delta_base, offs_m, stride_ts, q_len, 0.0, MASKED)
            dpT = tl.dot(v, tl.trans(do))
        dsT = score_grad(pT, dpT, delta[None, :], tT, SOFTCAP).to(q.dtype)
        dk += tl.dot(dsT, q)
        if ATOMIC_DQ:  # -- dQ += dS K (unscaled; the convert pass applies the scale)
            dq = tl.dot(tl.trans(dsT), k)
            if DQ_TMA:
                dqa_base.atomic_add([dqa_row + m0, 0], dq)
            else:
                _atomic_add_tile(
                    dqa_base, dq, offs_m, offs_d, stride_dqas, q_len, D, MASKED, BLOCK_D
                )
    return dk, dv


@triton.jit
def _load_do(
    do_src,
    m0,
    offs_m,
    q_len,
    DV,
    MASKED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    LOAD_TMA: tl.constexpr,
):
    """The dO tile of query block ``m0`` (TMA copy or pointer load); ``do_src``: the head's dO
    pointer, descriptor, descriptor coordinates and row stride."""
    do_base, do_desc, desc_at, stride_dos = do_src
    if LOAD_TMA:
        do = do_desc.load([desc_at[0], desc_at[1] + m0, desc_at[2], 0]).reshape(BLOCK_M, BLOCK_DV)
    else:
        offs_dv = tl.arange(0, BLOCK_DV)
        do = load_strided_tile(do_base, stride_dos, offs_m, q_len, offs_dv, DV, MASKED, BLOCK_DV)
    return do


@triton.jit
def _load_rows(base, offs_m, stride_ts, q_len, other, MASKED: tl.constexpr):
    """One value per query row (lse2 or delta); rows past ``q_len`` read ``other``."""
    if MASKED:
        x = tl.load(base + offs_m * stride_ts, mask=offs_m < q_len, other=other)
    else:
        x = tl.load(base + offs_m * stride_ts)
    return x


@triton.jit
def _atomic_add_tile(
    dqa_base, dq, offs_m, offs_d, stride_dqas, q_len, D, MASKED: tl.constexpr, BLOCK_D: tl.constexpr
):
    """Per-element fp32 atomic add of one dQ tile (rows/cols checked where they may be out)."""
    dq_ptrs = dqa_base + offs_m[:, None] * stride_dqas + offs_d[None, :]
    if MASKED:
        if BLOCK_D != D:
            ok = (offs_m[:, None] < q_len) & (offs_d[None, :] < D)
        else:
            ok = offs_m[:, None] < q_len
        tl.atomic_add(dq_ptrs, dq, mask=ok, sem="relaxed")
    elif BLOCK_D != D:
        tl.atomic_add(dq_ptrs, dq, mask=offs_d[None, :] < D, sem="relaxed")
    else:
        tl.atomic_add(dq_ptrs, dq, sem="relaxed")


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "kv_heads", "group"])
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    QDESC,
    DODESC,
    DK,
    DV_,
    DQA,
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
    stride_dkb,
    stride_dks,
    stride_dkh,
    stride_dvb,
    stride_dvs,
    stride_dvh,
    stride_dqab,
    stride_dqas,
    stride_dqah,
    stride_tb,
    stride_th,
    stride_ts,
    stride_dk_split,
    stride_dv_split,
    seqlen_q,
    seqlen_k,
    kv_heads,
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
    ATOMIC_DQ: tl.constexpr,
    DQ_TMA: tl.constexpr,
    HEAVY_FIRST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    LOAD_TMA: tl.constexpr,
    DP_FIRST: tl.constexpr,
):
    if HEAVY_FIRST:
        # grid (group slices, B*Hkv, key blocks): programs start in launch order, so with
        # causal masks the first key blocks (they see the most queries) of every head go first.
        split = tl.program_id(0)
        bh = tl.program_id(1)
        pid_n = tl.program_id(2)
        heads_per_split = group // tl.num_programs(0)
    else:
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
        split = tl.program_id(2)  # which slice of the GQA group this program walks
        heads_per_split = group // tl.num_programs(2)
    b = bh // kv_heads
    hk = bh % kv_heads
    q_start, q_len, k_start, k_len = seq_bounds(CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN)
    desc_b = b * 0 if IS_VARLEN else b  # descriptors: [B, S, H, D] dense, [1, T, H, D] varlen
    n0 = pid_n * BLOCK_N
    if n0 >= k_len:
        return
    b64 = b.to(tl.int64)
    qrow0 = q_start.to(tl.int64)
    krow0 = k_start.to(tl.int64)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = load_head_rows(
        K, b64, krow0, hk, (stride_kb, stride_ks, stride_kh), offs_n, k_len, offs_d, D, BLOCK_D
    )
    v = load_head_rows(
        V, b64, krow0, hk, (stride_vb, stride_vs, stride_vh), offs_n, k_len, offs_dv, DV, BLOCK_DV
    )
    # Query ranges: [lo, diag_hi) and [full_hi, hi) masked (the band's edges: causal diagonal,
    # window's far side; the partial last block), [diag_hi, full_hi) plain; none outside.
    band = band_offsets(q_len, k_len, win_left, win_right, BOTTOM_RIGHT)
    lo, diag_hi, full_hi, hi = query_block_ranges(
        n0, q_len, k_len, band[0], band[1], LIMIT_LEFT, LIMIT_RIGHT, BLOCK_M, BLOCK_N
    )
    cap = backward_cap(qk_scale, scale, softcap, SOFTCAP)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    for g in range(split * heads_per_split, (split + 1) * heads_per_split):
        h = hk * group + g
        q_base = Q + b64 * stride_qb + qrow0 * stride_qs + h * stride_qh
        do_base = DO + b64 * stride_dob + qrow0 * stride_dos + h * stride_doh
        t_off = b64 * stride_tb + qrow0 * stride_ts + h * stride_th
        if DQ_TMA:  # DQA is a descriptor; strides count rows
            dqa_base = DQA
            dqa_row = b * stride_dqab + q_start * stride_dqas + h * stride_dqah
        else:
            dqa_base = DQA + b64 * stride_dqab + qrow0 * stride_dqas + h * stride_dqah
            dqa_row = 0
        head = (
            q_base,
            do_base,
            QDESC,
            DODESC,
            (desc_b, q_start, h),
            Lse2 + t_off,
            Delta + t_off,
            dqa_base,
            dqa_row,
        )
        strides = (stride_qs, stride_dos, stride_dqas, stride_ts)
        ranges = (lo, diag_hi, full_hi, hi)
        for seg in tl.static_range(3):  # the diagonal (masked), the plain blocks, the tail (masked)
            dk, dv = _attn_bwd_dkdv_inner(
                dk,
                dv,
                k,
                v,
                head,
                strides,
                ranges[seg],
                ranges[seg + 1],
                offs_n,
                band,
                q_len,
                qk_scale,
                cap,
                D,
                DV,
                seg != 1,
                LIMIT_LEFT,
                LIMIT_RIGHT,
                SOFTCAP,
                ATOMIC_DQ,
                DQ_TMA,
                BLOCK_M,
                BLOCK_D,
                BLOCK_DV,
                LOAD_TMA,
                DP_FIRST,
            )

    dk = dk * scale
    split64 = split.to(tl.int64)
    dk_base = (
        DK + split64 * stride_dk_split + b64 * stride_dkb + krow0 * stride_dks + hk * stride_dkh
    )
    dv_base = (
        DV_ + split64 * stride_dv_split + b64 * stride_dvb + krow0 * stride_dvs + hk * stride_dvh
    )
    store_tile(
        dk_base + offs_n[:, None] * stride_dks + offs_d[None, :],
        dk.to(DK.dtype.element_ty),
        offs_n,
        k_len,
        offs_d,
        D,
        BLOCK_D != D,
    )
    store_tile(
        dv_base + offs_n[:, None] * stride_dvs + offs_dv[None, :],
        dv.to(DV_.dtype.element_ty),
        offs_n,
        k_len,
        offs_dv,
        DV,
        BLOCK_DV != DV,
    )
