"""Fused FMHA backward main kernel: dQ (f32 atomics), dK and dV in one program per key block.

Math (per query head h of the key/value head's group, per query tile, per wave's keys):
    S  = Q Kᵀ                      P  = exp2(S·scale·log2e − lse·log2e)   (masked)
    dV += Pᵀ dO                    dP = dO Vᵀ
    dS = P ∘ (dP − D)              dK += dSᵀ Q          dQacc += dS K   (f32 atomics, unscaled)
dK is scaled on store; the convert kernel scales dQ.

Layout of the work: program (key block, kv head, batch); four waves, each owning one MFMA width
of keys (16 on gfx950, 32 on gfx942) whose K and V fragments stay in registers for the whole
query loop, as do the dK/dV accumulators. The group's query heads are looped inside the program
(GQA without a reduction pass). The query loop stages the Q and dO tiles in XOR-swizzled LDS and
prefetches the next tile into registers while the current one is computed. P and dS are used as
the MFMA A operand straight from the accumulator layout (the query order inside a lane is a
permutation of the contraction index, matched by the B operand's rows). The B operands that need
a column of Q/dO come from ``ds_read_b64_tr_b16`` on gfx950 and from 16-bit LDS reads on gfx942.
dS goes through LDS once so the four waves can split dQ's columns.
"""

from __future__ import annotations

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import const_expr, range_constexpr

from . import _prims as P
from ._layout import Geometry
from ._layout import crow as _crow
from ._tiles import MainTiles


