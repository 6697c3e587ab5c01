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
def query_program(heads, group, HEAVY_FIRST: tl.constexpr):
    """``(pid_m, b, h, hk)`` of a program that owns one query block of one head: its block,
    sequence, query head and kv head. The grid is ``(query blocks, B*H)``, or with
    ``HEAVY_FIRST`` ``(B*H, query blocks)`` walked from the last block: the GPU starts
    programs in launch order, so under a causal mask the blocks that see the most keys go
    first and the light ones fill the tail."""
    if HEAVY_FIRST:
        bh = tl.program_id(0)
        pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
    b = bh // heads
    h = bh % heads
    return pid_m, b, h, h // group


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
def load_head_rows(X, b64, row0, h, strides, offs_m, n_rows, offs_d, D, BLOCK_D: tl.constexpr):
    """The tile of :func:`head_rows` (``strides``: ``(b, s, h)``), rows past ``n_rows`` and
    columns past ``D`` read as zero."""
    stride_b, stride_s, stride_h = strides
    return load_tile(
        head_rows(X, b64, row0, h, stride_b, stride_s, stride_h, offs_m, offs_d),
        offs_m,
        n_rows,
        offs_d,
        D,
        True,
        BLOCK_D != D,
    )


@triton.jit
def store_head_rows(X, x, b64, row0, h, strides, offs_m, n_rows, offs_d, D, BLOCK_D: tl.constexpr):
    """Store ``x``, cast to ``X``'s element type, into the tile of :func:`head_rows`
    (``strides``: ``(b, s, h)``), rows below ``n_rows`` and columns below ``D`` only. (The cast
    comes after the addresses, as the kernels had it written out: the same instruction order.)"""
    stride_b, stride_s, stride_h = strides
    store_tile(
        head_rows(X, b64, row0, h, stride_b, stride_s, stride_h, offs_m, offs_d),
        x.to(X.dtype.element_ty),
        offs_m,
        n_rows,
        offs_d,
        D,
        BLOCK_D != D,
    )


@triton.jit
def query_block(CU_Q, seqlen_q, heads, IS_VARLEN: tl.constexpr, BLOCK_M: tl.constexpr):
    """The rows of a per-row kernel's program, launched on the grid ``(query blocks, B*H)``:
    ``(b64, row0, h, q_len, offs_m)``, ``row0`` the sequence's first token row (int64) and
    ``offs_m`` the block's row offsets in it. The block is empty when ``offs_m[0] >= q_len``
    (a varlen sequence shorter than the longest), and the caller then returns."""
    bh = tl.program_id(1)
    b = bh // heads
    q_start, q_len, _, _ = seq_bounds(CU_Q, CU_Q, b, seqlen_q, seqlen_q, IS_VARLEN)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    return b.to(tl.int64), q_start.to(tl.int64), bh % heads, q_len, offs_m


@triton.jit
def row_delta(
    Out, DO, b64, row0, h, o_strides, do_strides, offs_m, q_len, DV, BLOCK_DV: tl.constexpr
):
    """``rowsum(dO * O)`` in fp32 over the rows ``offs_m`` of one (sequence, head)."""
    offs_dv = tl.arange(0, BLOCK_DV)
    o = load_head_rows(Out, b64, row0, h, o_strides, offs_m, q_len, offs_dv, DV, BLOCK_DV)
    do = load_head_rows(DO, b64, row0, h, do_strides, offs_m, q_len, offs_dv, DV, BLOCK_DV)
    return tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)


@triton.jit
def row_delta_lse(
    Out,
    DO,
    Lse,
    b64,
    row0,
    h,
    o_strides,
    do_strides,
    lse_strides,
    offs_m,
    q_len,
    lse_other,
    DV,
    BLOCK_DV: tl.constexpr,
):
    """``(delta, lse)`` of the rows ``offs_m`` of one (sequence, head): :func:`row_delta` and
    the forward's lse (``lse_strides``: ``(b, h, s)``; ``lse_other`` past ``q_len``)."""
    delta = row_delta(Out, DO, b64, row0, h, o_strides, do_strides, offs_m, q_len, DV, BLOCK_DV)
    stride_lb, stride_lh, stride_ls = lse_strides
    lse = tl.load(
        Lse + b64 * stride_lb + row0 * stride_ls + h * stride_lh + offs_m * stride_ls,
        mask=offs_m < q_len,
        other=lse_other,
    )
    return delta, lse


@triton.jit
def causal_offset(q_len, k_len, BOTTOM_RIGHT: tl.constexpr):
    """Row ``i`` sees key ``j`` iff ``j <= i + offset``."""
    if BOTTOM_RIGHT:
        off = k_len - q_len
    else:
        off = q_len * 0
    return off


@triton.jit
def band_offsets(q_len, k_len, win_left, win_right, BOTTOM_RIGHT: tl.constexpr):
    """``(lo_off, hi_off)``: row ``i`` sees key ``j`` iff ``i + lo_off <= j <= i + hi_off`` (each
    side applies only where the kernel's ``LIMIT_LEFT`` / ``LIMIT_RIGHT`` says it is bounded)."""
    off = causal_offset(q_len, k_len, BOTTOM_RIGHT)
    return off - win_left, off + win_right


