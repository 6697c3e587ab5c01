r"""Backward, key side, for Hopper (sm_90) in Gluon: dK and dV of one key block, GQA group walked.

The same math as :mod:`._bwd_dkdv` (split design, deterministic, no atomics). Triton's ``tl``
kernel at these tiles sits at the 255-register cap and spills (it keeps K and V in registers as
the left operands of ``K Q^T`` and ``V dO^T``), and its products and exponentials run one after
another in every warp. This kernel is warp specialised (``_sm90``):

* the producer (the launch's 4 warps) copies K and V once into shared memory, then streams each
  step's Q and dO tiles by TMA and its ``lse2`` / ``delta`` rows by loads (``+inf`` / ``0``
  past the sequence's end) through a ring of ``STAGES`` buffers, ahead of the consumers;
* two consumer warp groups each own ``BLOCK_N / 2`` key rows, keep only dK, dV (fp32) and the
  step's S^T / dP^T in registers (240 each), and per step issue ``S^T = K Q^T`` and
  ``dP^T = V dO^T`` together as asynchronous warp-group MMAs, form ``P^T`` while ``dP^T``
  computes, issue ``dV += P^T dO`` before forming ``dS^T``, then ``dK += dS^T Q``. Each
  warp group releases a buffer on its own, so the two drift apart and one's exponentials overlap
  the other's products.

With ``ATOMIC_DQ`` (``triton:fused_atomic``) the kernel also produces dQ, 5 tile products per step
instead of the split design's 7 over both kernels: each consumer warp group stores its dS^T rows
into a per-slot shared-memory tile and arrives on that slot's "dS stored" mbarrier. Once both
groups have, each multiplies dS (all ``BLOCK_N`` keys) by its half of K's columns and hands the
fp32 ``[BLOCK_M, D/2]`` tile to a TMA reduction into the zero-filled dQ scratch (unscaled; the
convert kernel scales and casts it). dK's left operand is dS^T from registers, as in the split
design: the kernel is bound by shared-memory bandwidth (the products' operands, the dS^T and dQ
tiles) more than by its tensor cores. A slot's dS^T tile is rewritten only after the producer
refilled the slot, i.e. after both groups released it, which they do after their dQ products. Keys
past the sequence's end get ``P = 0`` here, since their rows (the next sequence's) would otherwise
enter dQ. Ring of 2 only (3 would need 240 KB). With ``ADD_DKDV`` (a split GQA group, config
``SPLIT_ADD``, or the slices of ``TAIL_SLICES``) the slices add their dK / dV into one
zero-filled fp32 buffer by atomics instead of each storing its own partial; the launcher's sum
pass then only casts it.

The loop is flattened over (query head of the program's GQA slice, query block), so the prefetch
runs across head boundaries. ``GRID_LAYOUT`` (:class:`._launch_policy.GridLayout`, chosen by the
launch policy) says where a program finds its key block, kv head and slice: ``NATURAL``
``(key blocks, B * Hkv, slices)``; ``HEAVY_FIRST`` ``(slices, B * Hkv, key blocks)``, the first
key blocks (most query blocks under a causal mask) launched first; ``WINDOWED``
``(slices * WINDOW, key blocks, B * Hkv / WINDOW)``, the programs of ``WINDOW`` kv heads launched
together key block by key block, so that the last heads' heavy programs do not start last;
``UNITS`` ``(units, 1, slices)``, unit ``unit_offset + program`` being key block ``unit %
key_blocks`` of ``B * Hkv`` row ``unit // key_blocks``. With ``STEP_SLICES`` (``UNITS`` only) a
slice is an equal share of the group's steps rather than of its heads (``TAIL_SLICES``: the
units past the last whole wave, cut so that fewer SMs sit idle at the end). Inputs are
read through 2-D descriptors over ``[rows, heads * D]`` (``_sm90.sm90_descriptors``), so a tile
past a sequence's end reads the next sequence's finite rows or TMA's zeros; those queries get
``P = 0`` from their ``lse2``, and those keys' rows are never stored. Those rows still enter the
products multiplied by zero, so a NaN or Inf in the *next* sequence's Q or dO rows (dense batch
or varlen pack) reaches this sequence's dK / dV; the ``tl`` kernels' masked loads do not have
that (their TMA loads of varlen tiles do). Causal masks: query blocks that see none of the keys
are skipped, the others are masked element-wise.

Gluon has no CPU interpreter: this kernel is cross-compiled for sm_90 in CI and checked against
the float64 oracle on Hopper GPUs (``tests/test_triton_gluon.py``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._launch_policy import GridLayout
from ._sm90 import (
    CONSUMER_REGS,
    in_band,
    mma_layout,
    operand_layout,
    sequence_rows,
    store_rows,
    tanh_approx,
    tma_reduce_add,
)

# The grid layouts of :class:`._launch_policy.GridLayout` (the ``GRID_LAYOUT`` constexpr).
GRID_NATURAL = gl.constexpr(int(GridLayout.NATURAL))
GRID_HEAVY_FIRST = gl.constexpr(int(GridLayout.HEAVY_FIRST))
GRID_WINDOWED = gl.constexpr(int(GridLayout.WINDOWED))
GRID_UNITS = gl.constexpr(int(GridLayout.UNITS))


@gluon.jit
def _step_position(steps, it, BLOCK_M: gl.constexpr):
    """Query head and first query row of loop step ``it`` of this program (steps walk head by
    head); ``steps``: ``(first_step, total, nblk, lo_blk, head0)``."""
    first_step, _, nblk, lo_blk, head0 = steps
    step = first_step + it
    return head0 + step // nblk, (lo_blk + step % nblk) * BLOCK_M


@gluon.jit
def _tile_crosses_band(
    first, m0, off_hi, off_lo, HALF_N, BLOCK_M, LIMIT_RIGHT: gl.constexpr, LIMIT_LEFT: gl.constexpr
):
    """Whether some (key, row) pair of keys ``[first, first + HALF_N)`` and rows ``[m0, m0 +
    BLOCK_M)`` is outside the band (the tile needs a mask): a key past the first row's last
    visible key, or before the last row's first one."""
    if LIMIT_RIGHT:
        crosses = first + HALF_N - 1 > m0 + off_hi
        if LIMIT_LEFT:
            crosses = crosses | (first < m0 + BLOCK_M - 1 + off_lo)
    else:
        crosses = first < m0 + BLOCK_M - 1 + off_lo
    return crosses


