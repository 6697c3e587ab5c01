r"""Backward, query side, for Hopper (sm_90) in Gluon: dQ of one block of query rows of one head.

The same math as :mod:`._bwd_dq` (split design, deterministic), warp specialised like
:mod:`._bwd_dkdv_sm90` (see ``_sm90``): the producer copies the program's Q and dO tiles once,
then streams the K and V tiles of every key block it sees through a ring of ``STAGES``
shared-memory buffers; two consumer warp groups each own ``BLOCK_M / 2`` query rows and per key
block issue ``S = Q K^T`` and ``dP = dO V^T`` together, form ``P`` while ``dP`` computes, then
add ``dS K`` into their fp32 dQ. Key columns past the sequence's end (the next sequence's finite
rows, or TMA's zeros) and, with a causal mask, above the diagonal get ``P = 0``; query rows past
the end read ``lse2 = +inf`` (``P = 0``) and are never stored. Key blocks past the diagonal are
skipped. As in ``_bwd_dkdv_sm90``, the next sequence's rows enter the products multiplied by
zero, so a NaN or Inf there reaches this sequence's dQ.

Gluon has no CPU interpreter: this kernel is cross-compiled for sm_90 in CI and checked against
the float64 oracle on Hopper GPUs (``tests/test_triton_gluon.py``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._sm90 import (
    CONSUMER_REGS,
    in_band,
    mma_layout,
    operand_layout,
    sequence_rows,
    store_rows,
    tanh_approx,
)


@gluon.jit
def _producer(descs, bufs, work, D: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Q and dO once, then every key block's K and V tiles, STAGES blocks ahead."""
    q_desc, k_desc, v_desc, do_desc = descs
    q_smem, do_smem, k_bufs, v_bufs, bars = bufs
    total, lo_n, qrow, krow, m0, h, hk = work
    qo_bar = bars.index(2 * STAGES)
    mbarrier.expect(qo_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [qrow + m0, h * D], qo_bar, q_smem)
    tma.async_copy_global_to_shared(do_desc, [qrow + m0, h * D], qo_bar, do_smem)
    for it in range(total):
        slot = it % STAGES
        phase = (it // STAGES) & 1
        ready = bars.index(slot)
        mbarrier.wait(bars.index(STAGES + slot), phase ^ 1)  # emptied by both consumers
        mbarrier.expect(ready, 2 * k_desc.block_type.nbytes)
        n0 = (lo_n + it) * BLOCK_N
        tma.async_copy_global_to_shared(k_desc, [krow + n0, hk * D], ready, k_bufs.index(slot))
        tma.async_copy_global_to_shared(v_desc, [krow + n0, hk * D], ready, v_bufs.index(slot))


@gluon.jit
def _consumer(
    shared,
    WG: gl.constexpr,
    LIMIT_RIGHT: gl.constexpr,
    LIMIT_LEFT: gl.constexpr,
    SOFTCAP: gl.constexpr,
):
    """One warp group: dQ of query rows [m0 + WG * HALF_M, + HALF_M) over every key block."""
    bufs, Lse2, Delta, work, rows_info, qk_scale, scale, cap = shared
    q_smem, do_smem, k_bufs, v_bufs, bars = bufs
    STAGES: gl.constexpr = k_bufs.shape[0]
    BLOCK_N: gl.constexpr = k_bufs.shape[1]
    D: gl.constexpr = k_bufs.shape[2]
    HALF_M: gl.constexpr = q_smem.shape[0] // 2
    total, lo_n, qrow, krow, m0, h, hk = work
    q_len, k_len, off_hi, off_lo, t_base, stride_ts, dq_base, stride_dqs, q_start = rows_info
    cap_in, cap_out = cap
    s_layout: gl.constexpr = mma_layout(HALF_M, BLOCK_N)
    acc_layout: gl.constexpr = mma_layout(HALF_M, D)
    op_layout: gl.constexpr = operand_layout(HALF_M, D)
    dtype: gl.constexpr = q_smem.dtype
    offs_m = m0 + WG * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
    offs_n0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    in_seq = offs_m < q_len
    lse2 = gl.load(Lse2 + t_base + offs_m * stride_ts, mask=in_seq, other=float("inf"))
    delta = gl.load(Delta + t_base + offs_m * stride_ts, mask=in_seq, other=0.0)
    q_part = q_smem.slice(WG * HALF_M, HALF_M)
    do_part = do_smem.slice(WG * HALF_M, HALF_M)
    zero_s = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    dq = gl.zeros([HALF_M, D], gl.float32, acc_layout)
    mbarrier.wait(bars.index(2 * STAGES), 0)
    for it in range(total):
        slot = it % STAGES
        mbarrier.wait(bars.index(slot), (it // STAGES) & 1)  # K, V tiles landed
        k_tile = k_bufs.index(slot)
        s_tok = warpgroup_mma(q_part, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(
            do_part, v_bufs.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True
        )
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        if SOFTCAP:
            t = tanh_approx(s * cap_in)
            p = gl.exp2(t * cap_out - gl.expand_dims(lse2, 1))
        else:
            p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
        offs_n = gl.expand_dims((lo_n + it) * BLOCK_N + offs_n0, 0)
        keep = offs_n < k_len
        if LIMIT_RIGHT or LIMIT_LEFT:
            rows = gl.expand_dims(offs_m, 1)
            keep = keep & in_band(offs_n, rows, off_hi, off_lo, LIMIT_RIGHT, LIMIT_LEFT)
        p = gl.where(keep, p, 0.0)
        if SOFTCAP:  # dS = P tanh' (dP - delta)
            p = p * (1.0 - t * t)
        dp = warpgroup_mma_wait(0, deps=(dp_tok,))
        ds = p * (dp - gl.expand_dims(delta, 1))
        ds_op = gl.convert_layout(ds.to(dtype), op_layout)
        dq_tok = warpgroup_mma(ds_op, k_tile, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq_tok,))
        mbarrier.arrive(bars.index(STAGES + slot))  # this warp group is done with the slot

    store_rows(dq_base, dq * scale, m0 + WG * HALF_M, q_start, q_len, stride_dqs, HALF_M, D)


@gluon.jit(do_not_specialize=["seqlen_q", "seqlen_k", "heads", "group"])
def _attn_bwd_dq_sm90(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    DQ,
    Lse2,
    Delta,
    CU_Q,
    CU_K,
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
    D: gl.constexpr,
    LIMIT_RIGHT: gl.constexpr,
    LIMIT_LEFT: gl.constexpr,
    SOFTCAP: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    IS_VARLEN: gl.constexpr,
    HEAVY_FIRST: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 4, "the default partition is the 4-warp producer")
    if HEAVY_FIRST:  # grid (B*H, query blocks): the last blocks (most keys) start first
        bh = gl.program_id(0)
        pid_m = gl.num_programs(1) - 1 - gl.program_id(1)
    else:
        pid_m = gl.program_id(0)
        bh = gl.program_id(1)
    b = bh // heads
    h = bh % heads
    hk = h // group
    q_start, q_len, k_start, k_len, qrow, krow, off = sequence_rows(
        CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN, BOTTOM_RIGHT
    )
    m0 = pid_m * BLOCK_M
    if m0 < q_len:
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_desc.layout)
        do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], do_desc.layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
        # barriers: [0, S) K/V ready (TMA), [S, 2S) slot empty (one arrival per consumer
        # warp group), 2S: Q and dO ready
        bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES + 1, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
            mbarrier.init(bars.index(STAGES + i), count=2)
        mbarrier.init(bars.index(2 * STAGES), count=1)

        off_hi = off + win_right  # row i sees key j iff i + off_lo <= j <= i + off_hi
        off_lo = off - win_left
        if LIMIT_RIGHT:  # keys up to the last visible key of the block's last row
            hi = gl.minimum(k_len, m0 + BLOCK_M + off_hi)
        else:
            hi = k_len
        if LIMIT_LEFT:  # from the key block of the first row's first visible key
            lo_n = gl.minimum(gl.maximum(m0 + off_lo, 0), k_len) // BLOCK_N
            total = gl.maximum(gl.cdiv(gl.maximum(hi, 0), BLOCK_N) - lo_n, 0)
        else:
            lo_n = 0
            total = gl.cdiv(gl.maximum(hi, 0), BLOCK_N)
        work = (total, lo_n, qrow, krow, m0, h, hk)
        t_base = b.to(gl.int64) * stride_tb + h * stride_th + q_start * stride_ts
        dq_base = DQ + b.to(gl.int64) * stride_dqb + h * stride_dqh
        rows_info = (q_len, k_len, off_hi, off_lo, t_base, stride_ts, dq_base, stride_dqs, q_start)
        # the soft cap as tanh(s * scale / c) * c log2(e) (the scale is a per-call value)
        cap = (scale / softcap, softcap * 1.4426950408889634)
        # what both consumer warp groups read (their tile sizes come with the buffers' shapes)
        bufs = (q_smem, do_smem, k_bufs, v_bufs, bars)  # what the producer fills
        shared = (bufs, Lse2, Delta, work, rows_info, qk_scale, scale, cap)
        descs = (q_desc, k_desc, v_desc, do_desc)
        gl.warp_specialize(
            [
                (_producer, (descs, bufs, work, D, BLOCK_N, STAGES)),
                (_consumer, (shared, 0, LIMIT_RIGHT, LIMIT_LEFT, SOFTCAP)),
                (_consumer, (shared, 1, LIMIT_RIGHT, LIMIT_LEFT, SOFTCAP)),
            ],
            [4, 4],
            [CONSUMER_REGS, CONSUMER_REGS],
        )