@triton.jit
def band_keep(
    keep, rows, cols, lo_off, hi_off, LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr
):
    """``keep`` and (key ``cols`` within the band of query ``rows``); broadcast shapes."""
    if LIMIT_RIGHT:
        keep = keep & (cols <= rows + hi_off)
    if LIMIT_LEFT:
        keep = keep & (cols >= rows + lo_off)
    return keep


@triton.jit
def band_where(
    x, other, keep, rows, cols, band, LIMIT_LEFT: tl.constexpr, LIMIT_RIGHT: tl.constexpr
):
    """``x`` where ``keep`` and key ``cols`` lie in the band ``(lo_off, hi_off)`` of query
    ``rows``, else ``other``; broadcast shapes."""
    lo_off, hi_off = band
    keep = band_keep(keep, rows, cols, lo_off, hi_off, LIMIT_LEFT, LIMIT_RIGHT)
    return tl.where(keep, x, other)


@triton.jit
def key_block_ranges(
    m0,
    q_len,
    k_len,
    lo_off,
    hi_off,
    LIMIT_LEFT: tl.constexpr,
    LIMIT_RIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Keys query rows ``[m0, m0 + BLOCK_M)`` walk: ``(lo, full_lo, full_hi, hi)``.

    ``[lo, full_lo)`` and ``[full_hi, hi)`` need masks (band edges, the partial last block);
    ``[full_lo, full_hi)`` holds whole key blocks every row sees entirely, walked without one.
    Blocks outside ``[lo, hi)`` are never visited, and each block inside holds a key some row
    below ``q_len`` sees (the rows' bands are contiguous and overlap). ``lo`` and ``full_lo``
    are multiples of ``BLOCK_N`` (or ``hi``), ``lo <= full_lo <= full_hi <= hi``.
    """
    if LIMIT_RIGHT:
        m_end = tl.minimum(m0 + BLOCK_M, q_len)
        hi = tl.minimum(tl.maximum(m_end + hi_off, 0), k_len)
        full_hi = tl.minimum(tl.maximum(m0 + hi_off + 1, 0), k_len) // BLOCK_N * BLOCK_N
    else:
        hi = k_len
        full_hi = k_len // BLOCK_N * BLOCK_N
    if LIMIT_LEFT:
        start = tl.maximum(m0 + lo_off, 0)  # the first key row m0 sees
        lo = tl.where(start < hi, start // BLOCK_N * BLOCK_N, hi)
        first_full = tl.maximum(m0 + BLOCK_M - 1 + lo_off, 0) + BLOCK_N - 1
        full_lo = tl.minimum(tl.maximum(first_full // BLOCK_N * BLOCK_N, lo), hi)
    else:
        lo = k_len * 0
        full_lo = lo
    return lo, full_lo, tl.maximum(full_hi, full_lo), hi


@triton.jit
def query_block_ranges(
    n0,
    q_len,
    k_len,
    lo_off,
    hi_off,
    LIMIT_LEFT: tl.constexpr,
    LIMIT_RIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Query rows that see keys ``[n0, n0 + BLOCK_N)``: ``(lo, full_lo, full_hi, hi)`` as in
    :func:`key_block_ranges` with the roles swapped (row ``i`` sees key ``j`` iff
    ``j - hi_off <= i <= j - lo_off``, so the keys' band has the sides negated and exchanged);
    ``[full_lo, full_hi)`` holds whole query blocks that see every key of the block. Keys past
    ``k_len`` widen no range."""
    return key_block_ranges(
        n0, k_len, q_len, -hi_off, -lo_off, LIMIT_RIGHT, LIMIT_LEFT, BLOCK_N, BLOCK_M
    )


# ``SOFTCAP`` constexpr of the kernels: how (and whether) scores are capped. NVIDIA GPUs take
# one hardware ``tanh.approx.f32`` per score (max relative error 2^-11, below the 16-bit inputs'
# rounding); elsewhere (AMD, the interpreter) ``tanh`` is built from ``exp2`` and a division,
# which costs two special-function operations per score instead of one.
SOFTCAP_NONE, SOFTCAP_EXP2, SOFTCAP_TANH_APPROX = 0, 1, 2


def softcap_mode(softcap: float | None, device: torch.device) -> int:
    """The ``SOFTCAP`` constexpr for a cap on tensors of ``device``."""
    if softcap is None:
        return SOFTCAP_NONE
    if device.type == "cuda" and torch.version.hip is None:
        return SOFTCAP_TANH_APPROX
    return SOFTCAP_EXP2


@triton.jit
def soft_cap_tanh(x, cap_in, SOFTCAP: tl.constexpr):
    """``tanh(x * cap_in)``: the hardware instruction with ``SOFTCAP_TANH_APPROX``, else
    ``2 / (1 + e^(-2y)) - 1`` from one ``exp2`` and one division (saturates to +-1 without
    overflow)."""
    if SOFTCAP == 2:  # SOFTCAP_TANH_APPROX
        t = tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [x * cap_in], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        t = 2.0 / (1.0 + tl.math.exp2(x * (cap_in * -2.8853900817779268))) - 1.0
    return t


@triton.jit
def log2_scores(s, qk_scale, cap, SOFTCAP: tl.constexpr):
    """Raw scores ``s = q . k`` in the log2 domain, ``(scores, t)``: ``s * qk_scale``, or with
    ``SOFTCAP`` ``t * cap_out`` where ``t = tanh(s * cap_in)`` (the backward needs ``t`` for the
    cap's derivative; without the cap ``t`` is ``s``, unused). ``cap``: ``(cap_in, cap_out)``."""
    cap_in, cap_out = cap
    if SOFTCAP:
        t = soft_cap_tanh(s, cap_in, SOFTCAP)
        x = t * cap_out
    else:
        t = s
        x = s * qk_scale
    return x, t


@triton.jit
def backward_cap(qk_scale, scale, softcap, SOFTCAP: tl.constexpr):
    """``(cap_in, cap_out)`` of :func:`log2_scores` for the backward kernels: ``tanh`` of
    ``s * scale / c``, times ``c log2(e)``."""
    if SOFTCAP:
        cap = (scale / softcap, softcap * 1.4426950408889634)
    else:
        cap = (qk_scale, qk_scale)
    return cap


@triton.jit
def score_grad(p, dp, delta, t, SOFTCAP: tl.constexpr):
    """``dS = P * (dP - delta)`` (``delta`` broadcast), times the cap's derivative
    ``d(c tanh(s / c)) / ds = 1 - tanh^2`` with ``SOFTCAP``."""
    ds = p * (dp - delta)
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    return ds


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
def load_strided_tile(
    base, stride, rows, n_rows, cols, n_cols, CHECK_ROWS: tl.constexpr, BLOCK_COLS
):
    """:func:`load_tile` of rows ``rows`` (``stride`` apart) and columns ``cols`` (``BLOCK_COLS``
    of them, the first ``n_cols`` real) at ``base``; columns are checked only when padded."""
    return load_tile(
        base + rows[:, None] * stride + cols[None, :],
        rows,
        n_rows,
        cols,
        n_cols,
        CHECK_ROWS,
        BLOCK_COLS != n_cols,
    )


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


def gradient_buffers(q, k, v, grads: tuple) -> tuple:
    """``grads`` (dq, dk, dv), each ``None`` replaced by a fresh tensor laid out like its input
    (q, k or v): what a call records and what its replays allocate are the same."""
    return tuple(torch.empty_like(x) if g is None else g for x, g in zip((q, k, v), grads))


def dense(x: torch.Tensor) -> bool:
    """Whether ``x``'s elements fill its memory span exactly, in any order of its dims (a
    contiguous tensor, or a transposed view of one such as [B, S, H, D] views of [B, H, S, D]
    memory): a flat buffer of ``x.numel()`` elements then holds one element per element of
    ``x`` when viewed with ``x``'s strides."""
    expected = 1
    for stride, size in sorted((st, n) for st, n in zip(x.stride(), x.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def kernel_operands(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(q, k, v, ...)`` as the kernels read them: each with a contiguous last dim and, where
    D and Dv pad to different tile widths (D = 64 with Dv = 32), each with 16-byte aligned rows.

    triton 3.6 miscompiles the mixed-width kernels on sm_90 when the value rows are not 16-byte
    aligned (a sliced ``[..., :32]`` view): the P @ V product's operand is read out of bounds
    of shared memory, giving wrong outputs and illegal memory accesses. Such calls are rare, so
    their tensors are copied into aligned storage rather than served by other kernels."""
    d, dv = tensors[0].shape[-1], tensors[2].shape[-1]
    if d == dv or padded_dim(d) == padded_dim(dv):
        return tuple([last_dim_contiguous(t) for t in tensors])
    return tuple(aligned_rows(t) for t in tensors)


def aligned_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` when its pointer is 16-byte aligned and every stride but the last (of a dim longer
    than 1) is a multiple of 16 elements (triton specializes on both: it then loads whole
    rows in vectors), else a copy stored so (the last dim padded to a multiple of 16)."""
    strides = x.stride()
    if (
        strides[-1] == 1
        and x.data_ptr() % 16 == 0
        and all(s % 16 == 0 for s, n in zip(strides[:-1], x.shape[:-1]) if n > 1)
    ):
        return x
    width = x.shape[-1]
    storage = x.new_empty((*x.shape[:-1], -(-width // 16) * 16))
    return storage[..., :width].copy_(x)


def dense_vector(x: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` when ``None`` or contiguous, else a contiguous copy: the kernels index sinks and
    cu_seqlens as ``X + i`` (a strided view of them is valid input, and they are tiny)."""
    return x if x is None or x.is_contiguous() else x.contiguous()


def padded_dim(d: int) -> int:
    """Head dim rounded up to a power of two (at least 16, the smallest MMA K)."""
    return max(16, triton.next_power_of_2(d))
