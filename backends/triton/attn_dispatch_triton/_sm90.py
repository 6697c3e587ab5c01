"""Shared pieces of the Gluon sm_90 kernels (``_bwd_dkdv_sm90``, ``_bwd_dq_sm90``).

Both are warp specialised the same way: the launch's 4 warps are a producer (TMA copies into a
ring of shared-memory buffers, one mbarrier per buffer for "filled" and one for "emptied"), and
two 4-warp consumer groups each own half of the program's rows and run the tile products as
asynchronous warp-group MMAs. 12 warps x ``MAXNREG`` registers fill the register file; the
kernel then moves registers from the producer to the consumers (``CONSUMER_REGS`` each).
"""

from __future__ import annotations

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin

from ._tma_rows import rows_view

WARPS = 4  # the launch's num_warps: the producer partition
MAXNREG = 168  # 12 warps x 168 registers x 32 lanes = the 64K-register file
CONSUMER_REGS = gl.constexpr(240)  # the producer partition drops to 24 (setmaxnreg.dec)


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``tensor_desc[coord] += src`` (a shared-memory tile) by a TMA reduction
    (``cp.reduce.async.bulk.tensor ... .add``), issued like
    ``tma.async_copy_shared_to_global`` and waited for with ``tma.store_wait``. Triton 3.6's
    Gluon builds the op but does not export a function for it (hence the builder call; the
    kernels run only on the triton versions they were checked with, ``GLUON_TRITON``)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(
        ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
    )


@gluon.jit
def sequence_rows(
    CU_Q, CU_K, b, seqlen_q, seqlen_k, IS_VARLEN: gl.constexpr, BOTTOM_RIGHT: gl.constexpr
):
    """Start, length and first descriptor row of sequence ``b``'s queries and keys
    (descriptors are ``[tokens, heads * D]``: dense batches are ``seqlen`` rows apart), and the
    causal offset: query row ``i`` sees key ``j`` iff ``j <= i + off``."""
    if IS_VARLEN:
        q_start = gl.load(CU_Q + b)
        q_len = gl.load(CU_Q + b + 1) - q_start
        k_start = gl.load(CU_K + b)
        k_len = gl.load(CU_K + b + 1) - k_start
        qrow = q_start
        krow = k_start
    else:
        q_start = 0
        q_len = seqlen_q
        k_start = 0
        k_len = seqlen_k
        qrow = b * seqlen_q
        krow = b * seqlen_k
    if BOTTOM_RIGHT:
        off = k_len - q_len
    else:
        off = 0
    return q_start, q_len, k_start, k_len, qrow, krow, off


@gluon.jit
def in_band(keys, rows, off_hi, off_lo, LIMIT_RIGHT: gl.constexpr, LIMIT_LEFT: gl.constexpr):
    """Whether row ``rows`` sees key ``keys`` (broadcast against each other): ``rows + off_lo
    <= keys <= rows + off_hi``, a side checked only when it is bounded (at least one is)."""
    if LIMIT_RIGHT:
        keep = keys <= rows + off_hi
        if LIMIT_LEFT:
            keep = keep & (keys >= rows + off_lo)
    else:
        keep = keys >= rows + off_lo
    return keep


@gluon.jit
def tanh_approx(x):
    """``tanh(x)`` by the hardware instruction (max relative error 2^-11, under the 16-bit
    inputs' rounding): one special-function operation where ``exp2`` and a division take two."""
    return gl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1
    )


@gluon.constexpr_function
def mma_layout(rows, cols):
    """The accumulator layout of one consumer warp group's ``[rows, cols]`` product."""
    return gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, cols, 16]
    )


@gluon.constexpr_function
def operand_layout(rows, d):
    """A register left operand (``P`` / ``dS``) of a product into a ``[rows, d]`` accumulator."""
    return gl.DotOperandLayout(operand_index=0, parent=mma_layout(rows, d), k_width=2)


@gluon.jit
def store_rows(
    base,
    x,
    first,
    start,
    n_valid,
    stride_row,
    ROWS: gl.constexpr,
    D: gl.constexpr,
    ADD: gl.constexpr = False,
):
    """Store the fp32 ``[ROWS, D]`` accumulator ``x`` (``mma_layout``) as ``base``'s element
    type: tile row ``i`` is row ``first + i`` of a sequence starting at row ``start``, stored
    when ``first + i < n_valid``. With ``ADD`` (an fp32 ``base``) it is added by atomics."""
    layout: gl.constexpr = mma_layout(ROWS, D)
    rows = first + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    ok = gl.expand_dims(rows < n_valid, 1) & gl.expand_dims(cols < D, 0)
    ptrs = (
        base + gl.expand_dims((start + rows).to(gl.int64), 1) * stride_row + gl.expand_dims(cols, 0)
    )
    if ADD:
        gl.atomic_add(ptrs, x, mask=ok, sem="relaxed")
    else:
        gl.store(ptrs, x.to(base.dtype.element_ty), mask=ok)


_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}


def rows_descriptor(t: torch.Tensor, varlen: bool, block: list[int]):
    """A TMA descriptor over ``t`` (``[B, S, H, D]`` or varlen ``[T, H, D]``) read as
    ``[rows, heads * D]`` with ``block`` tiles, or ``None`` when it cannot be read that way
    (:func:`._tma_rows.rows_view`) or has another dtype than bf16 / f16 / fp32."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    view = rows_view(t, varlen)
    if view is None or t.dtype not in _GL_DTYPES:
        return None
    rows, stride = view
    heads, d = t.shape[-2], t.shape[-1]
    layout = gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[t.dtype])
    return TensorDescriptor(t, [rows, heads * d], [stride, 1], block, layout)


def sm90_descriptors(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    varlen: bool,
    block_m: int,
    block_n: int,
) -> tuple | None:
    """The kernels' four TMA descriptors (Q, K, V, dO with ``[block, D]`` tiles), or ``None``
    when a tensor cannot be read as rows or the inputs are not 16-bit (the kernels' shared
    memory is planned for bf16 / f16 tiles)."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        return None
    descs = tuple(
        rows_descriptor(t, varlen, [block, t.shape[-1]])
        for t, block in ((q, block_m), (k, block_n), (v, block_n), (grad_out, block_m))
    )
    return None if any(d is None for d in descs) else descs


def dq_scratch_descriptor(acc: torch.Tensor, varlen: bool):
    """TMA descriptor of the fp32 dQ scratch (contiguous, shaped like Q) with the
    ``[64, D / 2]`` tiles one consumer warp group of the dK/dV kernel reduces into."""
    return rows_descriptor(acc, varlen, [64, acc.shape[-1] // 2])
