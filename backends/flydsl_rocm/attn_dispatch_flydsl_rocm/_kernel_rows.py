"""Row-wise kernels around the main kernel: the D preprocess and the dQ convert.

Both map one block of 256 threads onto ``rows_per_block`` query rows of one head, ``D // 8``
lanes per row, each lane moving 8 elements with 128-bit accesses.

- preprocess: ``D[b, h, i] = Σ_d dO[b, i, h, d] · O[b, i, h, d]`` (f32), and zeroes the f32
  dQ accumulator rows it covers, so the backward needs no separate memset.
- convert: ``dq = (dQacc · scale).to(q.dtype)``.
Rows past the sequence fall outside the buffer resources: loads read 0, stores are dropped.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr

from . import _prims as P
from ._tiles import rows_per_block


def _row_setup(varlen, CuQ, b, seqlen_q):
    if const_expr(varlen):
        rc = P.buffer_rsrc(CuQ, fx.Int64(0), fx.Int64(1 << 20), 4)
        i32 = P.i32_t()
        qs = fx.Int32(P.gload(i32, rc, b * 4))
        sq = fx.Int32(P.gload(i32, rc, b * 4 + 4)) - qs
    else:
        qs = fx.Int32(0)
        sq = seqlen_q
    return qs, sq


def build_preprocess(dtype: str, head_dim: int, varlen: bool):
    """Launcher of the D = rowsum(dO ∘ O) kernel (also zeroes dQacc)."""
    D = head_dim
    LPR = D // 8  # lanes per row
    RPB = rows_per_block(D)
    EB = 2

    @flyc.kernel(known_block_size=[256, 1, 1])
    def fmha_bwd_preprocess(
        Out: fx.Tensor,
        dO: fx.Tensor,
        Dvec: fx.Tensor,
        dQacc: fx.Tensor,
        CuQ: fx.Tensor,
        seqlen_q: fx.Int32,
        heads: fx.Int32,
        o_sr: fx.Int32,
        o_sh: fx.Int32,
        o_sb: fx.Int32,
        g_sr: fx.Int32,
        g_sh: fx.Int32,
        g_sb: fx.Int32,
        l_sh: fx.Int32,
        l_sb: fx.Int32,
    ):
        et = P.elem_t(dtype)
        f32 = P.f32_t()
        tid = fx.thread_idx.x
        blk = fx.block_idx.x
        h = fx.block_idx.y
        b = fx.block_idx.z
        qs, sq = _row_setup(varlen, CuQ, b, seqlen_q)
        bo = fx.Int64(0) if varlen else fx.Int64(b) * fx.Int64(o_sb)
        bg = fx.Int64(0) if varlen else fx.Int64(b) * fx.Int64(g_sb)
        bl = fx.Int64(qs) if varlen else fx.Int64(b) * fx.Int64(l_sb)
        bq = fx.Int64(0) if varlen else fx.Int64(b) * fx.Int64(seqlen_q) * fx.Int64(heads * D)
        ro = P.buffer_rsrc(
            Out, bo + fx.Int64(qs) * fx.Int64(o_sr) + fx.Int64(h * o_sh), sq * o_sr - h * o_sh, EB
        )
        rg = P.buffer_rsrc(
            dO, bg + fx.Int64(qs) * fx.Int64(g_sr) + fx.Int64(h * g_sh), sq * g_sr - h * g_sh, EB
        )
        rl = P.buffer_rsrc(Dvec, bl + fx.Int64(h) * fx.Int64(l_sh), sq, 4)
        rq = P.buffer_rsrc(
            dQacc,
            bq + fx.Int64(qs) * fx.Int64(heads * D) + fx.Int64(h * D),
            sq * heads * D - h * D,
            4,
        )
        row = blk * RPB + tid // LPR
        c8 = (tid % LPR) * 8
        o = P.gload(P.vec_t(8, et), ro, (row * o_sr + c8) * EB)
        g = P.gload(P.vec_t(8, et), rg, (row * g_sr + c8) * EB)
        prod = P.mulf(P.extf(P.vec_t(8, f32), o), P.extf(P.vec_t(8, f32), g))
        acc = fx.Float32(P.extract(prod, 0))
        for i in range_constexpr(1, 8):
            acc = acc + fx.Float32(P.extract(prod, i))
        width = 1
        while width < LPR:
            acc = acc + fx.Float32(fx.gpu.shuffle_xor(acc, width, 64))
            width *= 2
        if tid % LPR == 0:
            P.gstore(acc, rl, row * 4)
        zero = P.const_vec(0.0, 4)
        P.gstore(zero, rq, (row * (heads * D) + c8) * 4)
        P.gstore(zero, rq, (row * (heads * D) + c8 + 4) * 4)

    @flyc.jit
    def launch(
        Out: fx.Tensor,
        dO: fx.Tensor,
        Dvec: fx.Tensor,
        dQacc: fx.Tensor,
        CuQ: fx.Tensor,
        seqlen_q: fx.Int32,
        heads: fx.Int32,
        o_sr: fx.Int32,
        o_sh: fx.Int32,
        o_sb: fx.Int32,
        g_sr: fx.Int32,
        g_sh: fx.Int32,
        g_sb: fx.Int32,
        l_sh: fx.Int32,
        l_sb: fx.Int32,
        grid_x: fx.Int32,
        grid_y: fx.Int32,
        grid_z: fx.Int32,
        stream: fx.Stream = fx.Stream(None),  # noqa: B008 (FlyDSL launcher idiom)
    ):
        fmha_bwd_preprocess(
            Out,
            dO,
            Dvec,
            dQacc,
            CuQ,
            seqlen_q,
            heads,
            o_sr,
            o_sh,
            o_sb,
            g_sr,
            g_sh,
            g_sb,
            l_sh,
            l_sb,
        ).launch(grid=(grid_x, grid_y, grid_z), block=(256, 1, 1), stream=stream)

    return launch


def build_convert(dtype: str, head_dim: int, varlen: bool):
    """Launcher of the dQ f32 accumulator -> q dtype kernel (scale applied at run time)."""
    D = head_dim
    LPR = D // 8
    RPB = rows_per_block(D)
    EB = 2

    @flyc.kernel(known_block_size=[256, 1, 1])
    def fmha_bwd_convert_dq(
        dQacc: fx.Tensor,
        dQ: fx.Tensor,
        CuQ: fx.Tensor,
        seqlen_q: fx.Int32,
        heads: fx.Int32,
        scale: fx.Float32,
    ):
        f32 = P.f32_t()
        tid = fx.thread_idx.x
        blk = fx.block_idx.x
        h = fx.block_idx.y
        b = fx.block_idx.z
        qs, sq = _row_setup(varlen, CuQ, b, seqlen_q)
        bq = fx.Int64(0) if varlen else fx.Int64(b) * fx.Int64(seqlen_q) * fx.Int64(heads * D)
        base = bq + fx.Int64(qs) * fx.Int64(heads * D) + fx.Int64(h * D)
        ra = P.buffer_rsrc(dQacc, base, sq * heads * D - h * D, 4)
        rq = P.buffer_rsrc(dQ, base, sq * heads * D - h * D, EB)
        row = blk * RPB + tid // LPR
        c8 = (tid % LPR) * 8
        off = row * (heads * D) + c8
        lo = P.gload(P.vec_t(4, f32), ra, off * 4)
        hi = P.gload(P.vec_t(4, f32), ra, off * 4 + 16)
        v = P.mulf(P.shuffle(lo, hi, range(8)), P.splat(scale, 8))
        P.gstore(P.trunc_f32(v, 8, dtype), rq, off * EB)

    @flyc.jit
    def launch(
        dQacc: fx.Tensor,
        dQ: fx.Tensor,
        CuQ: fx.Tensor,
        seqlen_q: fx.Int32,
        heads: fx.Int32,
        scale: fx.Float32,
        grid_x: fx.Int32,
        grid_y: fx.Int32,
        grid_z: fx.Int32,
        stream: fx.Stream = fx.Stream(None),  # noqa: B008 (FlyDSL launcher idiom)
    ):
        fmha_bwd_convert_dq(dQacc, dQ, CuQ, seqlen_q, heads, scale).launch(
            grid=(grid_x, grid_y, grid_z), block=(256, 1, 1), stream=stream
        )

    return launch