@gluon.jit
def _wide_store_order(dq, BLOCK_M: gl.constexpr, W: gl.constexpr):
    """The ``[BLOCK_M, W]`` dQ accumulator with its columns in the scratch's order of
    ``WIDE_STORE`` (undone by ``_bwd_dq_convert.logical_columns``): a register relabelling, no
    data moves.

    In the accumulator a thread holds columns ``8j + 2q + t`` (``q`` its lane mod 4, ``t`` 0 / 1,
    ``j`` 0 ... W/8 - 1), so a plain store writes 8 bytes per thread, and in the 128-byte
    swizzled tile the 16 lanes of a half warp (4 rows, rows ``r`` and ``r ^ 1`` on the same
    swizzled 16-byte columns) collide: 4 wavefronts per store where 2 would do. Relabelled,
    column ``8j + 2q + t`` with ``j = 4b + 2k + e`` goes to ``32b + 8q + 4k + 2e + t``: each
    thread's 4 values of one ``(b, k)`` are adjacent (one 16-byte store), and the 8 lanes of a
    quarter warp (rows ``r``, ``r ^ 1``; ``q`` 0-3) cover all eight 16-byte columns."""
    x = gl.reshape(dq, [BLOCK_M, W // 32, 2, 2, 4, 2])  # (row, b, k, e, q, t)
    x = gl.permute(x, [0, 1, 4, 2, 3, 5])  # (row, b, q, k, e, t)
    return gl.reshape(x, [BLOCK_M, W])


@gluon.jit
def _producer(
    descs,
    ring,
    bars,
    Lse2,
    Delta,
    work,
    BLOCK_M: gl.constexpr,
    D: gl.constexpr,
    STAGES: gl.constexpr,
):
    """Fill the ring: K and V once, then per step the Q and dO tiles (TMA) and the step's
    lse2 / delta rows (loads, +inf / 0 past the sequence's end), STAGES steps ahead of the
    consumers."""
    q_desc, k_desc, v_desc, do_desc = descs
    k_smem, v_smem, q_bufs, do_bufs, lse_bufs, delta_bufs = ring
    steps, tiles, rows = work
    total = steps[1]
    qrow, krow, n0, hk = tiles
    t_base, stride_th, stride_ts, q_len = rows
    kv_bar = bars.index(3 * STAGES)
    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [krow + n0, hk * D], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [krow + n0, hk * D], kv_bar, v_smem)
    rows_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs_m0 = gl.arange(0, BLOCK_M, layout=rows_layout)
    for it in range(total):
        slot = it % STAGES
        phase = (it // STAGES) & 1
        ready = bars.index(slot)
        mbarrier.wait(bars.index(STAGES + slot), phase ^ 1)  # slot emptied by both consumers
        h, m0 = _step_position(steps, it, BLOCK_M)
        mbarrier.expect(ready, 2 * q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [qrow + m0, h * D], ready, q_bufs.index(slot))
        tma.async_copy_global_to_shared(do_desc, [qrow + m0, h * D], ready, do_bufs.index(slot))
        offs_m = m0 + offs_m0
        in_seq = offs_m < q_len
        t_rows = t_base + offs_m * stride_ts + h * stride_th
        lse_bufs.index(slot).store(gl.load(Lse2 + t_rows, mask=in_seq, other=float("inf")))
        delta_bufs.index(slot).store(gl.load(Delta + t_rows, mask=in_seq, other=0.0))
        mbarrier.arrive(bars.index(2 * STAGES + slot))


@gluon.jit
def _consumer(
    shared,
    WG: gl.constexpr,
    LIMIT_RIGHT: gl.constexpr,
    LIMIT_LEFT: gl.constexpr,
    SOFTCAP: gl.constexpr,
    ATOMIC_DQ: gl.constexpr,
    ADD_DKDV: gl.constexpr,
    WIDE_STORE: gl.constexpr,
):
    """One warp group: dK, dV of key rows [n0 + WG * HALF_N, + HALF_N) over every step."""
    ring, ds_smem, dq_smem, bars, work, out, dqa_desc, qk_scale, scale, cap = shared
    k_smem, v_smem, q_bufs, do_bufs, lse_bufs, delta_bufs = ring
    STAGES: gl.constexpr = q_bufs.shape[0]
    BLOCK_M: gl.constexpr = q_bufs.shape[1]
    D: gl.constexpr = q_bufs.shape[2]
    HALF_N: gl.constexpr = k_smem.shape[0] // 2
    steps, tiles, _ = work
    total = steps[1]
    qrow, _, n0, _ = tiles
    k_start, k_len, off_hi, off_lo, dk_base, dv_base, stride_dks, stride_dvs = out
    cap_in, cap_out = cap
    s_layout: gl.constexpr = mma_layout(HALF_N, BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(HALF_N, D)
    op_layout: gl.constexpr = operand_layout(HALF_N, D)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per query
    key_layout: gl.constexpr = gl.SliceLayout(1, s_layout)  # one value per key
    HALF_D: gl.constexpr = D // 2
    dq_layout: gl.constexpr = mma_layout(BLOCK_M, HALF_D)
    dtype: gl.constexpr = k_smem.dtype
    k_part = k_smem.slice(WG * HALF_N, HALF_N)
    v_part = v_smem.slice(WG * HALF_N, HALF_N)
    # The fused-atomic kernel with a causal mask sits at the register cap: query offsets kept
    # across the loop and ``delta`` waiting beside S^T and dP^T in flight spill, and the spills
    # go through the shared-memory pipe that bounds the kernel. So there (LATE_DELTA) the
    # offsets are made only where the diagonal crosses a tile and ``delta`` is read from shared
    # memory once dP^T is there. Without a mask the late read is slower, so that form stays.
    LATE_DELTA: gl.constexpr = ATOMIC_DQ and (LIMIT_RIGHT or LIMIT_LEFT)
    # With a soft cap, tanh waits for dP^T to form the cap's derivative. Kept in fp32 it spills
    # least, except in the windowed fused-atomic kernel, where fp16 ``1 - tanh^2`` (half the
    # registers; dS^T is rounded to 16 bits for its products anyway) measured faster
    # (docs/experiments.md).
    HALF_DERIVATIVE: gl.constexpr = SOFTCAP and ATOMIC_DQ and LIMIT_LEFT
    if not LATE_DELTA:
        offs_m0 = gl.arange(0, BLOCK_M, layout=row_layout)
    # (the two forms compile the same math to differently allocated registers: each kernel keeps
    # the one it was measured with, the split one's spilling less)
    if ATOMIC_DQ:
        first = n0 + WG * HALF_N  # this warp group's first key
        offs_n = first + gl.arange(0, HALF_N, layout=key_layout)
    else:
        offs_n = n0 + WG * HALF_N + gl.arange(0, HALF_N, layout=key_layout)
    zero_s = gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([HALF_N, D], gl.float32, acc_layout)
    dv = gl.zeros([HALF_N, D], gl.float32, acc_layout)
    mbarrier.wait(bars.index(3 * STAGES), 0)
    for it in range(total):
        slot = it % STAGES
        phase = (it // STAGES) & 1
        mbarrier.wait(bars.index(slot), phase)  # Q, dO tiles landed
        mbarrier.wait(bars.index(2 * STAGES + slot), phase)  # lse2, delta stored
        q_tile = q_bufs.index(slot)
        do_tile = do_bufs.index(slot)
        s_tok = warpgroup_mma(k_part, q_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(
            v_part, do_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True
        )
        lse2 = lse_bufs.index(slot).load(row_layout)
        if not LATE_DELTA:
            delta = delta_bufs.index(slot).load(row_layout)
        sT = warpgroup_mma_wait(1, deps=(s_tok,))
        if SOFTCAP:
            tT = tanh_approx(sT * cap_in)
            pT = gl.exp2(tT * cap_out - gl.expand_dims(lse2, 0))
            if HALF_DERIVATIVE:
                gT = (1.0 - tT * tT).to(gl.float16)
        else:
            pT = gl.exp2(sT * qk_scale - gl.expand_dims(lse2, 0))
        if LIMIT_RIGHT or LIMIT_LEFT:
            h, m0 = _step_position(steps, it, BLOCK_M)
            # The fused-atomic kernel masks only the tiles a band edge crosses (faster there);
            # the split one masks every step (its register budget: the branch made it spill more)
            if ATOMIC_DQ:
                crosses = _tile_crosses_band(
                    first, m0, off_hi, off_lo, HALF_N, BLOCK_M, LIMIT_RIGHT, LIMIT_LEFT
                )
            else:
                crosses = True
            if crosses:
                if LATE_DELTA:
                    offs_m0 = gl.arange(0, BLOCK_M, layout=row_layout)
                keep = in_band(
                    gl.expand_dims(offs_n, 1),
                    gl.expand_dims(m0 + offs_m0, 0),
                    off_hi,
                    off_lo,
                    LIMIT_RIGHT,
                    LIMIT_LEFT,
                )
                pT = gl.where(keep, pT, 0.0)
        if ATOMIC_DQ:
            if first + HALF_N > k_len:  # keys past the sequence's end must not enter dQ
                pT = gl.where(gl.expand_dims(offs_n < k_len, 1), pT, 0.0)
        pT_op = gl.convert_layout(pT.to(dtype), op_layout)
        dv_tok = warpgroup_mma(pT_op, do_tile, dv, is_async=True)
        if SOFTCAP:  # dS^T = P^T tanh' (dP^T - delta)
            if HALF_DERIVATIVE:
                pT = pT * gT.to(gl.float32)
            else:
                pT = pT * (1.0 - tT * tT)
        dpT = warpgroup_mma_wait(1, deps=(dp_tok,))
        if LATE_DELTA:
            delta = delta_bufs.index(slot).load(row_layout)
        dsT = pT * (dpT - gl.expand_dims(delta, 0))
        if ATOMIC_DQ:
            # dS^T of both warp groups goes to shared memory; once the other group's rows are
            # there too, this group adds dS K[:, its half of D] (unscaled) to the fp32 dQ
            # scratch by a TMA reduction.
            ds_all = ds_smem.index(slot)
            ds_part = ds_all.slice(WG * HALF_N, HALF_N)
            ds_part.store(dsT.to(dtype))
            fence_async_shared()
            mbarrier.arrive(bars.index(3 * STAGES + 1 + slot))
            # (dK's left operand from registers, not from the tile just stored: the kernel is
            # bound by shared-memory bandwidth more than by its tensor cores)
            dsT_op = gl.convert_layout(dsT.to(dtype), op_layout)
            dk_tok = warpgroup_mma(dsT_op, q_tile, dk, is_async=True)
            mbarrier.wait(bars.index(3 * STAGES + 1 + slot), phase)  # both halves of dS^T
            dq_tok = warpgroup_mma(
                ds_all.permute((1, 0)),
                k_smem.slice(WG * HALF_D, HALF_D, 1),
                gl.zeros([BLOCK_M, HALF_D], gl.float32, dq_layout),
                use_acc=False,
                is_async=True,
            )
            dv, dk, dq = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, dq_tok))
            # (the producer refills this slot, so the next step's dS^T overwrites this one's,
            # only after both groups arrive here: their dQ products are done)
            mbarrier.arrive(bars.index(STAGES + slot))
            h, m0 = _step_position(steps, it, BLOCK_M)
            dq_part = dq_smem.index(WG)
            tma.store_wait(0)  # the previous step's reduction has read dq_part
            if WIDE_STORE:
                dq_part.store(_wide_store_order(dq, BLOCK_M, HALF_D))
            else:
                dq_part.store(dq)
            fence_async_shared()
            tma_reduce_add(dqa_desc, [qrow + m0, h * D + WG * HALF_D], dq_part)
        else:
            dsT_op = gl.convert_layout(dsT.to(dtype), op_layout)
            dk_tok = warpgroup_mma(dsT_op, q_tile, dk, is_async=True)
            dv, dk = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok))
            mbarrier.arrive(bars.index(STAGES + slot))  # this warp group is done with the slot

    if ATOMIC_DQ:
        tma.store_wait(0)
    else:
        first = n0 + WG * HALF_N
    store_rows(dk_base, dk * scale, first, k_start, k_len, stride_dks, HALF_N, D, ADD_DKDV)
    store_rows(dv_base, dv, first, k_start, k_len, stride_dvs, HALF_N, D, ADD_DKDV)


@gluon.jit(
    do_not_specialize=["seqlen_q", "seqlen_k", "kv_heads", "group", "unit_offset", "key_blocks"]
)
def _attn_bwd_dkdv_sm90(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    dqa_desc,
    DK,
    DV_,
    Lse2,
    Delta,
    CU_Q,
    CU_K,
    stride_dkb,
    stride_dks,
    stride_dkh,
    stride_dvb,
    stride_dvs,
    stride_dvh,
    stride_tb,
    stride_th,
    stride_ts,
    stride_dk_split,
    stride_dv_split,
    seqlen_q,
    seqlen_k,
    kv_heads,
    group,
    unit_offset,
    key_blocks,
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
    GRID_LAYOUT: gl.constexpr,
    WINDOW: gl.constexpr,
    ATOMIC_DQ: gl.constexpr,
    ADD_DKDV: gl.constexpr,
    STEP_SLICES: gl.constexpr,
    WIDE_STORE: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 4, "the default partition is the 4-warp producer")
    gl.static_assert(
        (GRID_LAYOUT == GRID_WINDOWED) == (WINDOW > 0),
        "WINDOW is the window of the WINDOWED grid layout",
    )
    gl.static_assert(
        not STEP_SLICES or GRID_LAYOUT == GRID_UNITS,
        "STEP_SLICES reads its slices off the UNITS grid",
    )
    if GRID_LAYOUT == GRID_WINDOWED:  # grid (splits * WINDOW, key blocks, B * Hkv / WINDOW)
        n_splits = gl.num_programs(0) // WINDOW
        split = gl.program_id(0) % n_splits
        bh = gl.program_id(2) * WINDOW + gl.program_id(0) // n_splits
        pid_n = gl.program_id(1)
        heads_per_split = group // n_splits
    elif GRID_LAYOUT == GRID_HEAVY_FIRST:  # grid (splits, B * Hkv, key blocks)
        split = gl.program_id(0)
        bh = gl.program_id(1)
        pid_n = gl.program_id(2)
        heads_per_split = group // gl.num_programs(0)
    elif GRID_LAYOUT == GRID_UNITS:  # grid (units, 1, splits), key blocks fastest in a unit
        unit = unit_offset + gl.program_id(0)
        pid_n = unit % key_blocks
        bh = unit // key_blocks
        split = gl.program_id(2)
        heads_per_split = group // gl.num_programs(2)
    else:  # GRID_NATURAL: grid (key blocks, B * Hkv, splits)
        pid_n = gl.program_id(0)
        bh = gl.program_id(1)
        split = gl.program_id(2)
        heads_per_split = group // gl.num_programs(2)
    b = bh // kv_heads
    hk = bh % kv_heads
    q_start, q_len, k_start, k_len, qrow, krow, off = sequence_rows(
        CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN, BOTTOM_RIGHT
    )
    off_hi = off + win_right  # row i sees key j iff i + off_lo <= j <= i + off_hi
    off_lo = off - win_left
    n0 = pid_n * BLOCK_N
    if n0 < k_len:
        dtype: gl.constexpr = q_desc.dtype
        k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, D], v_desc.layout)
        q_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], q_desc.layout)
        do_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, D], do_desc.layout)
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vec_layout)
        delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], vec_layout)
        # barriers: [0, S) tiles ready (TMA), [S, 2S) slot empty (one arrival per consumer
        # warp group), [2S, 3S) lse2 / delta stored, 3S: K and V ready
        # (ATOMIC_DQ: [3S + 1, 4S + 1) both warp groups' dS^T stored)
        N_BARS: gl.constexpr = 4 * STAGES + 1 if ATOMIC_DQ else 3 * STAGES + 1
        bars = gl.allocate_shared_memory(gl.int64, [N_BARS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
            mbarrier.init(bars.index(STAGES + i), count=2)
            mbarrier.init(bars.index(2 * STAGES + i), count=1)
            if ATOMIC_DQ:
                mbarrier.init(bars.index(3 * STAGES + 1 + i), count=2)
        mbarrier.init(bars.index(3 * STAGES), count=1)

        # Query blocks that see these keys: [lo_blk, lo_blk + nblk) of each head of the slice
        if LIMIT_RIGHT:
            lo_blk = gl.minimum(gl.maximum(n0 - off_hi, 0), q_len) // BLOCK_M
        else:
            lo_blk = 0
        if LIMIT_LEFT:  # rows past n0 + BLOCK_N - 1 - off_lo see none of these keys
            hi_blk = gl.cdiv(gl.minimum(gl.maximum(n0 + BLOCK_N - off_lo, 0), q_len), BLOCK_M)
            nblk = gl.maximum(hi_blk - lo_blk, 0)
        else:
            nblk = gl.cdiv(q_len, BLOCK_M) - lo_blk
        if STEP_SLICES:  # slice: an equal share of the group's (head, query block) steps
            n_splits = gl.num_programs(2)
            head0 = hk * group
            first_step = split * (nblk * group) // n_splits
            total = (split + 1) * (nblk * group) // n_splits - first_step
        else:  # slice: heads_per_split heads, each over all its query blocks
            head0 = hk * group + split * heads_per_split
            first_step = 0
            total = nblk * heads_per_split
        t_base = b * stride_tb + q_start * stride_ts
        # the loop's steps, where the tiles come from, where the lse2 / delta rows come from
        work = (
            (first_step, total, nblk, lo_blk, head0),
            (qrow, krow, n0, hk),
            (t_base, stride_th, stride_ts, q_len),
        )
        dk_base = (
            DK
            + split.to(gl.int64) * stride_dk_split
            + b.to(gl.int64) * stride_dkb
            + hk * stride_dkh
        )
        dv_base = (
            DV_
            + split.to(gl.int64) * stride_dv_split
            + b.to(gl.int64) * stride_dvb
            + hk * stride_dvh
        )
        out = (k_start, k_len, off_hi, off_lo, dk_base, dv_base, stride_dks, stride_dvs)
        if ATOMIC_DQ:  # per ring slot, dS^T of the program's keys (both warp groups)
            ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for(
                [BLOCK_N, BLOCK_M], dtype
            )
            ds_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, BLOCK_M], ds_layout)
            # each warp group's dQ tile on its way to the TMA reduction
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, D // 2], dqa_desc.layout)
        else:
            ds_smem = q_bufs  # unused
            dq_smem = q_bufs
        # the soft cap as tanh(s * scale / c) * c log2(e) (the scale is a per-call value)
        cap = (scale / softcap, softcap * 1.4426950408889634)
        # what both consumer warp groups read (their tile sizes come with the buffers' shapes)
        ring = (k_smem, v_smem, q_bufs, do_bufs, lse_bufs, delta_bufs)  # what the producer fills
        shared = (ring, ds_smem, dq_smem, bars, work, out, dqa_desc, qk_scale, scale, cap)
        descs = (q_desc, k_desc, v_desc, do_desc)
        gl.warp_specialize(
            [
                (_producer, (descs, ring, bars, Lse2, Delta, work, BLOCK_M, D, STAGES)),
                (
                    _consumer,
                    (shared, 0, LIMIT_RIGHT, LIMIT_LEFT, SOFTCAP, ATOMIC_DQ, ADD_DKDV, WIDE_STORE),
                ),
                (
                    _consumer,
                    (shared, 1, LIMIT_RIGHT, LIMIT_LEFT, SOFTCAP, ATOMIC_DQ, ADD_DKDV, WIDE_STORE),
                ),
            ],
            [4, 4],
            [CONSUMER_REGS, CONSUMER_REGS],
        )