def build_main(tiles: MainTiles, dtype: str, head_dim: int, causal: bool, varlen: bool, group: int):
    """Return the ``@flyc.jit`` launcher of the main kernel for one configuration."""
    D = head_dim
    geo = Geometry(tiles, head_dim)
    bad = geo.problems()
    if bad:
        raise ValueError(f"{tiles.variant} at head_dim={D}: " + "; ".join(bad))
    T, KT, KV = geo.T, geo.KT, geo.KV  # MFMA width, MFMA k, k values per lane
    BM, BN, SUB, ACC = geo.BM, geo.BN, geo.SUB, geo.ACC
    DC, DT, DQ_COLS, DQ_NT = geo.DC, geo.DT, geo.DQ_COLS, geo.DQ_NT
    EB, LOADS = geo.EB, geo.LOADS
    Q_LDS, DO_LDS = geo.Q_LDS, geo.DO_LDS
    LDS_BYTES = tiles.lds_bytes(D)

    def _dq_tile(m0, wave, g, li, lbase, rdq, kq_frag, heads):
        """dQacc[m0:m0+BM, this wave's columns] += dS K (f32 buffer atomics)."""
        et = P.elem_t(dtype)
        for s in range_constexpr(SUB):
            for nt in range_constexpr(DQ_NT):
                acc = P.const_vec(0.0, ACC)
                for st in range_constexpr(BN // KT):
                    a = P.lds_load(
                        P.vec_t(KV, et), lbase + geo.dq_a_addr(s, st, g, li), align=KV * EB
                    )
                    acc = P.mfma(tiles.mfma, dtype, a, kq_frag[st * DQ_NT + nt], acc)
                col = geo.dq_col(wave, nt, li)
                for i in range_constexpr(ACC):
                    qrow = m0 + s * T + _crow(i, g, T)
                    P.gatomic_add_f32(P.extract(acc, i), rdq, (qrow * (heads * D) + col) * 4)

    swz_addr = geo.swz_addr

    @flyc.kernel(known_block_size=[256, 1, 1])
    def fmha_bwd_main(
        Q: fx.Tensor,
        K: fx.Tensor,
        V: fx.Tensor,
        dO: fx.Tensor,
        LSE: fx.Tensor,
        Dvec: fx.Tensor,
        dQacc: fx.Tensor,
        dK: fx.Tensor,
        dV: fx.Tensor,
        CuQ: fx.Tensor,
        CuK: fx.Tensor,
        seqlen_q: fx.Int32,
        seqlen_k: fx.Int32,
        heads: fx.Int32,
        q_sr: fx.Int32,
        q_sh: fx.Int32,
        q_sb: fx.Int32,
        k_sr: fx.Int32,
        k_sh: fx.Int32,
        k_sb: fx.Int32,
        v_sr: fx.Int32,
        v_sh: fx.Int32,
        v_sb: fx.Int32,
        o_sr: fx.Int32,
        o_sh: fx.Int32,
        o_sb: fx.Int32,
        l_sh: fx.Int32,
        l_sb: fx.Int32,
        scale: fx.Float32,
    ):
        et = P.elem_t(dtype)
        f32 = P.f32_t()
        tid = fx.thread_idx.x
        wave = tid // 64
        lane = tid % 64
        g = lane // T
        li = lane % T
        n_blk = fx.block_idx.x
        hk = fx.block_idx.y
        b = fx.block_idx.z

        lds = fx.SharedAllocator().allocate(LDS_BYTES)
        lbase = P.lds_base(lds)

        if const_expr(varlen):
            rcq = P.buffer_rsrc(CuQ, fx.Int64(0), fx.Int64(1 << 20), 4)
            rck = P.buffer_rsrc(CuK, fx.Int64(0), fx.Int64(1 << 20), 4)
            qs = fx.Int32(P.gload(P.i32_t(), rcq, b * 4))
            sq = fx.Int32(P.gload(P.i32_t(), rcq, b * 4 + 4)) - qs
            ks = fx.Int32(P.gload(P.i32_t(), rck, b * 4))
            sk = fx.Int32(P.gload(P.i32_t(), rck, b * 4 + 4)) - ks
            bq = fx.Int64(0)
            bk = fx.Int64(0)
            bv = fx.Int64(0)
            bo = fx.Int64(0)
            bl = fx.Int64(qs)
        else:
            qs = fx.Int32(0)
            ks = fx.Int32(0)
            sq = seqlen_q
            sk = seqlen_k
            bq = fx.Int64(b) * fx.Int64(q_sb)
            bk = fx.Int64(b) * fx.Int64(k_sb)
            bv = fx.Int64(b) * fx.Int64(v_sb)
            bo = fx.Int64(b) * fx.Int64(o_sb)
            bl = fx.Int64(b) * fx.Int64(l_sb)
        n0 = n_blk * BN
        kw0 = n0 + wave * T  # first key of this wave

        # K/V of this key block (rows past the sequence read as zero).
        rk = P.buffer_rsrc(
            K, bk + fx.Int64(ks) * fx.Int64(k_sr) + fx.Int64(hk * k_sh), sk * k_sr - hk * k_sh, EB
        )
        rv = P.buffer_rsrc(
            V, bv + fx.Int64(ks) * fx.Int64(v_sr) + fx.Int64(hk * v_sh), sk * v_sr - hk * v_sh, EB
        )
        k_frag = []
        v_frag = []
        for c in range_constexpr(DC):
            kr, col = geo.kv_frag(c, g, li)
            k_frag.append(P.gload(P.vec_t(KV, et), rk, ((kw0 + kr) * k_sr + col) * EB))
            v_frag.append(P.gload(P.vec_t(KV, et), rv, ((kw0 + kr) * v_sr + col) * EB))
        # K as the B operand of dQ = dS K: rows n0 + step*KT + g*KV + j, this wave's columns.
        kq_frag = []
        for st in range_constexpr(BN // KT):
            for nt in range_constexpr(DQ_NT):
                col = geo.dq_col(wave, nt, li)
                vals = []
                for j in range_constexpr(KV):
                    row = n0 + geo.kq_row(st, g, j)
                    vals.append(P.gload(et, rk, (row * k_sr + col) * EB))
                kq_frag.append(P.from_elems(vals, et))

        dk_acc = [P.const_vec(0.0, ACC) for _ in range_constexpr(DT)]
        dv_acc = [P.const_vec(0.0, ACC) for _ in range_constexpr(DT)]

        scale_l2 = scale * P.LOG2E
        m_first = n0 // BM if causal else fx.Int32(0)
        m_last = (sq + (BM - 1)) // BM
        m_last = P.select(n0 < sk, m_last, m_first)
        m_last = fx.Int32(m_last)

        for hq in range(hk * group, hk * group + group):
            rq = P.buffer_rsrc(
                Q,
                bq + fx.Int64(qs) * fx.Int64(q_sr) + fx.Int64(hq * q_sh),
                sq * q_sr - hq * q_sh,
                EB,
            )
            rdo = P.buffer_rsrc(
                dO,
                bo + fx.Int64(qs) * fx.Int64(o_sr) + fx.Int64(hq * o_sh),
                sq * o_sr - hq * o_sh,
                EB,
            )
            lrow = bl + fx.Int64(hq) * fx.Int64(l_sh)
            rl = P.buffer_rsrc(LSE, lrow, sq, 4)
            rd = P.buffer_rsrc(Dvec, lrow, sq, 4)
            qacc_base = (
                fx.Int64(0) if varlen else (fx.Int64(b) * fx.Int64(seqlen_q) * fx.Int64(heads * D))
            )
            rdq = P.buffer_rsrc(
                dQacc,
                qacc_base + fx.Int64(qs) * fx.Int64(heads * D) + fx.Int64(hq * D),
                sq * heads * D - hq * D,
                4,
            )

            # Prefetch of the first Q/dO tile into registers.
            pre_q = []
            pre_do = []
            for j in range_constexpr(LOADS):
                r, cc = geo.stage_chunk(tid, j)
                row = m_first * BM + r
                pre_q.append(P.gload(P.vec_t(8, et), rq, (row * q_sr + cc * 8) * EB))
                pre_do.append(P.gload(P.vec_t(8, et), rdo, (row * o_sr + cc * 8) * EB))

            for m in range(m_first, m_last):
                m0 = m * BM
                fx.gpu.barrier()
                for j in range_constexpr(LOADS):
                    r, cc = geo.stage_chunk(tid, j)
                    a = lbase + geo.stage_addr(r, cc)
                    P.lds_store(pre_q[j], a + Q_LDS)
                    P.lds_store(pre_do[j], a + DO_LDS)
                fx.gpu.barrier()
                # Software pipeline: the next tile's global loads fly during this tile's math.
                nq = []
                ndo = []
                for j in range_constexpr(LOADS):
                    r, cc = geo.stage_chunk(tid, j)
                    row = m0 + BM + r
                    nq.append(P.gload(P.vec_t(8, et), rq, (row * q_sr + cc * 8) * EB))
                    ndo.append(P.gload(P.vec_t(8, et), rdo, (row * o_sr + cc * 8) * EB))

                p_t = []
                ds_t = []
                for s in range_constexpr(SUB):
                    s_acc = P.const_vec(0.0, ACC)
                    dp_acc = P.const_vec(0.0, ACC)
                    for c in range_constexpr(DC):
                        ar, ac = geo.a_rowfrag(s, c, g, li)
                        qa = P.lds_load(
                            P.vec_t(KV, et), lbase + Q_LDS + swz_addr(ar, ac), align=KV * EB
                        )
                        s_acc = P.mfma(tiles.mfma, dtype, qa, k_frag[c], s_acc)
                        oa = P.lds_load(
                            P.vec_t(KV, et), lbase + DO_LDS + swz_addr(ar, ac), align=KV * EB
                        )
                        dp_acc = P.mfma(tiles.mfma, dtype, oa, v_frag[c], dp_acc)
                    pv = []
                    dsv = []
                    key = kw0 + li
                    for i in range_constexpr(ACC):
                        qr = s * T + _crow(i, g, T)
                        qrow = m0 + qr
                        lse = fx.Float32(P.gload(f32, rl, qrow * 4))
                        dd = fx.Float32(P.gload(f32, rd, qrow * 4))
                        sv = fx.Float32(P.extract(s_acc, i))
                        pe = fx.Float32(P.exp2(sv * scale_l2 - lse * P.LOG2E))
                        ok = (qrow < sq) & (key < sk) & (lse > fx.Float32(float("-inf")))
                        if const_expr(causal):
                            ok = ok & (key <= qrow)
                        p = fx.Float32(P.select(ok, pe, fx.Float32(0.0)))
                        dpv = fx.Float32(P.extract(dp_acc, i))
                        pv.append(p)
                        dsv.append(p * (dpv - dd))
                    p_t.append(pv)
                    ds_t.append(dsv)

                # dV += Pᵀ dO and dK += dSᵀ Q (A operand straight from the accumulators).
                dv_new = list(dv_acc)
                dk_new = list(dk_acc)
                for st in range_constexpr(geo.pt_steps()):
                    # A element e is accumulator (s, i) = pt_a_elems(st)[e], i.e. query row
                    # s*T + crow(i, g, T); the B rows below list the same queries in that order
                    # (16x16x32: rows 4g..4g+3 of each 16-row sub-tile; 32x32x8: 8st + 4g ..+3).
                    pa = [p_t[s][i] for s, i in geo.pt_a_elems(st)]
                    dsa = [ds_t[s][i] for s, i in geo.pt_a_elems(st)]
                    rows = geo.pt_b_rows(st, g)
                    a_p = P.trunc_f32(P.from_elems(pa, f32), KV, dtype)
                    a_ds = P.trunc_f32(P.from_elems(dsa, f32), KV, dtype)
                    for nt in range_constexpr(DT):
                        col0 = nt * T
                        if const_expr(tiles.transpose_reads):
                            b_do = _tr_operand(lbase + DO_LDS, rows, col0, li, swz_addr, et)
                            b_q = _tr_operand(lbase + Q_LDS, rows, col0, li, swz_addr, et)
                        else:
                            b_do = _col_operand(lbase + DO_LDS, rows[0], col0 + li, swz_addr, et)
                            b_q = _col_operand(lbase + Q_LDS, rows[0], col0 + li, swz_addr, et)
                        dv_new[nt] = P.mfma(tiles.mfma, dtype, a_p, b_do, dv_new[nt])
                        dk_new[nt] = P.mfma(tiles.mfma, dtype, a_ds, b_q, dk_new[nt])

                # dS to LDS ([BM, BN] row-major, 16-bit) so the waves can split dQ's columns.
                for s in range_constexpr(SUB):
                    for i in range_constexpr(ACC):
                        qr = s * T + _crow(i, g, T)
                        val = P.truncf(et, ds_t[s][i])
                        P.lds_store(val, lbase + geo.ds_store_addr(qr, wave, li), align=2)
                fx.gpu.barrier()
                if wave * DQ_COLS < D:
                    _dq_tile(m0, wave, g, li, lbase, rdq, kq_frag, heads)
                pre_q = nq
                pre_do = ndo
                dv_acc = dv_new
                dk_acc = dk_new

        # Store dK (scaled) and dV for this wave's keys; rows past the sequence are dropped.
        kv_heads = heads // group
        row0 = fx.Int64(ks) if varlen else fx.Int64(b) * fx.Int64(seqlen_k)
        kv_base = row0 * fx.Int64(kv_heads * D) + fx.Int64(hk * D)
        rdk = P.buffer_rsrc(dK, kv_base, sk * kv_heads * D - hk * D, EB)
        rdv = P.buffer_rsrc(dV, kv_base, sk * kv_heads * D - hk * D, EB)
        for nt in range_constexpr(DT):
            col = nt * T + li
            for i in range_constexpr(ACC):
                key = kw0 + _crow(i, g, T)
                off = (key * (kv_heads * D) + col) * EB
                kval = fx.Float32(P.extract(dk_acc[nt], i)) * scale
                P.gstore(P.truncf(et, kval), rdk, off)
                P.gstore(P.truncf(et, P.extract(dv_acc[nt], i)), rdv, off)

    @flyc.jit
    def launch(
        Q: fx.Tensor,
        K: fx.Tensor,
        V: fx.Tensor,
        dO: fx.Tensor,
        LSE: fx.Tensor,
        Dvec: fx.Tensor,
        dQacc: fx.Tensor,
        dK: fx.Tensor,
        dV: fx.Tensor,
        CuQ: fx.Tensor,
        CuK: fx.Tensor,
        seqlen_q: fx.Int32,
        seqlen_k: fx.Int32,
        heads: fx.Int32,
        q_sr: fx.Int32,
        q_sh: fx.Int32,
        q_sb: fx.Int32,
        k_sr: fx.Int32,
        k_sh: fx.Int32,
        k_sb: fx.Int32,
        v_sr: fx.Int32,
        v_sh: fx.Int32,
        v_sb: fx.Int32,
        o_sr: fx.Int32,
        o_sh: fx.Int32,
        o_sb: fx.Int32,
        l_sh: fx.Int32,
        l_sb: fx.Int32,
        scale: fx.Float32,
        grid_x: fx.Int32,
        grid_y: fx.Int32,
        grid_z: fx.Int32,
        stream: fx.Stream = fx.Stream(None),  # noqa: B008 (FlyDSL launcher idiom)
    ):
        fmha_bwd_main(
            Q,
            K,
            V,
            dO,
            LSE,
            Dvec,
            dQacc,
            dK,
            dV,
            CuQ,
            CuK,
            seqlen_q,
            seqlen_k,
            heads,
            q_sr,
            q_sh,
            q_sb,
            k_sr,
            k_sh,
            k_sb,
            v_sr,
            v_sh,
            v_sb,
            o_sr,
            o_sh,
            o_sb,
            l_sh,
            l_sb,
            scale,
        ).launch(grid=(grid_x, grid_y, grid_z), block=(256, 1, 1), stream=stream)

    return launch


def _tr_operand(tile_base, rows, col0, li, swz_addr, et):
    """B operand (rows x 16 columns) from ``ds_read_b64_tr_b16``, one read per 4-row group.

    Instruction semantics (triton's AMD backend, ``chooseLLDsReadB64TrLayout``; checked by the
    CPU simulator in tests/test_flydsl_layouts.py, not yet on silicon): within each 16-lane
    group, output lane n, element k is element n % 4 of what lane 4k + n // 4 addressed. Lane j
    addresses row ``r0 + j // 4``, columns ``col0 + 4 * (j % 4) .. +3``, so lane n ends up with
    column ``col0 + n`` of rows ``r0 .. r0 + 3``.
    """
    parts = []
    for r0 in rows:
        addr = tile_base + swz_addr(*Geometry.tr_source(r0, col0, li))
        parts.append(P.lds_read_tr16(P.vec_t(4, et), addr))
    if len(parts) == 1:
        return parts[0]
    return P.shuffle(parts[0], parts[1], range(8))


def _col_operand(tile_base, r0, col, swz_addr, et):
    """B operand of 4 rows ``r0 .. r0 + 3`` at one column from 16-bit LDS reads (gfx942)."""
    vals = [P.lds_load(et, tile_base + swz_addr(r0 + j, col), align=2) for j in range(4)]
    return P.from_elems(vals, et)
